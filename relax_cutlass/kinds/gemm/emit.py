"""C++ of the GEMM kind: CUTLASS 2.x kernels from cutlass_library's `EmitGemmUniversalInstance` (or
`GemmUniversalWithBroadcast` + `LinearCombinationResidualBlock` for residual blocks, which
cutlass_library does not emit), SM90 kernels from emit_sm90, SM100 ones from sm100, and a region's glue function."""

from __future__ import annotations

from string import Template

from ...cutlass_lib import data_type
from ...cutlass_lib import load as load_cutlass_library
from ...toolkit.compile import Source
from ...toolkit.glue import launch_call, operand_arrays, residual_checks, role_aliases, tensor_checks, unpack_args
from ..cutlass_device import activation_prefix, device_kernel_source, residual_block_values, sm80_description
from .emit_sm90 import sm90_kernel_parts
from .records import GemmKernel, GemmRegion
from .sm100 import sm100_kernel_parts
from .templates import ARGS_TYPE, GEMM_ARGS, GLUE_FUNCTION

INCLUDES = """\
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/default_gemm_universal.h"
#include "cutlass/gemm/device/gemm_universal_with_broadcast.h"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"
#include "cutlass/epilogue/thread/linear_combination_residual_block.h"
"""


def _operation(kernel: GemmKernel):
    """The cutlass_library GemmOperation for `kernel`, described as the transposed (column-major)
    problem so that the emitted kernel computes the row-major D = A @ B the Relax graph means."""
    load_cutlass_library()
    from cutlass_library.gemm_operation import GemmOperation
    from cutlass_library.library import GemmKind, LayoutType, TensorDescription

    p = kernel.problem
    tile, functor, swizzle = sm80_description(kernel, p.element_a, p.element_b)
    # Transposed description: operand A of the description is our B, and vice versa.
    desc_a = TensorDescription(
        data_type(p.element_b), LayoutType.RowMajor if p.b_transposed else LayoutType.ColumnMajor, p.alignment
    )
    desc_b = TensorDescription(data_type(p.element_a), LayoutType.ColumnMajor, p.alignment)
    desc_c = TensorDescription(data_type(p.element_out), LayoutType.ColumnMajor, p.alignment)
    return GemmOperation(GemmKind.Universal, 80, tile, desc_a, desc_b, desc_c, data_type("float32"), functor, swizzle)


# The device-level type only names the kernel; the kernel itself is re-declared as a struct local to
# this translation unit. CUTLASS's GemmUniversalBase<Kernel> caches per-kernel device state (the
# >48 KB shared-memory opt-in) in thread-local template statics: with a kernel type made only of
# CUTLASS types those statics are shared by every library loaded in the process, and the second
# library's kernel would launch without its shared-memory attribute.
RESIDUAL_INSTANCE = Template("""\
using ${name}_device = cutlass::gemm::device::GemmUniversalWithBroadcast<
    ${element_a}, cutlass::layout::RowMajor,
    ${element_b}, ${layout_b},
    ${element_c}, cutlass::layout::RowMajor,
    ${element_acc}, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<${tb_m}, ${tb_n}, ${tb_k}>,
    cutlass::gemm::GemmShape<${w_m}, ${w_n}, ${w_k}>,
    cutlass::gemm::GemmShape<${i_m}, ${i_n}, ${i_k}>,
    cutlass::epilogue::thread::LinearCombinationResidualBlock<
        ${element_c}, ${element_acc}, float, ${element_c}, ${vector},
        ${activation}, ${residual_op}, ${post_activation}>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<${swizzle}>,
    ${stages}, ${alignment}, ${alignment}, cutlass::arch::OpMultiplyAdd>;
struct ${name}_kernel : ${name}_device::GemmKernel {};
""")


# D = act(A @ B + bias): bias is the C operand read with ldc = 0 (one row broadcast to all rows).
UNIVERSAL_ARGUMENTS = """\
typename Gemm::Arguments natural(
      cutlass::gemm::GemmUniversalMode::kGemm, cutlass::gemm::GemmCoord(p->m, p->n, p->k), 1,
      typename Gemm::EpilogueOutputOp::Params(1.0f, p->bias ? 1.0f : 0.0f),
      p->a, p->b, p->bias ? p->bias : p->d, p->d, 0, 0, 0, 0,
      p->lda, p->ldb, /*ldc=*/int64_t(0), p->ldd);
  // The adapter presents the column-major view of the row-major kernel: hand it that view.
  typename Gemm::Arguments arguments = natural.transposed_problem();"""


# D = post(act(A @ B + bias) + residual) (or * residual: Epilogue.residual_op): bias is the
# broadcast vector, residual the C operand.
RESIDUAL_ARGUMENTS = """\
typename Gemm::Arguments arguments(
      cutlass::gemm::GemmUniversalMode::kGemm, cutlass::gemm::GemmCoord(p->m, p->n, p->k), 1,
      typename Gemm::EpilogueOutputOp::Params(1.0f, 1.0f),
      p->a, p->b, p->residual, p->d, const_cast<void*>(p->bias), /*ptr_Tensor=*/nullptr,
      0, 0, 0, 0, 0, 0, p->lda, p->ldb, p->ldr, p->ldd, /*ldr=*/int64_t(0), /*ldt=*/int64_t(0));"""


def _residual_instance(kernel: GemmKernel) -> str:
    load_cutlass_library()
    from cutlass_library.library import DataTypeTag

    op = _operation(kernel)
    p = kernel.problem
    return RESIDUAL_INSTANCE.substitute(
        element_a=DataTypeTag[op.B.element],
        element_b=DataTypeTag[op.A.element],
        layout_b="cutlass::layout::ColumnMajor" if p.b_transposed else "cutlass::layout::RowMajor",
        element_c=DataTypeTag[op.C.element],
        element_acc=DataTypeTag[op.accumulator_type()],
        **residual_block_values(kernel, op.C.element),
    )


def _sm80_kernel_parts(kernel: GemmKernel) -> dict[str, str]:
    if kernel.epilogue.residual:
        return {
            "includes": INCLUDES,
            "instance": _residual_instance(kernel),
            "operation_type": f"cutlass::gemm::device::GemmUniversalBase<{kernel.name}_kernel>",
            "arguments": RESIDUAL_ARGUMENTS,
        }
    load_cutlass_library()
    from cutlass_library.gemm_operation import EmitGemmUniversalInstance

    op = _operation(kernel)
    prefix = activation_prefix(kernel)
    return {
        "includes": INCLUDES,
        "instance": prefix + EmitGemmUniversalInstance().emit(op),
        "operation_type": f"cutlass::gemm::device::GemmUniversalAdapter<{op.procedural_name()}>",
        "arguments": UNIVERSAL_ARGUMENTS,
    }


def gemm_glue_function(region: GemmRegion) -> str:
    p = region.kernel.problem
    roles = region.roles
    checks = role_aliases(region) + tensor_checks(region, ("lhs", "rhs", "out", "residual"))
    extra = [f'  TRY(CheckDim(fn, "bias size", Numel(bias), {p.n}, bias));'] if "bias" in roles else []
    extra += residual_checks(roles)
    rhs_dims = (p.n, p.k) if p.b_transposed else (p.k, p.n)
    return GLUE_FUNCTION.substitute(
        operand_arrays=operand_arrays(region),
        symbol=region.symbol,
        unpack=unpack_args(region),
        checks=checks,
        k=p.k,
        n=p.n,
        rhs_dim0=rhs_dims[0],
        rhs_dim1=rhs_dims[1],
        ldb=p.k if p.b_transposed else p.n,
        extra_checks="\n".join(extra),
        bias_ptr="Data(bias)" if "bias" in roles else "nullptr",
        residual_ptr="Data(residual)" if "residual" in roles else "nullptr",
        launch=_launch(region),
    )


def _launch(region: GemmRegion) -> str:
    """The kernel call: one kernel, or a choice by the run-time M among tuned M buckets."""
    if not region.dispatch:
        return launch_call(region.kernel)
    *buckets, (_, last) = region.dispatch
    call = launch_call(last)
    for max_m, kernel in reversed(buckets):
        call = f"(m <= {max_m} ? {launch_call(kernel)} : {call})"
    return call


def emit_gemm_kernel(kernel: GemmKernel) -> Source:
    parts = {90: sm90_kernel_parts, 100: sm100_kernel_parts}.get(kernel.arch, _sm80_kernel_parts)(kernel)
    return device_kernel_source(kernel, parts, GEMM_ARGS, ARGS_TYPE)
