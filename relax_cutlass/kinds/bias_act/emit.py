"""C++ of the bias + activation kind: a grid-stride CUDA kernel behind the `_run` C ABI, and the
glue function of a region (from the shared glue helpers)."""

from __future__ import annotations

from string import Template

from ...toolkit.compile import Source
from ...toolkit.glue import check_device, launch_call, operand_arrays, tensor_checks, unpack_args
from ...toolkit.templates import GLUE_FUNCTION_HEAD, GLUE_FUNCTION_TAIL
from .records import BiasActKernel, BiasActRegion

ARGS_TYPE = "RelaxCutlassBiasActArgs"
ARGS = """\
struct RelaxCutlassBiasActArgs {
  int64_t rows, n;
  const void* x; const void* bias; void* out;
};
"""
FUNCTORS = {
    "relu": "v > 0.f ? v : 0.f",
    "silu": "v / (1.f + __expf(-v))",
}

KERNEL_TU = Template("""\
// relax_cutlass generated kernel: $name
#include <cstdint>
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

$args
namespace {
$check_device
__global__ void Kernel(const __half* x, const __half* bias, __half* out, int64_t size, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < size; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = __half2float(x[i]) + __half2float(bias[i % n]);
    out[i] = __float2half($functor);
  }
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const char* ${name}_run(
    const ${args_type}* p, void* stream) {
  if (const char* error = CheckDevice()) return error;
  const int64_t size = p->rows * p->n;
  if (size == 0) return nullptr;
  const int blocks = static_cast<int>((size + 255) / 256 < 4096 ? (size + 255) / 256 : 4096);
  Kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __half*>(p->x), static_cast<const __half*>(p->bias), static_cast<__half*>(p->out), size, p->n);
  return cudaPeekAtLastError() == cudaSuccess ? nullptr : "$name: kernel launch failed";
}
""")

GLUE_FUNCTION = Template(
    GLUE_FUNCTION_HEAD
    + """\
  TRY(CheckDim(fn, "data last dim", data->shape[data->ndim - 1], $n, data));
  TRY(CheckDim(fn, "bias size", Numel(bias), $n, bias));
  TRY(CheckDim(fn, "output size", Numel(out), Numel(data), out));
  ${args_type} args{Numel(data) / $n, $n, Data(data), Data(bias), const_cast<void*>(Data(out))};
"""
    + GLUE_FUNCTION_TAIL
)


def emit_kernel(kernel: BiasActKernel) -> Source:
    text = KERNEL_TU.substitute(
        name=kernel.name,
        args=ARGS,
        args_type=ARGS_TYPE,
        check_device=check_device(kernel),
        functor=FUNCTORS[kernel.problem.activation],
    )
    return Source(kernel.name, text, "cuda")  # no tensor-core family: no SASS check


def glue_function(region: BiasActRegion) -> str:
    return GLUE_FUNCTION.substitute(
        symbol=region.symbol,
        unpack=unpack_args(region),
        checks=tensor_checks(region, ()),
        n=region.kernel.problem.n,
        args_type=ARGS_TYPE,
        launch=launch_call(region.kernel),
        operand_arrays=operand_arrays(region),
    )
