"""NarrowFloat32Islands: float32 islands that mixed precision left between 16-bit values, computed in
the 16-bit dtype again, so that they fuse into the epilogue of the conv or GEMM before them.

torch.export (torch 2.11) writes torchvision's Hardswish as x * min(max(x + 3, 0), 6) / 6 with the
clamp's upper half a clamp to (-inf, 6]; after ToMixedPrecision and ConvertToNHWC a 16-bit x
reaches it as

    h = astype(x, f32) * minimum(maximum(minimum(astype(maximum(x + 3, 0), f32), inf), -inf), 6) / 6

and, where a residual add reads h too, the block's output stays in float32. No epilogue pattern
matches that: every hardswish of MobileNetV3-Large ran as a TVM kernel of its own after its conv
(0.2 of 1.04 ms on the H200), and the SM80/SM90 kernels' fused hardswish went unused. The rewrite
computes it in x's dtype and casts that to float32,

    h = astype(x * minimum(maximum(x + 3, 0), 6) / 6, f32)

and `astype(astype(y, f32), dtype of y)` (exact) becomes y, so the next conv reads the 16-bit value
directly. An offloaded epilogue computes the activation in float32 and rounds once, as torch's
float16 kernels do; left in TVM, the 16-bit arithmetic is within a 16-bit rounding of the float32
one. The infinite clamps are dropped (they change nothing but NaN, which torch propagates).

The residual add after such a block is then astype(astype(a, f32) + astype(b, f32), dtype of a
and b): the sum of two widened 16-bit values is exact in float32 unless their exponents differ
by more than 13, so the one rounding gives a + b in 16 bits, and as that the add fuses into the
producing conv's epilogue as its residual.

Data movement on a widened 16-bit value moves the widened bytes: torchvision's Swin rolls and
partitions windows (pad, two takes, reshape, permute_dims, reshape) after an astype to float32 of
its 16-bit layer norm and casts back to 16 bits before the next GEMM, so the norm wrote float32 and
every copy moved twice the bytes. A widening cast is moved past the data movement ops after it
(they select elements; a pad's fill is a 16-bit value), where it meets the narrowing one and both
go.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ..kinds.epilogue_patterns import scalar_constant
from ..kinds.ir import rewrite_call_weights_hidden
from ..toolkit.dtypes import SIXTEEN_BIT_FLOATS
from .canonicalize import relax_functions


def _float32_hardswish_pattern():
    x = wildcard()
    c3, c0, c6, c6_div, c_inf, c_neg_inf = (is_const() for _ in range(6))
    widened = is_op("relax.astype")(is_op("relax.maximum")(is_op("relax.add")(x, c3), c0))
    unbounded = is_op("relax.maximum")(is_op("relax.minimum")(widened, c_inf), c_neg_inf)
    clamped = is_op("relax.minimum")(unbounded | widened, c6)
    x32 = is_op("relax.astype")(x)
    product = is_op("relax.multiply")(x32, clamped) | is_op("relax.multiply")(clamped, x32)
    pattern = is_op("relax.divide")(product, c6_div)
    expected = {c3: 3.0, c0: 0.0, c6: 6.0, c6_div: 6.0, c_inf: float("inf"), c_neg_inf: float("-inf")}
    return pattern, x, widened, x32, expected


def narrow_float32_hardswish(func: relax.Function) -> relax.Function:
    """The float32 hardswish of a 16-bit x (see the module's docstring) -> astype(hardswish(x), f32)."""
    pattern, x, widened, x32, expected = _float32_hardswish_pattern()

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        source = m[x]
        dtype = str(getattr(source.ty, "dtype", ""))
        if dtype not in SIXTEEN_BIT_FLOATS or str(orig.ty.dtype) != "float32":
            return orig
        if str(m[widened].ty.dtype) != "float32" or str(m[x32].ty.dtype) != "float32":
            return orig
        if any(p in m and scalar_constant(m[p]) != value for p, value in expected.items()):
            return orig
        three, six = relax.const(3.0, dtype), relax.const(6.0, dtype)
        clamp = relax.op.minimum(relax.op.maximum(relax.op.add(source, three), relax.const(0.0, dtype)), six)
        return relax.op.astype(relax.op.divide(relax.op.multiply(source, clamp), six), "float32")

    return rewrite_call_weights_hidden(pattern, rewriter, func)


def drop_widening_round_trips(func: relax.Function) -> relax.Function:
    """astype(astype(y, float32), dtype of y) -> y for a 16-bit y: the widening is exact."""
    y = wildcard()
    widened = is_op("relax.astype")(y)
    pattern = is_op("relax.astype")(widened)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        dtype = str(getattr(m[y].ty, "dtype", ""))
        if dtype in SIXTEEN_BIT_FLOATS and str(m[widened].ty.dtype) == "float32" and str(orig.ty.dtype) == dtype:
            return m[y]
        return orig

    return rewrite_call_weights_hidden(pattern, rewriter, func)


# Ops that only select, repeat or rearrange their first argument's elements (a pad adds its fill).
DATA_MOVEMENT_OPS = (
    "relax.reshape",
    "relax.permute_dims",
    "relax.take",
    "relax.strided_slice",
    "relax.squeeze",
    "relax.expand_dims",
    "relax.flip",
    "relax.broadcast_to",
    "relax.nn.pad",
)


def _fill_is_exact(call: relax.Call, dtype: str) -> bool:
    """A pad's fill value is a `dtype` value (other ops have no fill)."""
    if call.op.name != "relax.nn.pad":
        return True
    fill = np.float32(call.attrs.pad_value)
    if dtype == "bfloat16":  # the upper half of a float32
        return int(fill.view(np.uint32)) & 0xFFFF == 0
    return float(fill.astype(dtype)) == float(fill)


def sink_widening_casts(func: relax.Function) -> relax.Function:
    """move(astype(y, float32), ...) -> astype(move(y, ...), float32) for a 16-bit y and a data
    movement op `move`: exact, and the move then carries half the bytes."""
    y = wildcard()
    widened = is_op("relax.astype")(y)
    pattern = None
    for op in DATA_MOVEMENT_OPS:
        moved = is_op(op)(widened, varg_default_wildcard=True)
        pattern = moved if pattern is None else pattern | moved

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        dtype = str(getattr(m[y].ty, "dtype", ""))
        if dtype not in SIXTEEN_BIT_FLOATS or str(m[widened].ty.dtype) != "float32":
            return orig
        if not _fill_is_exact(orig, dtype):
            return orig
        moved = relax.Call(orig.op, [m[y], *orig.args[1:]], orig.attrs, orig.ty_args)
        return relax.op.astype(moved, "float32")

    return rewrite_call_weights_hidden(pattern, rewriter, func)


def narrow_widened_adds(func: relax.Function) -> relax.Function:
    """astype(astype(a, f32) + astype(b, f32), dtype) with 16-bit a, b of that dtype -> a + b."""
    a, b = wildcard(), wildcard()
    wide_a, wide_b = is_op("relax.astype")(a), is_op("relax.astype")(b)
    total = is_op("relax.add")(wide_a, wide_b)
    pattern = is_op("relax.astype")(total)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        dtype = str(orig.ty.dtype)
        operands = [str(getattr(m[v].ty, "dtype", "")) for v in (a, b)]
        widened = [str(m[v].ty.dtype) for v in (wide_a, wide_b, total)]
        if dtype not in SIXTEEN_BIT_FLOATS or operands != [dtype, dtype] or widened != ["float32"] * 3:
            return orig
        return relax.op.add(m[a], m[b])

    return rewrite_call_weights_hidden(pattern, rewriter, func)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.NarrowFloat32Islands")
class NarrowFloat32Islands:
    """A hardswish that ToMixedPrecision left in float32 around a 16-bit input computed in the
    input's dtype (then widened), widening casts moved past the data movement after them, the
    exact widen-and-narrow casts that leaves dropped, and a
    residual add of two widened 16-bit values made a 16-bit add, so that the activation and the
    residual fuse into the epilogues before them. A no-op on modules without these forms."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        def narrow(func: relax.Function) -> relax.Function:
            func = drop_widening_round_trips(sink_widening_casts(narrow_float32_hardswish(func)))
            return relax.analysis.remove_all_unused(narrow_widened_adds(func))

        return relax_functions(mod, narrow)
