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

from ..kinds.ir import tensor_dtype
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


# Ops whose TVM lowering has no bfloat16 form (layer_norm's "only support float32 and float16";
# group_norm's type inference refuses bfloat16): in the bfloat16 graph they run in float32 between
# casts. rms_norm lowers in bfloat16 and is retyped like any other op.
FLOAT32_ONLY_OPS = ("relax.nn.layer_norm", "relax.nn.group_norm")


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
        if isinstance(call.op, tvm.ir.Op) and call.op.name in FLOAT32_ONLY_OPS and tensor_dtype(call) == SOURCE:
            return self._in_float32(call)
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or not _names_dtype(call, SOURCE):
            return call
        rebuild = _DTYPE_ATTR_OPS.get(call.op.name)
        if rebuild is None:
            raise NotImplementedError(
                f"RetypeFloat16: {call.op.name} names dtype {SOURCE} in its attributes and has no rebuild rule"
            )
        return rebuild(call, self.dtype)

    def _in_float32(self, call: relax.Call) -> relax.Expr:
        """`call` (a norm TVM has no bfloat16 kernel for) on its arguments cast to float32, its
        result cast to the new dtype: what ToMixedPrecision does for a float32-only op."""
        emit = self.builder_.emit
        args = []
        for arg in call.args:
            new = self.visit_expr(arg)
            if isinstance(new.ty, relax.TensorType) and str(new.ty.dtype) == self.dtype:
                new = emit(relax.op.astype(new, "float32"))
            args.append(new)
        return relax.op.astype(emit(relax.Call(call.op, args, call.attrs)), self.dtype)


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
