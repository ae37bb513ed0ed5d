"""FoldWeightsInNumpy: the constant folding a bound model needs, done in numpy.

After `bind_params_by_name`, TVM's FoldConstant folds every weight's transpose, cast and batch-norm
scale by compiling each op with llvm and running it: seconds per op, minutes for a model
(ViT-B/16's ConvertToNHWC + ToMixedPrecision took over 100 s, most of it there). The ops a bound
model's weights go through are folded here first with numpy, bit for bit what TVM computes
(one correctly rounded result per op); FoldConstant then finds nothing left to compile for them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

try:  # numpy's "bfloat16" dtype (ships with TVM)
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover
    pass


def _axes(call: relax.Call, value: np.ndarray) -> tuple[int, ...]:
    axes = call.attrs.axes
    return tuple(range(value.ndim))[::-1] if axes is None else tuple(int(a) for a in axes)


# op -> numpy computation of the call from its constant tensor arguments (None: leave it to TVM).
_UNARY: dict[str, Callable[[relax.Call, np.ndarray], np.ndarray | None]] = {
    "relax.permute_dims": lambda call, x: np.transpose(x, _axes(call, x)),
    "relax.astype": lambda call, x: x.astype(str(call.attrs.dtype)),
    "relax.sqrt": lambda call, x: np.sqrt(x) if x.dtype.kind == "f" else None,
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
}


@mutator
class _NumpyFolder(PyExprMutator):
    def _constant(self, expr: relax.Expr) -> np.ndarray | None:
        """The value of a constant, or of a variable bound to one (a chain folds op by op)."""
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or not isinstance(call.ty, relax.TensorType):
            return call
        name = call.op.name
        value = None
        if name in _UNARY and len(call.args) == 1:
            x = self._constant(call.args[0])
            value = None if x is None else _UNARY[name](call, x)
        elif name == "relax.reshape" and isinstance(call.args[1], relax.ShapeExpr):
            x = self._constant(call.args[0])
            dims = [getattr(d, "value", None) for d in call.args[1].values]
            value = None if x is None or None in dims else x.reshape(dims)
        elif name in _BINARY and len(call.args) == 2:
            a, b = (self._constant(arg) for arg in call.args)
            if a is not None and b is not None and a.dtype == b.dtype and a.dtype.kind == "f":
                with np.errstate(all="ignore"):  # IEEE results (inf, nan) as TVM computes them
                    value = _BINARY[name](a, b)
        if value is None:
            return call
        dtype = str(call.ty.dtype)
        if str(value.dtype) != dtype:  # numpy promoted: TVM's result type is not numpy's here
            return call
        return relax.const(np.array(value, order="C"), dtype)  # keeps 0-d scalars 0-d


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.FoldWeightsInNumpy")
class FoldWeightsInNumpy:
    """permute_dims / astype / reshape / sqrt of constants and elementwise arithmetic between them,
    folded with numpy; everything else is left for FoldConstant."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        functions = {
            gv: _NumpyFolder().visit_expr(func) if isinstance(func, relax.Function) else func
            for gv, func in mod.functions_items()
        }
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
