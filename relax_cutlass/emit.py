"""Emit C++: one translation unit per kernel configuration, one glue unit per module.

Kernel types come from cutlass_library: `EmitGemmUniversalInstance` for GEMM + activation epilogues
(the activation functors are registered as extra `EpilogueFunctor` members, the extension point the
2.x emitters read), and, for residual blocks, which cutlass_library does not emit,
`GemmUniversalWithBroadcast` + `LinearCombinationResidualBlock` filled from the same
`GemmOperation` fields.
"""

from __future__ import annotations

import enum
import functools
from string import Template

from .arch import ARCH_SPECIFIC
from .compile import Source
from .cutlass_lib import data_type
from .cutlass_lib import load as load_cutlass_library
from .emit_sm90 import sm90_kernel_parts
from .kernel_spec import ACTIVATIONS, DTYPE_BITS, GemmKernel, GemmRegion
from .templates import GEMM_ARGS, GLUE_FUNCTION, GLUE_TU, KERNEL_TU

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


# Epilogue functors beyond cutlass_library's LinearCombination/Clamp, one per fused activation.
_Activation = enum.Enum("_Activation", {name: name for name in ACTIVATIONS if name != "identity"})


@functools.cache
def _register_epilogues() -> None:
    """Teach cutlass_library's emitters our activation epilogues (idempotent)."""
    load_cutlass_library()
    from cutlass_library.library import EpilogueFunctorTag

    for member in _Activation:
        # A template with LinearCombination's <ElementOutput, Count, ElementAccumulator,
        # ElementCompute> signature, as the emitter instantiates it.
        EpilogueFunctorTag[member] = f"RelaxCutlassEpilogue_{member.value}"


def _epilogue_alias(activation: str) -> str:
    act = ACTIVATIONS[activation]
    return (
        f"template <typename O, int N, typename A, typename C>\n"
        f"using RelaxCutlassEpilogue_{activation} = cutlass::epilogue::thread::LinearCombinationGeneric<\n"
        f"    {act.functor}, O, N, A, C, cutlass::epilogue::thread::ScaleType::Default,\n"
        f"    cutlass::FloatRoundStyle::round_to_nearest, /*IsHeavy=*/{str(act.is_heavy).lower()}>;\n"
    )


def _operation(kernel: GemmKernel):
    """The cutlass_library GemmOperation for `kernel`, described as the transposed (column-major)
    problem so that the emitted kernel computes the row-major D = A @ B the Relax graph means."""
    load_cutlass_library()
    from cutlass_library.gemm_operation import GemmOperation
    from cutlass_library.library import (
        EpilogueFunctor,
        GemmKind,
        LayoutType,
        MathInstruction,
        MathOperation,
        OpcodeClass,
        SwizzlingFunctor,
        TensorDescription,
        TileDescription,
    )  # fmt: skip

    _register_epilogues()
    p, t, epi = kernel.problem, kernel.tile, kernel.epilogue
    mi = MathInstruction(
        list(t.instruction),
        data_type(p.element_a),
        data_type(p.element_b),
        data_type(p.element_accumulator),
        OpcodeClass.TensorOp,
        MathOperation.multiply_add,
    )
    tile = TileDescription(list(t.threadblock), t.stages, list(t.warps), mi, 80, 1024)
    # Transposed description: operand A of the description is our B, and vice versa.
    desc_a = TensorDescription(
        data_type(p.element_b), LayoutType.RowMajor if p.b_transposed else LayoutType.ColumnMajor, p.alignment
    )
    desc_b = TensorDescription(data_type(p.element_a), LayoutType.ColumnMajor, p.alignment)
    desc_c = TensorDescription(data_type(p.element_out), LayoutType.ColumnMajor, p.alignment)
    functor = EpilogueFunctor.LinearCombination if epi.activation == "identity" else _Activation(epi.activation)
    swizzle = getattr(SwizzlingFunctor, f"Identity{t.swizzle}")
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
        ${activation}, cutlass::plus, ${post_activation}>,
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

# D = post(act(A @ B + bias) + residual): bias is the broadcast vector, residual the C operand.
RESIDUAL_ARGUMENTS = """\
typename Gemm::Arguments arguments(
      cutlass::gemm::GemmUniversalMode::kGemm, cutlass::gemm::GemmCoord(p->m, p->n, p->k), 1,
      typename Gemm::EpilogueOutputOp::Params(1.0f, 1.0f),
      p->a, p->b, p->residual, p->d, const_cast<void*>(p->bias), /*ptr_Tensor=*/nullptr,
      0, 0, 0, 0, 0, 0, p->lda, p->ldb, p->ldr, p->ldd, /*ldr=*/int64_t(0), /*ldt=*/int64_t(0));"""


def _residual_instance(kernel: GemmKernel) -> str:
    load_cutlass_library()
    from cutlass_library.library import DataTypeSize, DataTypeTag

    op = _operation(kernel)
    t, p, epi = kernel.tile, kernel.problem, kernel.epilogue
    element_c = DataTypeTag[op.C.element]
    vector = min(p.alignment * DataTypeSize[op.C.element], 128) // DataTypeSize[op.C.element]
    return RESIDUAL_INSTANCE.substitute(
        name=kernel.name,
        element_a=DataTypeTag[op.B.element],
        element_b=DataTypeTag[op.A.element],
        layout_b="cutlass::layout::ColumnMajor" if p.b_transposed else "cutlass::layout::RowMajor",
        element_c=element_c,
        element_acc=DataTypeTag[op.accumulator_type()],
        tb_m=t.threadblock[0], tb_n=t.threadblock[1], tb_k=t.threadblock[2],
        w_m=t.threadblock[0] // t.warps[0], w_n=t.threadblock[1] // t.warps[1], w_k=t.threadblock[2] // t.warps[2],
        i_m=t.instruction[0], i_n=t.instruction[1], i_k=t.instruction[2],
        vector=vector,
        activation=ACTIVATIONS[epi.activation].functor,
        post_activation=ACTIVATIONS[epi.residual_activation].functor,
        swizzle=t.swizzle, stages=t.stages, alignment=p.alignment,
    )  # fmt: skip


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
    prefix = "" if kernel.epilogue.activation == "identity" else _epilogue_alias(kernel.epilogue.activation)
    return {
        "includes": INCLUDES,
        "instance": prefix + EmitGemmUniversalInstance().emit(op),
        "operation_type": f"cutlass::gemm::device::GemmUniversalAdapter<{op.procedural_name()}>",
        "arguments": UNIVERSAL_ARGUMENTS,
    }


def emit_kernel(kernel: GemmKernel) -> Source:
    """The translation unit for one kernel configuration, exporting `<kernel.name>_run`.

    The object runs on exactly `kernel.target` for arch-specific targets (sm_90a), else on it and
    newer GPUs (SASS + PTX); `_run` checks that before launching.
    """
    parts = sm90_kernel_parts(kernel) if kernel.arch == 90 else _sm80_kernel_parts(kernel)
    exact = kernel.target in ARCH_SPECIFIC
    text = KERNEL_TU.substitute(
        name=kernel.name,
        gemm_args=GEMM_ARGS,
        arch=kernel.target,
        arch_exact=str(exact).lower(),
        arch_name=f"{kernel.target}{'a' if exact else ''}",
        **parts,
    )
    return Source(kernel.name, text, "cuda")


_DLPACK_CODE = {"float16": "kDLFloat", "float32": "kDLFloat", "bfloat16": "kDLBfloat"}


def _glue_function(region: GemmRegion) -> str:
    p = region.kernel.problem
    roles = region.arg_roles
    params = ", ".join(f"TensorView {role}" for role in roles) + ", TensorView out"
    checks = []
    for role, dtype in [*zip(roles, region.arg_dtypes, strict=True), ("out", region.out_dtype)]:
        code, bits = _DLPACK_CODE[dtype], DTYPE_BITS[dtype]
        align_bytes = max(1, p.alignment * bits // 8) if role in ("lhs", "rhs", "out", "residual") else bits // 8
        checks.append(f'  CheckTensor(fn, "{role}", {role}, {code}, {bits}, {align_bytes}, device_id);')
    extra = []
    if "bias" in roles:
        extra.append(f'  CheckDim(fn, "bias size", bias.numel(), {p.n}, bias);')
    if "residual" in roles:
        extra.append('  CheckDim(fn, "residual rank", residual.ndim(), out.ndim(), residual);')
        extra.append(
            "  for (int i = 0; i < out.ndim(); ++i)\n"
            '    CheckDim(fn, "residual dim", residual.size(i), out.size(i), residual);'
        )
    rhs_dims = (p.n, p.k) if p.b_transposed else (p.k, p.n)
    return GLUE_FUNCTION.substitute(
        symbol=region.symbol,
        params=params,
        checks="\n".join(checks),
        k=p.k,
        n=p.n,
        rhs_dim0=rhs_dims[0],
        rhs_dim1=rhs_dims[1],
        ldb=p.k if p.b_transposed else p.n,
        extra_checks="\n".join(extra),
        bias_ptr="Data(bias)" if "bias" in roles else "nullptr",
        residual_ptr="Data(residual)" if "residual" in roles else "nullptr",
        kernel=region.kernel.name,
    )


def emit_glue(regions: list[GemmRegion], module_name: str) -> Source:
    """Host glue exporting one TVM FFI function per region: checks, stream, launch."""
    kernels = sorted({r.kernel.name for r in regions})
    decls = "\n".join(
        f'extern "C" const char* {k}_run(const RelaxCutlassGemmArgs* args, void* stream);' for k in kernels
    )
    text = GLUE_TU.substitute(
        gemm_args=GEMM_ARGS,
        kernel_decls=decls,
        functions="\n".join(_glue_function(r) for r in regions),
    )
    return Source(f"{module_name}_glue", text, "host")
