"""The C++ templates relax_cutlass emits, kept apart from the Python that fills them."""

from string import Template

from .settings import PDL_ACCEPTED, PDL_KINDS

# Every kernel object's guard; a Template over name, arch, arch_exact and arch_name.
CHECK_DEVICE = """\
// Fails clearly, before any launch, when the current GPU cannot run this object's machine code
// (e.g. an sm_90a library on an A100): otherwise CUTLASS reports only a generic launch error.
const char* CheckDevice() {
  static thread_local char message[512];
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return "$name: no usable CUDA device";
  }
  const int cc = major * 10 + minor;
  const bool ok = $arch_exact ? cc == $arch : cc >= $arch;
  if (ok) return nullptr;
  std::snprintf(message, sizeof(message),
                "$name: this library was built for sm_$arch_name, but cuda:%d is sm_%d%d; rebuild with "
                "arch='auto' on this machine (or arch='sm_%d%d')", device, major, minor, major, minor);
  return message;
}
"""

# Every kernel object's first lines (after its #defines). A module takes nothing from the C++
# runtime: libstdc++ may exist only as a static, non-PIC archive, which no shared library can link
# (compile.py says how the rest is kept out). CUTLASS's host code reports a few failures (a TMA
# descriptor it cannot encode, a rejected cluster shape, xFormers' alignment checks) on std::cout /
# std::cerr, and merely including <iostream> adds a static std::ios_base::Init. So <iostream> is
# never included (its include guard is taken), and std::cout / std::cerr / std::clog are stand-ins
# that print text, numbers and pointers with stdio.
KERNEL_PRELUDE = """\
#include <cstdio>
#include <ostream>
#include <type_traits>
#define _GLIBCXX_IOSTREAM 1  // libstdc++'s include guard
#define _LIBCPP_IOSTREAM 1   // libc++'s
namespace relax_cutlass_io {
struct Stream {
  bool to_stdout;
  std::FILE* file() const { return to_stdout ? stdout : stderr; }
  template <typename T>
  Stream& operator<<(const T& value) {
    if constexpr (std::is_same_v<T, char>) {
      std::fputc(value, file());
    } else if constexpr (std::is_convertible_v<const T&, const char*>) {
      std::fputs(value, file());
    } else if constexpr (std::is_pointer_v<T>) {
      std::fprintf(file(), "%p", static_cast<const void*>(value));
    } else if constexpr (std::is_floating_point_v<T>) {
      std::fprintf(file(), "%g", static_cast<double>(value));
    } else if constexpr (std::is_unsigned_v<T>) {
      std::fprintf(file(), "%llu", static_cast<unsigned long long>(value));
    } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
      std::fprintf(file(), "%lld", static_cast<long long>(value));
    } else {
      std::fputs("<value>", file());  // a CUTLASS type: its operator<< takes a real std::ostream
    }
    return *this;
  }
  Stream& operator<<(std::ostream& (*)(std::ostream&)) {  // std::endl, the one manipulator used
    std::fputc('\\n', file());
    std::fflush(file());
    return *this;
  }
};
}  // namespace relax_cutlass_io
namespace std {
static relax_cutlass_io::Stream cout{true}, cerr{false}, clog{false};
}  // namespace std
"""


# The one piece of the C++ ABI that kernel objects still call: nvcc's launch stub keeps each
# kernel's handle in a function-local static, whose initialization compilers guard with
# __cxa_guard_acquire / _release / _abort (libsupc++). Defined here instead, hidden, and linked
# into every module (link_relocatable), where they become local symbols. As in the Itanium ABI,
# byte 0 of the 64-bit guard says "initialized" (compilers test it inline before calling in);
# byte 1 says "a thread is initializing", and other threads wait for it.
CXX_ABI_SUPPORT = """\
// relax_cutlass: static-initialization guards, so that modules take nothing from libsupc++.
#include <sched.h>
#include <stdint.h>

extern "C" {
__attribute__((visibility("hidden"))) int __cxa_guard_acquire(uint64_t* guard) {
  char* done = reinterpret_cast<char*>(guard);
  char* busy = done + 1;
  while (true) {
    if (__atomic_load_n(done, __ATOMIC_ACQUIRE)) return 0;
    char idle = 0;
    if (__atomic_compare_exchange_n(busy, &idle, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
      if (!__atomic_load_n(done, __ATOMIC_ACQUIRE)) return 1;  // this thread initializes
      __atomic_store_n(busy, 0, __ATOMIC_RELEASE);             // another one finished meanwhile
      return 0;
    }
    sched_yield();
  }
}

__attribute__((visibility("hidden"))) void __cxa_guard_release(uint64_t* guard) {
  char* done = reinterpret_cast<char*>(guard);
  __atomic_store_n(done, 1, __ATOMIC_RELEASE);
  __atomic_store_n(done + 1, 0, __ATOMIC_RELEASE);
}

__attribute__((visibility("hidden"))) void __cxa_guard_abort(uint64_t* guard) {
  __atomic_store_n(reinterpret_cast<char*>(guard) + 1, 0, __ATOMIC_RELEASE);
}
}
"""

# Programmatic dependent launch (PDL; kinds/gemm/emit_sm90.py says what it buys): the run-time switch
# every PDL-launched kernel unit shares, and the two device instructions for kernels written here
# (CUTLASS's own kernels call them through cutlass/arch/grid_dependency_control.h). Both are no-ops
# below sm_90 and in a kernel launched without the attribute. A kernel launched with it must call
# PdlWaitForPrerequisites() before its first global memory access: that waits until the kernels
# before it have finished and their writes are visible.
# RELAX_CUTLASS_PDL: unset or "1", each kind's default: PDL outside CUDA graphs everywhere; inside
# graph capture (TVM's use_cuda_graph build) for the SM90 GEMMs of at most PDL_IN_GRAPHS_MAX_FLOPS
# only. Measured with bench/pdl_ab.py on the H100 (bench/results, 2026-11-27), CUDA-graph builds:
#   BERT-large 8 x 128: PDL in graphs for the GEMMs alone 1.775 ms, for no kind 1.842, for the norms
#     alone 2.001, for attention alone 1.838 (another H100: GEMMs 1.760, none 1.794);
#   GEMMs in graphs against none: GPT-2 0.591 against 0.637 ms, Llama-GQA 0.499 / 0.505, Phi-3
#     0.492 / 0.496, but llama_8b_2l (hidden 4096, 1 x 2048; GEMMs of 69-240 GFLOP) 3.215 / 2.997.
# PDL hides a GEMM's launch and prologue (1.5-2 us on the H100) behind the kernel before it: that
# matters for short GEMMs and not for ones of 100 us and more, which lost 7% here (why is not
# known), so those launch plainly inside graphs. Without graphs PDL saves 5% on BERT-large
# (H100, 2026-11-27: 1.943 against 2.043 ms). "always": PDL in graphs for every kind and size;
# "always:" and kinds joined by "+" ("always:gemm+norm"): in graphs for those kinds' kernels only,
# every size ("always:none": in graphs for none, PDL outside them only); "0": never.
PDL_IN_GRAPHS_MAX_FLOPS = 4e10  # about 55 us at the H100's 700-770 TFLOP/s; BERT-large's largest 8.6e9
_PDL_SWITCH = """\
#include <cstdlib>
#include <cstring>
namespace {
// Whether n characters at p name a kind RELAX_CUTLASS_PDL=always:<kinds> may list.
bool KnownPdlKind(const char* p, size_t n) {
  static const char* const kKnown[] = {KNOWN_KINDS};
  for (const char* known : kKnown) {
    if (std::strlen(known) == n && std::strncmp(known, p, n) == 0) return true;
  }
  return false;
}
// This unit's kernels' RELAX_CUTLASS_PDL mode: 0 never, 1 except while the stream is captured into
// a CUDA graph, 2 always ("always", or "always:" and a "+"-joined list of kinds that names KIND),
// 3 as 1, and while captured too for work of at most MAX_FLOPS flops (the GEMMs' default); -1 a
// value that is no setting (the build refuses it too: toolkit.settings.check_pdl_setting)
int PdlMode() {
  static const int mode = [] {
    const char* value = std::getenv("RELAX_CUTLASS_PDL");
    if (value == nullptr || std::strcmp(value, "1") == 0) return DEFAULT_MODE;
    if (std::strcmp(value, "0") == 0) return 0;
    if (std::strcmp(value, "always") == 0) return 2;
    if (std::strncmp(value, "always:", 7) != 0) return -1;
    const char* kind = "KIND";
    bool named = false;
    for (const char* p = value + 7;;) {
      const char* end = std::strchr(p, '+');
      const size_t n = end != nullptr ? static_cast<size_t>(end - p) : std::strlen(p);
      if (!KnownPdlKind(p, n)) return -1;
      named = named || (n == std::strlen(kind) && std::strncmp(p, kind, n) == 0);
      if (end == nullptr) break;
      p = end + 1;
    }
    return named ? 2 : 1;
  }();
  return mode;
}
// The run functions' refusal of a RELAX_CUTLASS_PDL that is no setting (before any launch).
const char* PdlSettingError() {
  return PdlMode() >= 0 ? nullptr
                        : "RELAX_CUTLASS_PDL is set to a value that is no setting: use ACCEPTED; nothing was launched";
}
// Whether this launch, of `flops` work (0: unknown), is a programmatic dependent one.
bool LaunchWithPdl(cudaStream_t stream, double flops = 0.0) {
  const int mode = PdlMode();
  if (mode <= 0 || mode == 2) return mode == 2;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();  // not this call's error to report: launch as outside a graph
    return true;
  }
  if (capture == cudaStreamCaptureStatusNone) return true;
  return mode == 3 && flops <= MAX_FLOPS;
}
}  // namespace
"""

# The kinds whose kernels keep PDL inside CUDA graphs by default, up to PDL_IN_GRAPHS_MAX_FLOPS of
# work per launch (RELAX_CUTLASS_PDL above; their launches pass the flops).
PDL_IN_GRAPHS_BY_DEFAULT = frozenset({"gemm"})


def pdl_switch(kind: str) -> str:
    """The run-time PDL switch of one region kind's kernel unit (RELAX_CUTLASS_PDL above): unset,
    "1" or unknown, the kind's default mode (3 for PDL_IN_GRAPHS_BY_DEFAULT, else 1)."""
    default = 3 if kind in PDL_IN_GRAPHS_BY_DEFAULT else 1
    known = ", ".join(f'"{k}"' for k in PDL_KINDS)
    text = _PDL_SWITCH.replace("KNOWN_KINDS", known).replace("KIND", kind).replace("DEFAULT_MODE", str(default))
    text = text.replace("ACCEPTED", PDL_ACCEPTED.format("{" + ", ".join(PDL_KINDS) + "}"))
    return text.replace("MAX_FLOPS", f"{PDL_IN_GRAPHS_MAX_FLOPS:.1e}")


PDL_DEVICE = """\
namespace {
__device__ __forceinline__ void PdlWaitForPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// The next kernel, if launched with PDL, may be scheduled once every block has called this (or
// exited); it still waits for this one to finish before it reads anything.
__device__ __forceinline__ void PdlLetDependentsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
}  // namespace
"""

# What every host unit (a module's glue, the profiler's) builds its TVM FFI functions from. They are
# written against tvm-ffi's C ABI alone and compiled without exceptions or RTTI, so that a module
# needs nothing from the C++ runtime (see KERNEL_PRELUDE): each function is a TVMFFISafeCallType
# (`int f(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result)`) that raises
# with TVMFFIErrorSetRaisedFromCStr and returns -1. Tensors arrive as DLTensor* or tvm-ffi Tensors.
FFI_HELPERS = """\
// A check returns nonzero once it has raised an error: hand the failure (-1) to tvm-ffi.
#define TRY(check)               \\
  do {                           \\
    if ((check) != 0) return -1; \\
  } while (0)

namespace {
// Raises `kind` (the Python exception type: ValueError, TypeError, ...) with a printf-formatted
// message; returns -1.
__attribute__((format(printf, 2, 3))) int Raise(const char* kind, const char* format, ...) {
  char message[1024];
  va_list values;
  va_start(values, format);
  std::vsnprintf(message, sizeof(message), format, values);
  va_end(values);
  TVMFFIErrorSetRaisedFromCStr(kind, message);
  return -1;
}

const char* TypeName(int32_t type_index) {
  switch (type_index) {
    case kTVMFFINone: return "None";
    case kTVMFFIInt: return "int";
    case kTVMFFIBool: return "bool";
    case kTVMFFIFloat: return "float";
    case kTVMFFIRawStr: case kTVMFFISmallStr: case kTVMFFIStr: return "str";
    case kTVMFFIShape: return "Shape";
    case kTVMFFIArray: return "Array";
    default: return "another type";
  }
}

int CheckArgCount(const char* fn, int32_t got, int32_t want, const char* params) {
  if (got == want) return 0;
  return Raise("TypeError", "%s: takes %d arguments (%s), got %d", fn, want, params, got);
}

// Argument `index` as a tensor: a DLTensor* or a tvm-ffi Tensor object.
int TensorArg(const char* fn, const TVMFFIAny* args, int index, const char* name, const DLTensor** out) {
  const TVMFFIAny& arg = args[index];
  if (arg.type_index == kTVMFFIDLTensorPtr) {
    *out = static_cast<const DLTensor*>(arg.v_ptr);
    return 0;
  }
  if (arg.type_index == kTVMFFITensor) {
    *out = TVMFFITensorGetDLTensorPtr(arg.v_obj);
    return 0;
  }
  return Raise("TypeError", "%s: argument #%d (%s) must be a tensor, got %s (type index %d)", fn, index, name,
               TypeName(arg.type_index), static_cast<int>(arg.type_index));
}

const void* Data(const DLTensor* t) { return static_cast<const char*>(t->data) + t->byte_offset; }
}  // namespace
"""

# One module -> one glue object exporting a TVM FFI function per offloaded region.
GLUE_TU = Template(
    """\
// relax_cutlass generated host glue: argument checks, stream, launch.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime_api.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

$args
$kernel_decls

"""
    + FFI_HELPERS
    + """
namespace {
// "(2, 3, 4)": a tensor's shape, for messages.
struct ShapeText {
  char text[256];
};

ShapeText ShapeStr(const DLTensor* t) {
  ShapeText s;
  const int size = static_cast<int>(sizeof(s.text));
  int used = std::snprintf(s.text, size, "(");
  for (int i = 0; i < t->ndim && used < size; ++i) {
    used += std::snprintf(s.text + used, size - used, "%s%lld", i ? ", " : "", static_cast<long long>(t->shape[i]));
  }
  if (used < size) std::snprintf(s.text + used, size - used, ")");
  return s;
}

// "lhs (64, 128), rhs (256, 128), out (64, 256)": what a failed kernel was given, for messages.
struct OperandsText {
  char text[1024];
};

OperandsText DescribeOperands(int count, const char* const* names, const DLTensor* const* tensors) {
  OperandsText s;
  const int size = static_cast<int>(sizeof(s.text));
  int used = 0;
  s.text[0] = '\0';
  for (int i = 0; i < count && used < size; ++i) {
    used += std::snprintf(s.text + used, size - used, "%s%s %s", i ? ", " : "", names[i], ShapeStr(tensors[i]).text);
  }
  return s;
}

int64_t Numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

// Row-major (as tvm-ffi's IsContiguous: size-1 dimensions may have any stride, empty tensors are).
bool IsContiguous(const DLTensor* t) {
  if (t->strides == nullptr) return true;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] == 0) return true;
  }
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] == 1) continue;
    if (t->strides[i] != expected) return false;
    expected *= t->shape[i];
  }
  return true;
}

int CheckTensor(const char* fn, const char* role, const DLTensor* t, uint8_t code, uint8_t bits,
                int alignment_bytes, int device_id) {
  if (t->device.device_type != kDLCUDA) {
    return Raise("ValueError", "%s: %s must be on a CUDA device (got device type %d)", fn, role,
                 static_cast<int>(t->device.device_type));
  }
  if (t->device.device_id != device_id) {
    return Raise("ValueError", "%s: %s is on cuda:%d but the output is on cuda:%d", fn, role,
                 t->device.device_id, device_id);
  }
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) {
    return Raise("TypeError", "%s: %s has the wrong dtype (code %d, %d bits); the kernel was built for code %d, "
                 "%d bits", fn, role, int(t->dtype.code), int(t->dtype.bits), int(code), int(bits));
  }
  if (!IsContiguous(t)) {
    return Raise("ValueError", "%s: %s must be contiguous (row-major)", fn, role);
  }
  if (reinterpret_cast<uintptr_t>(Data(t)) % alignment_bytes != 0) {
    return Raise("ValueError", "%s: %s data is not %d-byte aligned, which the kernel's vector width requires", fn,
                 role, alignment_bytes);
  }
  return 0;
}

// The element stride of `dim` in a contiguous (checked) tensor.
int64_t PackedStride(const DLTensor* t, int dim) {
  int64_t stride = 1;
  for (int i = dim + 1; i < t->ndim; ++i) stride *= t->shape[i];
  return stride;
}

int CheckDim(const char* fn, const char* what, int64_t got, int64_t want, const DLTensor* t) {
  if (got == want) return 0;
  return Raise("ValueError", "%s: %s is %lld but the kernel was built for %lld (shape %s)", fn, what,
               static_cast<long long>(got), static_cast<long long>(want), ShapeStr(t).text);
}

// Errors of CUDA itself (no GPU, no or an old driver), not of earlier work.
bool CudaUnusable(cudaError_t error) {
  switch (error) {
    case cudaErrorNoDevice: case cudaErrorInsufficientDriver: case cudaErrorStubLibrary:
    case cudaErrorInitializationError: case cudaErrorSystemDriverMismatch: case cudaErrorSystemNotReady:
    case cudaErrorCompatNotSupportedOnDevice: case cudaErrorDevicesUnavailable:
      return true;
    default:
      return false;
  }
}

// Called just before a launch. A kernel that fails asynchronously (an illegal address, say) leaves
// its error for a later CUDA call to report; launching on would blame this region's kernel for it,
// or crash later. The error is read (and, unless sticky, cleared) here and raised, naming it.
int CheckNoPendingCudaError(const char* fn) {
  const cudaError_t pending = cudaGetLastError();
  if (pending == cudaSuccess) return 0;
  if (CudaUnusable(pending)) {
    return Raise("RuntimeError", "%s: no usable CUDA device (%s: %s)", fn, cudaGetErrorName(pending),
                 cudaGetErrorString(pending));
  }
  return Raise("RuntimeError", "%s: not launched: an error from earlier CUDA work is pending (%s: %s); a kernel "
               "that failed asynchronously may have left the CUDA context unusable", fn, cudaGetErrorName(pending),
               cudaGetErrorString(pending));
}
}  // namespace

$functions
"""
)


# The first and last lines of every region's glue function (each kind's template fills in the
# middle): the arguments read as `const DLTensor*`s named by role (`unpack`, from ffi_args, since
# `args` is the kernel's argument struct) and the tensor checks; then the launch on TVM's stream,
# with the operands described in a failure's message.
GLUE_FUNCTION_HEAD = """\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_${symbol}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny*) {
  const char* fn = "$symbol";
$unpack
  const int device_id = out->device.device_id;
$checks
"""
GLUE_FUNCTION_TAIL = """\
  TRY(CheckNoPendingCudaError(fn));
  void* stream = TVMFFIEnvGetStream(kDLCUDA, device_id);
  if (const char* err = ${launch}) {
$operand_arrays
    return Raise("RuntimeError", "%s: %s (operands: %s)", fn, err,
                 DescribeOperands(kOperandCount, kOperandNames, kOperandTensors).text);
  }
  return 0;
}
"""
