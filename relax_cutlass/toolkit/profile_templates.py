"""The profiler library's translation unit: argument helpers and the timing loop shared by every
kind's timing functions."""

from __future__ import annotations

from string import Template

from .templates import FFI_HELPERS

PROFILER_TU = Template(
    """\
// relax_cutlass profiler: one timing function per candidate kernel.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime_api.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

$args
$decls

"""
    + FFI_HELPERS
    + """
namespace {
int IntArg(const char* fn, const TVMFFIAny* args, int index, const char* name, int64_t* out) {
  const TVMFFIAny& arg = args[index];
  if (arg.type_index != kTVMFFIInt && arg.type_index != kTVMFFIBool) {
    return Raise("TypeError", "%s: argument #%d (%s) must be an int, got %s", fn, index, name,
                 TypeName(arg.type_index));
  }
  *out = arg.v_int64;
  return 0;
}

int FloatArg(const char* fn, const TVMFFIAny* args, int index, const char* name, double* out) {
  const TVMFFIAny& arg = args[index];
  if (arg.type_index == kTVMFFIFloat) {
    *out = arg.v_float64;
    return 0;
  }
  int64_t value = 0;
  TRY(IntArg(fn, args, index, name, &value));
  *out = static_cast<double>(value);
  return 0;
}

// A tvm-ffi Shape of `size` values.
int ShapeArg(const char* fn, const TVMFFIAny* args, int index, const char* name, size_t size, const int64_t** out) {
  const TVMFFIAny& arg = args[index];
  if (arg.type_index != kTVMFFIShape) {
    return Raise("TypeError", "%s: argument #%d (%s) must be a Shape, got %s", fn, index, name,
                 TypeName(arg.type_index));
  }
  const TVMFFIShapeCell* cell = TVMFFIShapeGetCellPtr(arg.v_obj);
  if (cell->size != size) {
    return Raise("ValueError", "%s: %s has %zu values, not %zu", fn, name, cell->size, size);
  }
  *out = cell->data;
  return 0;
}

// Times `launch` on TVM's stream for `out`'s device; the result is milliseconds per launch.
template <typename Launch>
int TimeLaunches(const DLTensor* out, int64_t iterations, TVMFFIAny* result, Launch launch) {
  void* stream = TVMFFIEnvGetStream(kDLCUDA, out->device.device_id);
  if (const char* err = launch(stream)) return Raise("RuntimeError", "%s", err);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, static_cast<cudaStream_t>(stream));
  for (int64_t i = 0; i < iterations; ++i) {
    if (const char* err = launch(stream)) return Raise("RuntimeError", "%s", err);
  }
  cudaEventRecord(stop, static_cast<cudaStream_t>(stream));
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  result->type_index = kTVMFFIFloat;
  result->zero_padding = 0;
  result->v_float64 = double(ms) / double(iterations);
  return 0;
}
}  // namespace

$functions
"""
)
