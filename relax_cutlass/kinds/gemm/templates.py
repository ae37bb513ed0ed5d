"""C++ of the GEMM kind: the kernel ABI and the glue function of a region."""

from __future__ import annotations

from string import Template

from ...toolkit.templates import GLUE_FUNCTION_HEAD, GLUE_FUNCTION_TAIL

ARGS_TYPE = "RelaxCutlassGemmArgs"

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


# One exported function per region; `unpack` reads the arguments into `const DLTensor*`s named
# by their roles (ffi_args, since `args` is the kernel's argument struct).
GLUE_FUNCTION = Template(
    GLUE_FUNCTION_HEAD
    + """\
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
"""
    + GLUE_FUNCTION_TAIL
)
