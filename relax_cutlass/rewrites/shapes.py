"""bound_symbolic_shapes: symbolic shapes made exact with the bounds of torch.export's Dims.

TVM's shape inference knows nothing of a symbolic dim's range, so a strided_slice with a symbolic
bound or axis clamps the bound to the axis in its result type, and the clamp stays in every shape
after it. Hugging Face's Llama exported with a symbolic sequence length s runs transformers'
packed-sequence check (`find_packed_sequence_indices`: a torch.diff of the position ids with their
first value less one prepended). It slices the length-s row at [0:1], of length min(1, s), and
subtracts two slices of the concatenation, of lengths min(s, min(1, s) + s) and
max(min(1, s) + s - 1, 0). Both are s for s >= 1, but TVM cannot prove them equal, gives the
subtract no shape at all, and then cannot legalize it ("emit_te now only supports Tensor that has
ShapeExpr shape"): from_torch failed in FoldConstant. BERT slices its (1, 512) position-id buffer
at [0:s], min(s, 512) long, and its frontend reshapes to that clamped length; the add of the
position embeddings to the token embeddings (s long) had no shape either.

TVM's torch frontend records the Dims' ranges in the function's "tir_var_lower_bound" and
"tir_var_upper_bound" attributes (TVM's memory planning sizes buffers by the upper bound). Under
those bounds the clamps can be resolved: a slice whose begin and end provably select known
positions of its axis takes those positions with assume_inbound=True (its length is then
end - begin), a shape expression such as min(s, 512) simplifies to s, and the bindings after
either are inferred again, exactly. The values are unchanged for every size within the bounds;
what cannot be proven is left as it was.
"""

from __future__ import annotations

import re

import tvm
from tvm import relax

__all__ = ["BoundSymbolicShapes", "bound_symbolic_shapes", "shape_var_analyzer", "shapeless_broadcasts"]

_STRIDED_SLICE = tvm.ir.Op.get("relax.strided_slice")


def shape_var_analyzer(func: relax.Function) -> tvm.sym.Analyzer:
    """An analyzer that knows the ranges of `func`'s symbolic dims: the bounds of its
    "tir_var_lower_bound" / "tir_var_upper_bound" attributes (TVM's torch frontend writes the
    exported Dims' there), and at least 0 for a dim of a tensor parameter."""
    attrs = func.attrs if func.attrs is not None else {}

    def bounds(key: str) -> dict[str, int]:
        return {str(k): int(v) for k, v in attrs[key].items()} if key in attrs else {}

    lower, upper = bounds("tir_var_lower_bound"), bounds("tir_var_upper_bound")
    dims = {
        str(d.name)
        for p in func.params
        if isinstance(p.ty, relax.TensorType) and hasattr(p.ty.shape, "values")
        for d in p.ty.shape.values
        if isinstance(d, tvm.tirx.Var)
    }
    analyzer = tvm.sym.Analyzer()
    for var in relax.analysis.defined_symbolic_vars(func):
        name = str(var.name)
        if name not in lower and name not in upper and name not in dims:
            continue
        low = lower.get(name, 0 if name in dims else tvm.sym.ConstIntBound.NEG_INF)
        high = upper.get(name, tvm.sym.ConstIntBound.POS_INF)
        analyzer.update(var, tvm.sym.ConstIntBound(low, high), override=True)
    return analyzer


def _position(analyzer: tvm.sym.Analyzer, index, dim):
    """The position in [0, dim] that a forward strided_slice takes `index` to on an axis of size
    `dim` (a negative index counts from the end, then the clamp), where the analyzer proves which
    case holds; None otherwise. torch.export writes an open end (x[:, 1:]) as 2**63 - 1."""
    prove = analyzer.can_prove
    if prove(index >= 0):
        return index if prove(index <= dim) else dim if prove(index >= dim) else None
    if prove(index < 0):
        return analyzer.simplify(index + dim) if prove(index + dim >= 0) else 0 if prove(index + dim < 0) else None
    return None


def _inbound_slice(analyzer: tvm.sym.Analyzer, call: relax.Call) -> relax.Call | None:
    """`call`, a strided_slice with something symbolic about it (a dim, a begin or an end) and
    forward strides, with assume_inbound=True and its begins and ends the positions they select
    (`_position`), where the analyzer proves them and begin <= end; else None."""
    x, axes, begin, end, *rest = call.args  # strides may be left out (all 1)
    strides = rest[0] if rest else None
    shape = getattr(getattr(x.ty, "shape", None), "values", None)
    if bool(call.attrs.assume_inbound) or shape is None:
        return None
    if not all(isinstance(a, relax.Tuple) for a in (axes, begin, end, axes if strides is None else strides)):
        return None
    rank = len(shape)
    steps = strides.fields if strides is not None else [tvm.tirx.IntImm("int64", 1)] * len(axes.fields)
    new_begin, new_end, symbolic = [], [], False
    for axis, b, e, stride in zip([int(a) for a in axes.fields], begin.fields, end.fields, steps, strict=True):
        dim = shape[axis + rank if axis < 0 else axis]
        if not isinstance(stride, tvm.tirx.IntImm) or int(stride) <= 0:
            return None
        symbolic |= not all(isinstance(v, tvm.tirx.IntImm) for v in (dim, b, e))
        b, e = _position(analyzer, b, dim), _position(analyzer, e, dim)
        if b is None or e is None or not analyzer.can_prove(b <= e):
            return None
        new_begin.append(b)
        new_end.append(e)
    if not symbolic:  # a static slice's type is exact already
        return None
    return relax.op.strided_slice(x, axes, new_begin, new_end, strides, assume_inbound=True)


def _simplified(analyzer: tvm.sym.Analyzer, shape: relax.ShapeExpr) -> relax.ShapeExpr | None:
    """`shape` with each value the bounds simplify further than TVM alone does (min(s, 512) -> s)
    simplified; None where there is none (1 + s stays as written, so a second pass changes nothing)."""
    plain = tvm.sym.Analyzer()
    values = []
    for value in shape.values:
        bounded = analyzer.simplify(value)
        values.append(value if tvm.ir.prim.expr_deep_equal(bounded, plain.simplify(value)) else bounded)
    if all(a.same_as(b) for a, b in zip(values, shape.values, strict=True)):
        return None
    return relax.ShapeExpr(values)


@relax.expr_functor.mutator
class _BoundShapes(relax.PyExprMutator):
    """`_inbound_slice` on every strided_slice and `_simplified` on every shape expression; a call
    whose arguments changed is rebuilt, so its binding takes the type inferred anew."""

    def __init__(self, analyzer: tvm.sym.Analyzer):
        super().__init__()
        self.analyzer = analyzer

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call, relax.Call) and call.op == _STRIDED_SLICE:
            inbound = _inbound_slice(self.analyzer, call)
            return call if inbound is None else inbound
        return call

    def visit_shape_expr_(self, shape):
        simplified = _simplified(self.analyzer, shape)
        return shape if simplified is None else simplified


def bound_symbolic_shapes(func: relax.Function) -> relax.Function:
    """Slices with provable positions -> assume_inbound=True, shape expressions simplified, under the
    bounds of `func`'s symbolic dims (`shape_var_analyzer`); the types after them inferred again.
    A function with nothing to change is returned as it was (the same object)."""
    analyzer = shape_var_analyzer(func)
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op == _STRIDED_SLICE:
            changed = _inbound_slice(analyzer, expr) is not None
        else:
            changed = isinstance(expr, relax.ShapeExpr) and _simplified(analyzer, expr) is not None
        if changed:
            found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    if not found:
        return func
    fixed = _BoundShapes(analyzer).visit_expr(func)
    # the return type derived again from the body: the mutator keeps the old one, which may have
    # had no shape
    return relax.Function(fixed.params, fixed.body, None, fixed.is_pure, fixed.attrs, fixed.span)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.BoundSymbolicShapes")
class BoundSymbolicShapes:
    """`bound_symbolic_shapes` on each Relax function: shapes that only the exported Dims' bounds
    make exact (a Llama or BERT exported with a symbolic sequence length could not be built
    without). FixTvmCudaForms (so from_torch and offload_pipeline) and to_float16 apply it."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        functions = {
            gv: bound_symbolic_shapes(func) if isinstance(func, relax.Function) else func
            for gv, func in mod.functions_items()
        }
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


# Relax's broadcasting elementwise ops: with operands of known shapes, a result of unknown shape
# means TVM could not prove two of their dims equal (or one of them 1), and it cannot legalize it.
_BROADCASTING_OPS = frozenset(
    f"relax.{name}"
    for name in (
        "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum",
        "mod", "floor_mod", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
        "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
        "left_shift", "right_shift", "where",
    )
)  # fmt: skip


def _dim_text(dim) -> str:
    """A dim as a reader writes it: max(min(1, s) + s - 1, 0), not TVMScript's T.max(T.min(T.int64(1), ..."""
    return re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", str(dim)).replace("T.", "")


def _has_shape(expr: relax.Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType) and isinstance(expr.ty.shape, relax.ShapeExpr)


def shapeless_broadcasts(func: relax.Function) -> list[str]:
    """The broadcasting elementwise calls of `func` whose operands have shapes and whose result has
    none, written out (op and operand shapes): calls TVM cannot legalize, so the module cannot be
    built."""
    found = []

    def visit(expr):
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)):
            return
        if expr.op.name not in _BROADCASTING_OPS or _has_shape(expr):
            return
        tensors = [a for a in expr.args if isinstance(a.ty, relax.TensorType)]
        if tensors and all(_has_shape(a) for a in tensors):
            shapes = ", ".join(f"({', '.join(_dim_text(d) for d in a.ty.shape.values)})" for a in tensors)
            found.append(f"{expr.op.name}({shapes})")

    relax.analysis.post_order_visit(func, visit)
    return found
