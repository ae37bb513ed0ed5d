"""Emit C++: one translation unit per kernel configuration, one glue unit per module.

Kernel types come from cutlass_library: `EmitGemmUniversalInstance` / `EmitConv2dInstance` for GEMM
and conv2d fprop + activation epilogues (the activation functors are registered as extra
`EpilogueFunctor` members, the extension point the 2.x emitters read), and, for residual blocks,
which cutlass_library does not emit, `GemmUniversalWithBroadcast` / `DefaultConv2dFpropWithBroadcast`
+ `LinearCombinationResidualBlock` filled from the same operation fields.
"""

from __future__ import annotations

import enum
import functools
from string import Template

from .arch import ARCH_SPECIFIC, arch_name
from .attention import OPERAND_AXES
from .cutlass_lib import data_type
from .cutlass_lib import load as load_cutlass_library
from .emit_sm90 import sm90_kernel_parts
from .kernel_spec import (
    BIAS_AXES,
    BIAS_VECTOR,
    CUTLASS_ELEMENT,
    DTYPE_BITS,
    MASKED_ROWS,
    Activation,
    AttentionKernel,
    AttentionRegion,
    Conv2dKernel,
    Conv2dRegion,
    GemmKernel,
    GemmRegion,
)
from .stages.compile import Source, fmha_flags
from .templates import (
    ATTENTION_ARGS,
    ATTENTION_GLUE_FUNCTION,
    ATTENTION_KERNEL_TU,
    CHECK_DEVICE,
    CONV2D_ARGS,
    CONV2D_ARGUMENTS,
    CONV2D_GLUE_FUNCTION,
    CONV2D_RESIDUAL_ARGUMENTS,
    GEMM_ARGS,
    GLUE_FUNCTION,
    GLUE_TU,
    KERNEL_TU,
)

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

CONV2D_INCLUDES = """\
#include "cutlass/numeric_types.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"
#include "cutlass/epilogue/thread/linear_combination_residual_block.h"
"""


@functools.cache
def _epilogue_functor(act: Activation) -> enum.Enum:
    """The `EpilogueFunctor`-like member for `act`, registered with cutlass_library's 2.x
    emitters (they read `EpilogueFunctorTag[member]`: the extension point for epilogues beyond its
    LinearCombination/Clamp). Names a template with LinearCombination's <ElementOutput, Count,
    ElementAccumulator, ElementCompute> signature, defined by `_epilogue_alias`."""
    load_cutlass_library()
    from cutlass_library.library import EpilogueFunctorTag

    member = enum.Enum(f"RelaxCutlassEpilogue_{act.name}", {act.name: act.name})[act.name]
    EpilogueFunctorTag[member] = f"RelaxCutlassEpilogue_{act.name}"
    return member


def _epilogue_alias(act: Activation) -> str:
    return (
        f"template <typename O, int N, typename A, typename C>\n"
        f"using RelaxCutlassEpilogue_{act.name} = cutlass::epilogue::thread::LinearCombinationGeneric<\n"
        f"    {act.functor}, O, N, A, C, cutlass::epilogue::thread::ScaleType::Default,\n"
        f"    cutlass::FloatRoundStyle::round_to_nearest, /*IsHeavy=*/{str(act.is_heavy).lower()}>;\n"
    )


def _activation_prefix(kernel: GemmKernel | Conv2dKernel) -> str:
    """The alias `_epilogue_functor` names, for kernels with an activation (else nothing)."""
    if kernel.epilogue.activation == "identity":
        return ""
    return _epilogue_alias(kernel.epilogue.functors(kernel.problem.element_out)[0])


def _sm80_description(kernel: GemmKernel | Conv2dKernel, element_a: str, element_b: str):
    """-> (TileDescription, epilogue functor, swizzle) of a CUTLASS 2.x tensor-op kernel, as
    cutlass_library's GEMM and conv2d operations both take them."""
    load_cutlass_library()
    from cutlass_library.library import (
        EpilogueFunctor,
        MathInstruction,
        MathOperation,
        OpcodeClass,
        SwizzlingFunctor,
        TileDescription,
    )  # fmt: skip

    t = kernel.tile
    activation = kernel.epilogue.functors(kernel.problem.element_out)[0]
    mi = MathInstruction(
        list(t.instruction),
        data_type(element_a),
        data_type(element_b),
        data_type(kernel.problem.element_accumulator),
        OpcodeClass.TensorOp,
        MathOperation.multiply_add,
    )
    tile = TileDescription(list(t.threadblock), t.stages, list(t.warps), mi, 80, 1024)
    identity = kernel.epilogue.activation == "identity"
    functor = EpilogueFunctor.LinearCombination if identity else _epilogue_functor(activation)
    return tile, functor, getattr(SwizzlingFunctor, f"Identity{t.swizzle}")


def _operation(kernel: GemmKernel):
    """The cutlass_library GemmOperation for `kernel`, described as the transposed (column-major)
    problem so that the emitted kernel computes the row-major D = A @ B the Relax graph means."""
    load_cutlass_library()
    from cutlass_library.gemm_operation import GemmOperation
    from cutlass_library.library import GemmKind, LayoutType, TensorDescription

    p = kernel.problem
    tile, functor, swizzle = _sm80_description(kernel, p.element_a, p.element_b)
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


def _residual_block_values(kernel: GemmKernel | Conv2dKernel, element_c) -> dict:
    """Template values every residual-block kernel shares: tile shapes, epilogue vector and functors."""
    from cutlass_library.library import DataTypeSize

    t, p, epi = kernel.tile, kernel.problem, kernel.epilogue
    bits = DataTypeSize[element_c]
    activation, post_activation = epi.functors(p.element_out)
    return dict(
        name=kernel.name,
        tb_m=t.threadblock[0], tb_n=t.threadblock[1], tb_k=t.threadblock[2],
        w_m=t.threadblock[0] // t.warps[0], w_n=t.threadblock[1] // t.warps[1], w_k=t.threadblock[2] // t.warps[2],
        i_m=t.instruction[0], i_n=t.instruction[1], i_k=t.instruction[2],
        vector=min(p.alignment * bits, 128) // bits,
        activation=activation.functor,
        post_activation=post_activation.functor,
        swizzle=t.swizzle, stages=t.stages, alignment=p.alignment,
    )  # fmt: skip


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
        **_residual_block_values(kernel, op.C.element),
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
    prefix = _activation_prefix(kernel)
    return {
        "includes": INCLUDES,
        "instance": prefix + EmitGemmUniversalInstance().emit(op),
        "operation_type": f"cutlass::gemm::device::GemmUniversalAdapter<{op.procedural_name()}>",
        "arguments": UNIVERSAL_ARGUMENTS,
    }


def _conv2d_operation(kernel: Conv2dKernel):
    """The cutlass_library Conv2dOperation (fprop, NHWC) for `kernel`."""
    load_cutlass_library()
    from cutlass_library.conv2d_operation import Conv2dOperation
    from cutlass_library.library import ConvKind, IteratorAlgorithm, LayoutType, StrideSupport, TensorDescription

    p = kernel.problem
    tile, functor, swizzle = _sm80_description(kernel, p.element, p.element)
    tensor = TensorDescription(data_type(p.element), LayoutType.TensorNHWC, p.alignment)
    iterator = {"optimized": IteratorAlgorithm.Optimized, "analytic": IteratorAlgorithm.Analytic}[kernel.iterator]
    return Conv2dOperation(
        ConvKind.Fprop, iterator, 80, tile, tensor, tensor, tensor, data_type("float32"),
        StrideSupport.Unity,  # fprop iterators support any stride; the flag only matters for dgrad
        functor, swizzle,
    )  # fmt: skip


# As for GEMM residual blocks, with the conv2d kernel cutlass_library would describe.
CONV2D_RESIDUAL_INSTANCE = Template("""\
using ${name}_base = typename cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast<
    ${element}, cutlass::layout::TensorNHWC, ${element}, cutlass::layout::TensorNHWC,
    ${element}, cutlass::layout::TensorNHWC, ${element_acc},
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<${tb_m}, ${tb_n}, ${tb_k}>,
    cutlass::gemm::GemmShape<${w_m}, ${w_n}, ${w_k}>,
    cutlass::gemm::GemmShape<${i_m}, ${i_n}, ${i_k}>,
    cutlass::epilogue::thread::LinearCombinationResidualBlock<
        ${element}, ${element_acc}, float, ${element}, ${vector},
        ${activation}, cutlass::plus, ${post_activation}>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<${swizzle}>,
    ${stages}, cutlass::arch::OpMultiplyAdd, ${iterator}, cutlass::conv::StrideSupport::kUnity,
    ${alignment}, ${alignment}>::Kernel;
""")


def _conv2d_kernel_parts(kernel: Conv2dKernel) -> dict[str, str]:
    load_cutlass_library()
    from cutlass_library.conv2d_operation import EmitConv2dInstance
    from cutlass_library.library import DataTypeTag, IteratorAlgorithmTag

    op = _conv2d_operation(kernel)
    epi = kernel.epilogue
    if epi.residual:
        base = CONV2D_RESIDUAL_INSTANCE.substitute(
            element=DataTypeTag[op.C.element],
            element_acc=DataTypeTag[op.accumulator_type()],
            iterator=IteratorAlgorithmTag[op.iterator_algorithm],
            **_residual_block_values(kernel, op.C.element),
        )
        base_name, arguments = f"{kernel.name}_base", CONV2D_RESIDUAL_ARGUMENTS
    else:
        base = _activation_prefix(kernel) + EmitConv2dInstance().emit(op)
        base_name, arguments = f"{op.procedural_name()}_base", CONV2D_ARGUMENTS
    # A TU-local kernel type, for the reason given at RESIDUAL_INSTANCE.
    local = f"struct {kernel.name}_kernel : {base_name} {{}};\n"
    return {
        "includes": CONV2D_INCLUDES,
        "instance": base + local,
        "operation_type": f"cutlass::conv::device::ImplicitGemmConvolution<{kernel.name}_kernel>",
        "arguments": arguments,
    }


def _check_device(kernel) -> str:
    """The run-time guard: an arch-specific object (sm_90a) runs on exactly that SM; plain SASS +
    PTX (sm_80, sm_100, sm_120, ...) on it and on every newer GPU, whose driver JITs the PTX (or, in
    the same major, runs the SASS: sm_100 on sm_103, sm_120 on sm_121)."""
    exact = kernel.target in ARCH_SPECIFIC
    return Template(CHECK_DEVICE).substitute(
        name=kernel.name,
        arch=kernel.target,
        arch_exact=str(exact).lower(),
        arch_name=arch_name(kernel.target).removeprefix("sm_"),
    )


def emit_kernel(kernel: GemmKernel | Conv2dKernel | AttentionKernel) -> Source:
    """The translation unit for one kernel configuration, exporting `<kernel.name>_run`.

    The object runs on exactly `kernel.target` for arch-specific targets (sm_90a), else on it and
    newer GPUs (SASS + PTX); `_run` checks that before launching.
    """
    if isinstance(kernel, AttentionKernel):
        return _attention_kernel(kernel)
    if isinstance(kernel, Conv2dKernel):
        parts, args, args_type = _conv2d_kernel_parts(kernel), CONV2D_ARGS, "RelaxCutlassConv2dArgs"
    else:
        parts = sm90_kernel_parts(kernel) if kernel.arch == 90 else _sm80_kernel_parts(kernel)
        args, args_type = GEMM_ARGS, "RelaxCutlassGemmArgs"
    # Custom activation functors (relax_cutlass.extend) are defined before the types that use them.
    parts["instance"] = kernel.epilogue.definitions(kernel.problem.element_out) + parts["instance"]
    parts.setdefault("defines", "")
    parts.setdefault("run", "op.run(stream)")
    text = KERNEL_TU.substitute(
        name=kernel.name, gemm_args=args, args_type=args_type, check_device=_check_device(kernel), **parts
    )
    return Source(kernel.name, text, "cuda", family=f"sm{kernel.arch}")


def _attention_kernel(kernel: AttentionKernel) -> Source:
    text = ATTENTION_KERNEL_TU.substitute(
        name=kernel.name,
        attention_args=ATTENTION_ARGS,
        element=CUTLASS_ELEMENT[kernel.problem.element],
        aligned=str(kernel.aligned).lower(),
        queries=kernel.queries_per_block,
        keys=kernel.keys_per_block,
        max_k=kernel.max_head_dim,
        supports_bias=str(kernel.bias).lower(),
        check_device=_check_device(kernel),
    )
    return Source(kernel.name, text, "cuda", fmha_flags(), family="fmha")


_DLPACK_CODE = {"float16": "kDLFloat", "float32": "kDLFloat", "bfloat16": "kDLBfloat"}


def _gemm_glue_function(region: GemmRegion) -> str:
    p = region.kernel.problem
    roles = region.roles
    checks = _role_aliases(region) + _tensor_checks(region, ("lhs", "rhs", "out", "residual"))
    extra = [f'  TRY(CheckDim(fn, "bias size", Numel(bias), {p.n}, bias));'] if "bias" in roles else []
    extra += _residual_checks(roles)
    rhs_dims = (p.n, p.k) if p.b_transposed else (p.k, p.n)
    return GLUE_FUNCTION.substitute(
        operand_arrays=_operand_arrays(region),
        symbol=region.symbol,
        unpack=_unpack_args(region),
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
        return f"{region.kernel.name}_run(&args, stream)"
    *buckets, (_, last) = region.dispatch
    call = f"{last.name}_run(&args, stream)"
    for max_m, kernel in reversed(buckets):
        call = f"(m <= {max_m} ? {kernel.name}_run(&args, stream) : {call})"
    return call


def _unpack_args(region) -> str:
    """The exported function's arguments, read as `const DLTensor*`s named by role: one per
    composite parameter (R.Shape ones, passed by fused views with symbolic shapes, are taken and
    ignored), then the output."""
    roles = [*region.arg_roles, "out"]
    dtypes = [*region.arg_dtypes, region.out_dtype]
    tensors = [(i, role) for i, (role, dtype) in enumerate(zip(roles, dtypes, strict=True)) if dtype != "shape"]
    lines = [
        f'  TRY(CheckArgCount(fn, num_args, {len(roles)}, "{", ".join(roles)}"));',
        "  const DLTensor " + ", ".join(f"*{role}" for _, role in tensors) + ";",
    ]
    lines += [f'  TRY(TensorArg(fn, ffi_args, {i}, "{role}", &{role}));' for i, role in tensors]
    return "\n".join(lines)


def _operand_arrays(region) -> str:
    """The region's tensors by role, as the arrays a kernel failure's message describes."""
    pairs = zip([*region.arg_roles, "out"], [*region.arg_dtypes, region.out_dtype], strict=True)
    roles = [role for role, dtype in pairs if dtype != "shape"]
    return (
        f"    const int kOperandCount = {len(roles)};\n"
        f"    const char* const kOperandNames[] = {{{', '.join(f'{chr(34)}{r}{chr(34)}' for r in roles)}}};\n"
        f"    const DLTensor* const kOperandTensors[] = {{{', '.join(roles)}}};"
    )


def _role_aliases(region: GemmRegion | Conv2dRegion) -> str:
    """A name for each second role of a parameter (the residual that is also the lhs)."""
    return "".join(f"  const DLTensor* {alias} = {role};\n" for alias, role in region.role_aliases)


def _tensor_checks(
    region: GemmRegion | Conv2dRegion | AttentionRegion, vector_roles: tuple[str, ...], align: dict | None = None
) -> str:
    """One CheckTensor line per argument: dtype, device, contiguity, and the kernel's alignment
    (`align`: bytes for roles the kernel reads with its own vector width)."""
    alignment = region.kernel.problem.alignment
    checks = []
    for role, dtype in [*zip(region.arg_roles, region.arg_dtypes, strict=True), ("out", region.out_dtype)]:
        if dtype == "shape":
            continue
        code, bits = _DLPACK_CODE[dtype], DTYPE_BITS[dtype]
        align_bytes = max(1, alignment * bits // 8) if role in vector_roles else bits // 8
        align_bytes = (align or {}).get(role, align_bytes)
        checks.append(f'  TRY(CheckTensor(fn, "{role}", {role}, {code}, {bits}, {align_bytes}, device_id));')
    return "\n".join(checks)


def _residual_checks(roles) -> list[str]:
    if "residual" not in roles:
        return []
    return [
        '  TRY(CheckDim(fn, "residual rank", residual->ndim, out->ndim, residual));',
        "  for (int i = 0; i < out->ndim; ++i)\n"
        '    TRY(CheckDim(fn, "residual dim", residual->shape[i], out->shape[i], residual));',
    ]


def _conv2d_glue_function(region: Conv2dRegion) -> str:
    p = region.kernel.problem
    roles = region.roles
    extra = [f'  TRY(CheckDim(fn, "bias size", Numel(bias), {p.k}, bias));'] if "bias" in roles else []
    return CONV2D_GLUE_FUNCTION.substitute(
        operand_arrays=_operand_arrays(region),
        symbol=region.symbol,
        unpack=_unpack_args(region),
        checks=_role_aliases(region) + _tensor_checks(region, ("data", "weight", "out", "residual")),
        h=p.h, w=p.w, c=p.c, k=p.k, r=p.r, s=p.s, p=p.p, q=p.q,
        pad_h=p.pad[0], pad_w=p.pad[1], stride_h=p.stride[0], stride_w=p.stride[1],
        dilation_h=p.dilation[0], dilation_w=p.dilation[1], split_k=region.split_k,
        extra_checks="\n".join(extra + _residual_checks(roles)),
        bias_ptr="Data(bias)" if "bias" in roles else "nullptr",
        residual_ptr="Data(residual)" if "residual" in roles else "nullptr",
        kernel=region.kernel.name,
    )  # fmt: skip


def _attention_glue_function(region: AttentionRegion) -> str:
    """The ranks of q/k/v, then sizes (static ones as literals, symbolic ones read from the one
    dimension that holds them), a check of every dimension of q/k/v against the axes it holds, and
    the strides."""
    p = region.kernel.problem
    static = {"B": p.batch, "S": p.seq_q, "T": p.seq_kv, "N": p.heads, "H": p.head_dim, "V": p.head_dim_value}
    names = {"B": "batch", "S": "seq_q", "T": "seq_kv"}
    expr = {axis: str(v) if v is not None else names[axis] for axis, v in static.items()}
    reads = {"query": p.query_reads, "key": p.key_reads, "value": p.value_reads}
    ranks = {role: len(shape) for role, shape in zip(region.arg_roles, region.arg_shapes, strict=True)}
    sizes, rank_checks, checks, strides, defined = [], [], [], {}, set()
    for role, axes in OPERAND_AXES:
        rank_checks.append(f'  TRY(CheckDim(fn, "{role} rank", {role}->ndim, {ranks[role]}, {role}));')
        held: dict[int, list[str]] = {}
        for axis, (dim, factor) in zip(axes, reads[role], strict=True):
            held.setdefault(dim, []).append(axis)
            strides[(role, axis)] = f"PackedStride({role}, {dim})" + (f" * {factor}" if factor != 1 else "")
        for dim in range(ranks[role]):
            inside = held.get(dim, [])
            for axis in inside:  # a symbolic axis is defined by the first dimension holding it
                if static[axis] is None and axis not in defined:
                    others = "".join(f" / {expr[a]}" for a in inside if a != axis)
                    sizes.append(f"  const int64_t {names[axis]} = {role}->shape[{dim}]{others};")
                    defined.add(axis)
            want = " * ".join(expr[a] for a in inside) or "1"
            checks.append(f'  TRY(CheckDim(fn, "{role} dim {dim}", {role}->shape[{dim}], {want}, {role}));')
    for axis in ("B", "S", "T"):
        if static[axis] is not None:
            sizes.append(f"  const int64_t {names[axis]} = {static[axis]};")
    operands = []
    for role, axes in OPERAND_AXES:
        b, rows, n = (strides[(role, a)] for a in axes[:3])
        operands.append(f"Data({role}), {b}, {rows}, {n}")
    bias = ""
    if p.bias_reads is not None:
        bias_checks, bias_strides = _attention_bias(p, ranks["bias"], expr)
        checks += bias_checks
        bias = f",\n      Data(bias), {', '.join(bias_strides)}, {MASKED_ROWS.index(p.masked_rows)}"
    return ATTENTION_GLUE_FUNCTION.substitute(
        operand_arrays=_operand_arrays(region),
        symbol=region.symbol,
        unpack=_unpack_args(region),
        checks=_tensor_checks(region, ("query", "key", "value", "out"), {"bias": 16}),
        rank_checks="\n".join(rank_checks),
        sizes="\n".join(sizes),
        shape_checks="\n".join(checks),
        heads=p.heads,
        head_dim=p.head_dim,
        head_dim_value=p.head_dim_value,
        operands=",\n      ".join(operands),
        scale=format(p.scale, ".9g"),
        bias=bias,
        kernel=region.kernel.name,
    )


def _attention_bias(p, rank: int, expr: dict) -> tuple[list[str], list[str]]:
    """The additive bias: checks of its dimensions (each 1, broadcast, or the sizes of the axes it
    holds) and of the keys' 16-byte rows, and its batch, head and query-row strides (0 where
    broadcast)."""
    held: dict[int, list[str]] = {}
    strides = []
    for axis, read in zip(BIAS_AXES, p.bias_reads, strict=True):
        if read is not None:
            held.setdefault(read[0], []).append(axis)
        if axis != "T":
            factor = "" if read is None or read[1] == 1 else f" * {read[1]}"
            strides.append("0" if read is None else f"PackedStride(bias, {read[0]}){factor}")
    checks = [f'  TRY(CheckDim(fn, "bias rank", bias->ndim, {rank}, bias));']
    for dim in range(rank):
        want = " * ".join(expr[a] for a in held.get(dim, [])) or "1"
        checks.append(f'  TRY(CheckDim(fn, "bias dim {dim}", bias->shape[{dim}], {want}, bias));')
    if p.seq_kv is None:  # a static count was checked when partitioning
        checks.append(
            f"  if (seq_kv % {BIAS_VECTOR} != 0) {{\n"
            f'    return Raise("ValueError", "%s: %lld keys: with a mask/bias the fused attention kernel needs a '
            f'multiple of {BIAS_VECTOR} keys (it loads bias rows 16 bytes at a time); pad the sequence", fn, '
            "static_cast<long long>(seq_kv));\n"
            "  }"
        )
    return checks, strides


def emit_glue(regions: list[GemmRegion | Conv2dRegion | AttentionRegion], module_name: str) -> Source:
    """Host glue exporting one TVM FFI function per region: checks, stream, launch."""
    arg_types = {
        GemmRegion: "RelaxCutlassGemmArgs",
        Conv2dRegion: "RelaxCutlassConv2dArgs",
        AttentionRegion: "RelaxCutlassAttentionArgs",
    }
    kernels = sorted({(k.name, arg_types[type(r)]) for r in regions for k in r.kernels})
    decls = "\n".join(f'extern "C" const char* {k}_run(const {t}* args, void* stream);' for k, t in kernels)
    glue = {
        GemmRegion: _gemm_glue_function,
        Conv2dRegion: _conv2d_glue_function,
        AttentionRegion: _attention_glue_function,
    }
    text = GLUE_TU.substitute(
        gemm_args=GEMM_ARGS + CONV2D_ARGS + ATTENTION_ARGS,
        kernel_decls=decls,
        functions="\n".join(glue[type(r)](r) for r in regions),
    )
    return Source(f"{module_name}_glue", text, "host")
