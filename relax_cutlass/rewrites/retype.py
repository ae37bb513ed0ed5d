"""RetypeFloat16: a float16 graph made bfloat16, for `to_float16(dtype="bfloat16")`.

TVM's ToMixedPrecision only lowers to float16 (its `out_dtype` is the accumulator's dtype, not the
compute dtype): asked for bfloat16 it gave matmuls bfloat16 outputs between float16 operands and
float32 biases, and every model with a bias failed type inference. The lowering now runs in
float16 and this pass then retypes it, before constants are folded, so each weight is rounded once,
from float32 straight to bfloat16 (no float16 range limit or double rounding on the way).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .canonicalize import ACCUMULATING_OPS, relax_functions

try:  # numpy's "bfloat16" dtype (ships with TVM)
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover
    pass

SOURCE = "float16"

# ops whose attributes name a result dtype, and how to rebuild a call with another one
_DTYPE_ATTR_OPS = {
    "relax.astype": lambda call, dtype: relax.op.astype(call.args[0], dtype),
    **ACCUMULATING_OPS,  # (call, out_dtype) -> the call with that out_dtype
}


@mutator
class _Retyper(PyExprMutator):
    def __init__(self, dtype: str, mod: tvm.IRModule | None = None) -> None:
        super().__init__(mod)
        self.dtype = dtype

    def visit_constant_(self, const: relax.Constant) -> relax.Expr:
        if isinstance(const.ty, relax.TensorType) and str(const.ty.dtype) == SOURCE:
            return relax.const(const.value.numpy().astype("float32").astype(self.dtype), self.dtype)
        return const

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or not _names_dtype(call, SOURCE):
            return call
        rebuild = _DTYPE_ATTR_OPS.get(call.op.name)
        if rebuild is None:
            raise NotImplementedError(
                f"RetypeFloat16: {call.op.name} names dtype {SOURCE} in its attributes and has no rebuild rule"
            )
        return rebuild(call, self.dtype)


def _names_dtype(call: relax.Call, dtype: str) -> bool:
    attrs = call.attrs
    return attrs is not None and any(str(getattr(attrs, key, "")) == dtype for key in ("dtype", "out_dtype"))


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.RetypeFloat16")
class RetypeFloat16:
    """Every float16 of a module (constants, casts, accumulating ops' out_dtype, and through type
    inference every value computed from them) becomes `dtype` (bfloat16)."""

    def __init__(self, dtype: str = "bfloat16") -> None:
        self.dtype = dtype

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return relax_functions(mod, lambda func: _Retyper(self.dtype).visit_expr(func))
