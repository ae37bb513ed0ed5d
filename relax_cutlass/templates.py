"""The C++ templates relax_cutlass emits, kept apart from the Python that fills them."""

from string import Template

# The C ABI between a module's glue (which knows Relax shapes) and a kernel object (which knows
# CUTLASS). Kernel objects depend only on their configuration, so they are cached across models.
GEMM_ARGS = """\
struct RelaxCutlassGemmArgs {
  int64_t m, n, k;
  const void* a; int64_t lda;
  const void* b; int64_t ldb;
  const void* bias;                      // per-column vector of N elements, or nullptr
  const void* residual; int64_t ldr;     // (M, N) tensor, or nullptr
  void* d; int64_t ldd;
};
"""

# The same ABI for conv2d fprop kernels: NHWC activations, OHWI (KRSC) filters, NHWC output.
CONV2D_ARGS = """\
struct RelaxCutlassConv2dArgs {
  int n, h, w, c, k, r, s, p, q;
  int pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  int split_k;                           // serial split-K slices (1: none)
  const void* data;
  const void* weight;
  const void* bias;                      // per-channel vector of K elements, or nullptr
  const void* residual;                  // (N, P, Q, K) tensor, or nullptr
  void* out;
};
"""

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

# One kernel configuration -> one object exporting `<kernel>_run`. (`Gemm` names the device-level
# operator: a GEMM, or the implicit GEMM of a convolution.)
KERNEL_TU = Template(
    """\
// relax_cutlass generated kernel: $name
${defines}"""
    + KERNEL_PRELUDE
    + """\
#include <cstdint>
#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
$includes

$gemm_args
// Everything kernel-specific has internal linkage: CUTLASS keeps per-kernel state in template
// statics, which must never be shared with another library holding the same kernel.
namespace {
$instance

$check_device
// Formats "<kernel>: <step> failed: <CUTLASS status> (<CUDA error>)" into a per-thread buffer.
const char* Fail(const char* step, cutlass::Status status) {
  static thread_local char message[512];
  cudaError_t cuda = cudaGetLastError();
  std::snprintf(message, sizeof(message), "$name: %s failed: %s (CUDA: %s)", step,
                cutlass::cutlassGetStatusString(status), cudaGetErrorString(cuda));
  return message;
}
}  // namespace

// Returns nullptr on success, else a message that names the failing step.
extern "C" __attribute__((visibility("default"))) const char* ${name}_run(
    const ${args_type}* p, void* stream_handle) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (const char* error = CheckDevice()) return error;
  using Gemm = $operation_type;
  $arguments
  Gemm op;
  cutlass::Status status = op.can_implement(arguments);
  if (status != cutlass::Status::kSuccess) return Fail("can_implement (problem shape/alignment)", status);
  size_t workspace_size = Gemm::get_workspace_size(arguments);
  void* workspace = nullptr;
  if (workspace_size > 0 && cudaMallocAsync(&workspace, workspace_size, stream) != cudaSuccess) {
    return Fail("workspace allocation", cutlass::Status::kErrorWorkspaceNull);
  }
  status = op.initialize(arguments, workspace, stream);
  const char* step = "initialize";
  if (status == cutlass::Status::kSuccess) {
    status = ${run};
    step = "run";
  }
  if (workspace != nullptr) cudaFreeAsync(workspace, stream);
  if (status != cutlass::Status::kSuccess) return Fail(step, status);
  if (cudaPeekAtLastError() != cudaSuccess) return Fail("kernel launch", cutlass::Status::kErrorInternal);
  return nullptr;
}
"""
)

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

$gemm_args
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

# One exported function per region; `unpack` reads the arguments into `const DLTensor*`s named
# by their roles (ffi_args, since `args` is the kernel's argument struct).
GLUE_FUNCTION = Template("""\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_${symbol}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny*) {
  const char* fn = "$symbol";
$unpack
  const int device_id = out->device.device_id;
$checks
  if (lhs->ndim < 2) {
    return Raise("ValueError", "%s: lhs must have rank >= 2, got %s", fn, ShapeStr(lhs).text);
  }
  TRY(CheckDim(fn, "lhs inner dim K", lhs->shape[lhs->ndim - 1], $k, lhs));
  const int64_t m = Numel(lhs) / $k;
  TRY(CheckDim(fn, "rhs rank", rhs->ndim, 2, rhs));
  TRY(CheckDim(fn, "rhs dim 0", rhs->shape[0], $rhs_dim0, rhs));
  TRY(CheckDim(fn, "rhs dim 1", rhs->shape[1], $rhs_dim1, rhs));
  TRY(CheckDim(fn, "output rank", out->ndim, lhs->ndim, out));
  for (int i = 0; i + 1 < lhs->ndim; ++i) TRY(CheckDim(fn, "output leading dim", out->shape[i], lhs->shape[i], out));
  TRY(CheckDim(fn, "output dim N", out->shape[out->ndim - 1], $n, out));
$extra_checks
  if (m == 0) return 0;
  RelaxCutlassGemmArgs args{m, $n, $k, Data(lhs), $k, Data(rhs), $ldb,
                            $bias_ptr, $residual_ptr, $n, const_cast<void*>(Data(out)), $n};
  TRY(CheckNoPendingCudaError(fn));
  void* stream = TVMFFIEnvGetStream(kDLCUDA, device_id);
  if (const char* err = ${launch}) {
$operand_arrays
    return Raise("RuntimeError", "%s: %s (operands: %s)", fn, err,
                 DescribeOperands(kOperandCount, kOperandNames, kOperandTensors).text);
  }
  return 0;
}
""")

# The problem and tensor layouts every conv2d kernel builds its arguments from.
_CONV2D_SETUP = """\
using Layout = cutlass::layout::TensorNHWC;
  cutlass::conv::Conv2dProblemSize problem(
      p->n, p->h, p->w, p->c, p->k, p->r, p->s, p->p, p->q, p->pad_h, p->pad_w, p->stride_h,
      p->stride_w, p->dilation_h, p->dilation_w, cutlass::conv::Mode::kCrossCorrelation, p->split_k);
  using ElementA = typename Gemm::ElementA;
  using ElementB = typename Gemm::ElementB;
  using ElementC = typename Gemm::ElementC;
  const Layout layout_d = Layout::packed(cutlass::make_Coord(p->n, p->p, p->q, p->k));
  typename Gemm::Arguments arguments(
      problem,
      {static_cast<ElementA*>(const_cast<void*>(p->data)),
       Layout::packed(cutlass::make_Coord(p->n, p->h, p->w, p->c))},
      {static_cast<ElementB*>(const_cast<void*>(p->weight)),
       Layout::packed(cutlass::make_Coord(p->k, p->r, p->s, p->c))},
"""

# conv2d: D = act(conv(x, w) + bias). The bias is the C operand with an all-zero stride (one
# K-vector broadcast over N, P, Q); without bias, beta = 0 and C is never read.
CONV2D_ARGUMENTS = (
    _CONV2D_SETUP
    + """\
      {static_cast<ElementC*>(const_cast<void*>(p->bias ? p->bias : p->out)),
       p->bias ? Layout(Layout::Stride(0)) : layout_d},
      {static_cast<ElementC*>(p->out), layout_d},
      typename Gemm::EpilogueOutputOp::Params(1.0f, p->bias ? 1.0f : 0.0f),
      cutlass::conv::SplitKMode::kSerial);"""
)

# conv2d residual block: D = post(act(conv(x, w) + bias) + residual): the residual is C, the bias
# the broadcast vector of the fused epilogue.
CONV2D_RESIDUAL_ARGUMENTS = (
    _CONV2D_SETUP
    + """\
      {static_cast<ElementC*>(const_cast<void*>(p->residual)), layout_d},
      {static_cast<ElementC*>(p->out), layout_d},
      typename Gemm::EpilogueOutputOp::Params(1.0f, 1.0f),
      cutlass::conv::SplitKMode::kSerial,
      const_cast<void*>(p->bias), /*ptr_Tensor=*/nullptr, /*ldr=*/0, /*ldt=*/p->k);"""
)

CONV2D_GLUE_FUNCTION = Template("""\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_${symbol}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny*) {
  const char* fn = "$symbol";
$unpack
  const int device_id = out->device.device_id;
$checks
  TRY(CheckDim(fn, "data rank (NHWC)", data->ndim, 4, data));
  TRY(CheckDim(fn, "data H", data->shape[1], $h, data));
  TRY(CheckDim(fn, "data W", data->shape[2], $w, data));
  TRY(CheckDim(fn, "data C", data->shape[3], $c, data));
  TRY(CheckDim(fn, "weight rank (OHWI)", weight->ndim, 4, weight));
  TRY(CheckDim(fn, "weight O", weight->shape[0], $k, weight));
  TRY(CheckDim(fn, "weight H", weight->shape[1], $r, weight));
  TRY(CheckDim(fn, "weight W", weight->shape[2], $s, weight));
  TRY(CheckDim(fn, "weight I", weight->shape[3], $c, weight));
  const int64_t n = data->shape[0];
  TRY(CheckDim(fn, "output rank (NHWC)", out->ndim, 4, out));
  TRY(CheckDim(fn, "output N", out->shape[0], n, out));
  TRY(CheckDim(fn, "output H", out->shape[1], $p, out));
  TRY(CheckDim(fn, "output W", out->shape[2], $q, out));
  TRY(CheckDim(fn, "output C", out->shape[3], $k, out));
$extra_checks
  if (n == 0) return 0;
  if (n > INT32_MAX / ($h * $w * $c) || n > INT32_MAX / ($p * $q * $k)) {
    return Raise("ValueError", "%s: batch %lld makes a tensor of more than 2^31 elements, which CUTLASS's 32-bit "
                 "conv2d indexing cannot address; split the batch", fn, static_cast<long long>(n));
  }
  RelaxCutlassConv2dArgs args{static_cast<int>(n), $h, $w, $c, $k, $r, $s, $p, $q,
                              $pad_h, $pad_w, $stride_h, $stride_w, $dilation_h, $dilation_w, $split_k,
                              Data(data), Data(weight), $bias_ptr, $residual_ptr,
                              const_cast<void*>(Data(out))};
  TRY(CheckNoPendingCudaError(fn));
  void* stream = TVMFFIEnvGetStream(kDLCUDA, device_id);
  if (const char* err = ${kernel}_run(&args, stream)) {
$operand_arrays
    return Raise("RuntimeError", "%s: %s (operands: %s)", fn, err,
                 DescribeOperands(kOperandCount, kOperandNames, kOperandTensors).text);
  }
  return 0;
}
""")

# An elementwise functor applied to a whole fragment, as the Array-typed epilogues call it; appended
# to the scalar definitions below (a Template over `functor`).
_ARRAY_SPECIALIZATION = """\
template <typename T, int N>
struct $functor<cutlass::Array<T, N>> {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& value) const {
    $functor<T> scalar;
    cutlass::Array<T, N> result;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) result[i] = scalar(value[i]);
    return result;
  }
};
"""

# A custom activation (relax_cutlass.extend) as the functor CUTLASS's epilogues instantiate: over
# the compute element (float) for the 2.x traits, and over Array<float, N> for the 2.x generic and
# residual-block epilogues and the SM90 EVT compute node.
ACTIVATION_FUNCTOR = Template(
    """\
// custom activation $name: $expression
template <typename T>
struct $functor {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& value) const {
    float const x = static_cast<float>(value);
    return static_cast<T>($expression);
  }
};
"""
    + _ARRAY_SPECIALIZATION
)

# GELU (erf form) for kernels that write 16-bit outputs: CUTLASS's GELU calls erff, about 20
# instructions per element, which costs an H100 SM90 kernel up to 36% (issue 6). Here
#     gelu(x) = x * Phi(x) = relu(x) - |x| * Q(|x|),  Q(t) = 1 - Phi(t) = 2^P(t),
# with P a degree-5 polynomial fitted to log2(1 - Phi(t)) (scripts/fit_gelu16.py): 5 FMAs, one
# ex2.approx, a max and an FMA, like CUTLASS's tanh GELU. Q is accurate *relatively*, so the negative
# tail keeps its precision too: within 1 fp16 ulp of the correctly rounded value for every finite
# fp16 input (tests/test_gelu16.py); x = +inf gives NaN. Not used for float32 outputs.
GELU16_FUNCTOR = Template(
    """\
// gelu(x) = relu(x) - |x| * 2^P(|x|), P ~ log2(1 - Phi): 16-bit outputs only (see templates.py)
template <typename T>
struct $functor {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& value) const {
    float const x = static_cast<float>(value);
    float const t = fabsf(x);
    float p = ${c5}f;
    p = fmaf(p, t, ${c4}f);
    p = fmaf(p, t, ${c3}f);
    p = fmaf(p, t, ${c2}f);
    p = fmaf(p, t, ${c1}f);
    p = fmaf(p, t, ${c0}f);
    float tail;
#if defined(__CUDA_ARCH__)
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(tail) : "f"(p));
#else
    tail = exp2f(p);
#endif
    return static_cast<T>(fmaf(-t, tail, fmaxf(x, 0.0f)));
  }
};
"""
    + _ARRAY_SPECIALIZATION
)

# check_activation's program: the functor evaluated on the host, elementwise and through the Array
# form the kernels use; the device side is compiled (for the target arch) but never launched.
ACTIVATION_CHECK_PROGRAM = Template("""\
#include <cmath>
#include <cstdio>
#include "cutlass/cutlass.h"
#include "cutlass/array.h"

namespace {
$definition
__global__ void device_compile_check(float* values) {
  $functor<cutlass::Array<float, 8>> op;
  cutlass::Array<float, 8> v;
  for (int i = 0; i < 8; ++i) v[i] = values[i];
  v = op(v);
  for (int i = 0; i < 8; ++i) values[i] = v[i];
}
}  // namespace

int main() {
  static const float inputs[] = {$inputs};
  constexpr int kCount = sizeof(inputs) / sizeof(inputs[0]);
  $functor<float> scalar;
  $functor<cutlass::Array<float, 1>> vector;
  for (int i = 0; i < kCount; ++i) {
    cutlass::Array<float, 1> v;
    v[0] = inputs[i];
    std::printf("%.9g %.9g\\n", scalar(inputs[i]), vector(v)[0]);
  }
  return 0;
}
""")

# The ABI of fused attention kernels: sizes, and for q/k/v the element strides of the batch, row
# and head dimensions (the head dim itself is contiguous). The output is (B, S, N, V), packed.
# The optional additive bias (masks) comes last, so that callers without one leave it zero.
ATTENTION_ARGS = """\
struct RelaxCutlassAttentionArgs {
  int64_t batch, heads, seq_q, seq_kv, head_dim, head_dim_value;
  const void* q; int64_t q_stride_b, q_stride_s, q_stride_n;
  const void* k; int64_t k_stride_b, k_stride_s, k_stride_n;
  const void* v; int64_t v_stride_b, v_stride_s, v_stride_n;
  void* out;
  float scale;
  // Additive bias on the scores, or nullptr (kernels built with bias support only): (B, N, S, T)
  // in the q/k/v element type, read through these element strides (0: broadcast axis); the keys
  // are contiguous. 16-byte aligned, with seq_kv and every stride a multiple of 8.
  const void* bias; int64_t bias_stride_b, bias_stride_n, bias_stride_s;
  // What a row whose every score is -inf (every key masked) gives: 0 NaN (the softmax's 0/0),
  // 1 zeros (torch's safe softmax), 2 the mean of the values. Used with a bias only.
  int32_t masked_rows;
};
"""

# One fused attention configuration -> one object exporting `<kernel>_run`: CUTLASS's
# examples/41 forward kernel (xFormers' memory-efficient attention), launched as its own
# example launches it.
ATTENTION_KERNEL_TU = Template(
    """\
// relax_cutlass generated kernel: $name
"""
    + KERNEL_PRELUDE
    + """\
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
#include "kernel_forward.h"

$attention_args
namespace {
// A TU-local kernel type, so no other library ever shares this kernel's symbols.
struct Attention : AttentionKernel<$element, cutlass::arch::Sm80, /*isAligned=*/$aligned,
                                   /*kQueriesPerBlock=*/$queries, /*kKeysPerBlock=*/$keys,
                                   /*kMaxK=*/$max_k, /*kSupportsDropout=*/false,
                                   /*kSupportsBias=*/$supports_bias> {};

// A row whose every score is -inf leaves the kernel as 0/0 = NaN, its logsumexp -inf. The graph
// gives zeros there (masked_rows 1, torch's safe softmax) or the mean of the values (2: a finite
// mask value swamped the scores, so the softmax of the row was uniform).
template <typename T>
__global__ void FixMaskedRows(RelaxCutlassAttentionArgs a, const float* lse, int64_t lse_dim) {
  const int64_t rows = a.batch * a.heads * a.seq_q;
  for (int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; row < rows;
       row += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = row % a.seq_q, n = row / a.seq_q % a.heads, b = row / a.seq_q / a.heads;
    if (lse[(b * a.heads + n) * lse_dim + s] != -INFINITY) continue;
    T* out = static_cast<T*>(a.out) + ((b * a.seq_q + s) * a.heads + n) * a.head_dim_value;
    const T* v = static_cast<const T*>(a.v) + b * a.v_stride_b + n * a.v_stride_n;
    for (int64_t d = 0; d < a.head_dim_value; ++d) {
      float sum = 0.0f;
      if (a.masked_rows == 2) {
        for (int64_t t = 0; t < a.seq_kv; ++t) sum += static_cast<float>(v[t * a.v_stride_s + d]);
        sum /= static_cast<float>(a.seq_kv);
      }
      out[d] = static_cast<T>(sum);
    }
  }
}

$check_device
const char* Fail(const char* step) {
  static thread_local char message[512];
  std::snprintf(message, sizeof(message), "$name: %s failed (CUDA: %s)", step,
                cudaGetErrorString(cudaGetLastError()));
  return message;
}
}  // namespace

// Returns nullptr on success, else a message that names the failing step.
extern "C" __attribute__((visibility("default"))) const char* ${name}_run(
    const RelaxCutlassAttentionArgs* a, void* stream_handle) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (const char* error = CheckDevice()) return error;
  using T = typename Attention::scalar_t;
  typename Attention::Params p;
  p.query_ptr = static_cast<T*>(const_cast<void*>(a->q));
  p.key_ptr = static_cast<T*>(const_cast<void*>(a->k));
  p.value_ptr = static_cast<T*>(const_cast<void*>(a->v));
  p.output_ptr = static_cast<T*>(a->out);
  p.logsumexp_ptr = nullptr;
  p.scale = a->scale;
  p.num_batches = static_cast<int32_t>(a->batch);
  p.num_heads = static_cast<int32_t>(a->heads);
  p.head_dim = static_cast<int32_t>(a->head_dim);
  p.head_dim_value = static_cast<int32_t>(a->head_dim_value);
  p.num_queries = static_cast<int32_t>(a->seq_q);
  p.num_keys = static_cast<int32_t>(a->seq_kv);
  p.custom_mask_type = Attention::NoCustomMask;
  p.q_strideB = a->q_stride_b;
  p.q_strideM = static_cast<int32_t>(a->q_stride_s);
  p.q_strideH = static_cast<int32_t>(a->q_stride_n);
  p.k_strideB = a->k_stride_b;
  p.k_strideM = static_cast<int32_t>(a->k_stride_s);
  p.k_strideH = static_cast<int32_t>(a->k_stride_n);
  p.v_strideB = a->v_stride_b;
  p.v_strideM = static_cast<int32_t>(a->v_stride_s);
  p.v_strideH = static_cast<int32_t>(a->v_stride_n);
  p.o_strideM = static_cast<int32_t>(a->head_dim_value * a->heads);
  if (a->bias != nullptr) {
    if (!Attention::kSupportsBias) return "$name: this kernel was built without attention-bias support";
    p.attn_bias_ptr = static_cast<T*>(const_cast<void*>(a->bias));
    p.bias_strideB = a->bias_stride_b;
    p.bias_strideH = a->bias_stride_n;
    p.bias_strideM = static_cast<int32_t>(a->bias_stride_s);
  }
  if (!Attention::check_supported(p)) return "$name: q/k/v or a stride is not aligned as the kernel needs";
  void* workspace = nullptr;
  if (Attention::kNeedsOutputAccumulatorBuffer) {
    const size_t bytes =
        sizeof(typename Attention::output_accum_t) * a->batch * a->seq_q * a->heads * a->head_dim_value;
    if (cudaMallocAsync(&workspace, bytes, stream) != cudaSuccess) return Fail("output accumulator allocation");
    p.output_accum_ptr = static_cast<typename Attention::output_accum_t*>(workspace);
  }
  constexpr auto kernel = attention_kernel_batched_impl<Attention>;
  const int smem_bytes = sizeof(typename Attention::SharedStorage);
  if (smem_bytes > 0xc000) {
    // Per device: the opt-in to more than 48 KB of shared memory is a property of the context.
    static bool configured[64] = {};
    int device = 0;
    cudaGetDevice(&device);
    if (device >= 64 || !configured[device]) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess) {
        if (workspace != nullptr) cudaFreeAsync(workspace, stream);
        return Fail("shared memory opt-in");
      }
      if (device < 64) configured[device] = true;
    }
  }
  // Fully masked rows are found by their logsumexp (-inf), which the kernel then writes.
  float* lse = nullptr;
  const int64_t lse_dim = (a->seq_q + Attention::kAlignLSE - 1) / Attention::kAlignLSE * Attention::kAlignLSE;
  if (a->bias != nullptr && a->masked_rows != 0) {
    if (cudaMallocAsync(reinterpret_cast<void**>(&lse), sizeof(float) * a->batch * a->heads * lse_dim, stream) !=
        cudaSuccess) {
      if (workspace != nullptr) cudaFreeAsync(workspace, stream);
      return Fail("logsumexp allocation");
    }
    p.logsumexp_ptr = lse;
  }
  kernel<<<p.getBlocksGrid(), p.getThreadsGrid(), smem_bytes, stream>>>(p);
  cudaError_t launched = cudaPeekAtLastError();
  if (launched == cudaSuccess && lse != nullptr) {
    const int64_t rows = a->batch * a->heads * a->seq_q;
    const int blocks = static_cast<int>(rows / 256 + 1 < 4096 ? rows / 256 + 1 : 4096);
    FixMaskedRows<T><<<blocks, 256, 0, stream>>>(*a, lse, lse_dim);
    launched = cudaPeekAtLastError();
  }
  if (workspace != nullptr) cudaFreeAsync(workspace, stream);
  if (lse != nullptr) cudaFreeAsync(lse, stream);
  if (launched != cudaSuccess) return Fail("kernel launch");
  return nullptr;
}
"""
)

ATTENTION_GLUE_FUNCTION = Template("""\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_${symbol}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny*) {
  const char* fn = "$symbol";
$unpack
  const int device_id = out->device.device_id;
$checks
$rank_checks
$sizes
$shape_checks
  TRY(CheckDim(fn, "output elements", Numel(out), batch * seq_q * $heads * $head_dim_value, out));
  if (batch == 0 || seq_q == 0) return 0;
  if (seq_kv == 0) {
    return Raise("ValueError", "%s: attention over zero keys (shape %s) is undefined", fn, ShapeStr(key).text);
  }
  if (batch > 65535 || Numel(query) > INT32_MAX || Numel(key) > INT32_MAX || Numel(value) > INT32_MAX) {
    return Raise("ValueError", "%s: batch %lld or a q/k/v tensor of over 2^31 elements is past the fused attention "
                 "kernel's 32-bit row strides and grid; split the batch", fn, static_cast<long long>(batch));
  }
  RelaxCutlassAttentionArgs args{batch, $heads, seq_q, seq_kv, $head_dim, $head_dim_value,
      $operands,
      const_cast<void*>(Data(out)), ${scale}f${bias}};
  TRY(CheckNoPendingCudaError(fn));
  void* stream = TVMFFIEnvGetStream(kDLCUDA, device_id);
  if (const char* err = ${kernel}_run(&args, stream)) {
$operand_arrays
    return Raise("RuntimeError", "%s: %s (operands: %s)", fn, err,
                 DescribeOperands(kOperandCount, kOperandNames, kOperandTensors).text);
  }
  return 0;
}
""")
