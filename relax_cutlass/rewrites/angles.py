"""Angles stay in float32: sin and cos of a 16-bit argument that was computed in float32.

ToMixedPrecision casts the inputs of every matmul to 16 bits and lets cheap ops follow their
inputs' dtype, so a rotary embedding's angles (`inv_freq @ position_ids`, positions up to the
sequence length) reach `cos`/`sin` in float16, whose spacing is 0.25 at 256 and 2.0 at 2048:
the rotation is off by up to a quarter radian at position 511, and random beyond a few thousand.
Where the angles stay float32 (`positions * inv_freq`, transformers 5.24), ToMixedPrecision still
rounds the constant `inv_freq` through float16 and back: 0.33 radians off at position 2047.
torch's fp16 models compute these angles in float32 (transformers disables autocast there). On
the zoo's Llama (4 layers, 1 x 512) rounding the angles alone puts last_hidden_state 1.6e-2 from
float64, where torch's own fp16 is 1.0e-2.

`sin`/`cos` whose argument traces back, through layout ops and arithmetic, to a float32 value
cast to 16 bits get that computation redone in float32 without the casts, and their result cast to
the dtype the graph expects: the values downstream are as torch's, and their dtypes are unchanged.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from ..kinds.ir import tensor_dtype
from ..toolkit.dtypes import SIXTEEN_BIT_FLOATS
from .canonicalize import relax_functions

PERIODIC_OPS = ("relax.sin", "relax.cos")
# Ops whose attributes do not name a dtype, so the same call on float32 arguments computes the
# same thing in float32; matmul names its out_dtype and is rebuilt with a float32 one.
DTYPE_FREE_OPS = frozenset(
    {
        "relax.permute_dims",
        "relax.reshape",
        "relax.concat",
        "relax.expand_dims",
        "relax.squeeze",
        "relax.broadcast_to",
        "relax.strided_slice",
        "relax.take",
        "relax.repeat",
        "relax.tile",
        "relax.flatten",
        "relax.multiply",
        "relax.add",
        "relax.subtract",
        "relax.divide",
        "relax.negative",
        "relax.exp",
        "relax.log",
        "relax.sqrt",
        "relax.rsqrt",
        "relax.power",
    }
)


class _Widener:
    """Recomputes a floating-point expression in float32 from the float32 values it was cast down
    from, as precisely as its computation can be followed."""

    def __init__(self, var2val: dict) -> None:
        self.var2val = var2val
        self.memo: dict = {}
        self.gained = False  # a float32 value cast down to 16 bits was found and skipped

    def widen(self, expr: relax.Expr) -> relax.Expr:
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.widen(field) for field in expr.fields])
        if expr not in self.memo:
            self.memo[expr] = self._widen(expr)
        return self.memo[expr]

    def _widen(self, expr: relax.Expr) -> relax.Expr:
        value = self.var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, relax.Tuple):
            return self.widen(value)
        fallback = expr if tensor_dtype(expr) == "float32" else relax.op.astype(expr, "float32")
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return fallback
        name = value.op.name
        if name == "relax.astype":
            source = value.args[0]
            if not _is_float(source):
                return relax.op.astype(source, "float32")
            if tensor_dtype(source) == "float32" and tensor_dtype(expr) in SIXTEEN_BIT_FLOATS:
                self.gained = True
            return self.widen(source)
        if name != "relax.matmul" and name not in DTYPE_FREE_OPS:
            return fallback
        args = [self.widen(arg) if _is_float(arg) else arg for arg in value.args]
        if tensor_dtype(expr) == "float32" and all(new.same_as(old) for new, old in zip(args, value.args, strict=True)):
            return expr
        if name == "relax.matmul":
            return relax.op.matmul(args[0], args[1], out_dtype="float32")
        return relax.Call(value.op, args, value.attrs, value.ty_args)


def _is_float(expr: relax.Expr) -> bool:
    """A floating-point tensor, or a tuple of expressions (concat's argument)."""
    if isinstance(expr, relax.Tuple) or isinstance(expr.ty, relax.TupleType):
        return True
    dtype = tensor_dtype(expr)
    return dtype is not None and dtype.startswith(("float", "bfloat"))


def angles_in_float32(func: relax.Function) -> relax.Function:
    """cos/sin(x) -> astype(cos/sin(x recomputed in float32), x's dtype) where x, or a value it
    is computed from, went through 16 bits: a float16 x, or a float32 one computed from a constant
    that ToMixedPrecision cast to float16 and back (it casts constants down eagerly)."""
    var2val = relax.analysis.get_var2val(func)
    angle = wildcard()
    pattern = is_op(PERIODIC_OPS[0])(angle)
    for name in PERIODIC_OPS[1:]:
        pattern = pattern | is_op(name)(angle)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        dtype = tensor_dtype(orig)
        if dtype not in SIXTEEN_BIT_FLOATS + ("float32",):
            return orig
        widener = _Widener(var2val)
        wide = widener.widen(m[angle])
        if not widener.gained:
            return orig
        periodic = relax.Call(orig.op, [wide], orig.attrs, orig.ty_args)
        return periodic if dtype == "float32" else relax.op.astype(periodic, dtype)

    return rewrite_call(pattern, rewriter, func)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.AnglesInFloat32")
class AnglesInFloat32:
    """sin/cos of angles computed in float32 and cast to 16 bits compute in float32 (see the
    module's docstring); to_float16 applies it after ToMixedPrecision."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return relax_functions(mod, angles_in_float32)
