"""q, k and v taken out of one packed projection, written as slices of it.

Models that project q, k and v with one GEMM hand each to the attention through views that pick
its part: GPT-2 `split`s the (B, S, 3E) projection on its last axis; torch's
nn.MultiheadAttention (ViT) unflattens it to (3, S, B, E) with reshape, expand_dims, permute_dims
and squeeze, then `take`s part i. TVM writes every one of those as a copy (ViT-B/16 at batch 8:
0.46 of its 1.70 ms on the H200, measured 2026-11-27). `packed_projection_slices` rewrites each such part
as what it is in value, `strided_slice(P, [last axis], [lo], [hi])` of the projection P, a form the
attention pattern takes into its region: the kernel then reads q, k and v in place, through
strides and an offset, and nothing is copied. Exact: a slice selects the same elements.

The split form needs only its (last) axis static; the take form static shapes, as it is checked on
an index array of P (the chain of views applied to arange(P.size)): any chain that really is a
slice of P's last axis qualifies, and no other does.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val

from ..ir import rewrite_planned_bindings, static_shape
from .trace import is_op_call, known_dims, static_dim

# Views a take's packed tensor may be reached through from the projection.
_PACKING_VIEWS = ("relax.reshape", "relax.expand_dims", "relax.permute_dims", "relax.squeeze")

# Beyond this many elements the index array is not built (2**26, as kinds.evaluate).
_MAX_ELEMENTS = 1 << 26


def _apply_view(index: np.ndarray, call: relax.Call) -> np.ndarray:
    """The view `call` of an index array: reshape, expand_dims and squeeze keep the element order."""
    if call.op.name != "relax.permute_dims":
        return index.reshape(static_shape(call))
    axes = call.attrs.axes
    return index.transpose([int(a) for a in axes] if axes is not None else None)


def _last_axis_slice(index: np.ndarray, part: np.ndarray) -> tuple[int, int] | None:
    """(lo, hi) when `part` (taken from the index array of P's elements, `index`) is P[..., lo:hi]."""
    if not part.size or part.ndim != index.ndim or part.shape[:-1] != index.shape[:-1]:
        return None
    lo = int(part.reshape(-1)[0])  # the flat index of P[0, ..., 0, lo]
    hi = lo + part.shape[-1]
    if hi > index.shape[-1] or (lo, hi) == (0, index.shape[-1]):
        return None
    return (lo, hi) if np.array_equal(part, index[..., lo:hi]) else None


def _take_as_slice(value: relax.Call, var2val) -> tuple[relax.Expr, int, int] | None:
    """(P, lo, hi) when take(X, i, axis) is P[..., lo:hi], X a chain of views of P."""
    data, indices = value.args[0], value.args[1]
    if not isinstance(indices, tvm.ir.GenericConst) or indices.value.numpy().shape != ():
        return None
    if value.attrs.axis is None or static_shape(value) is None:
        return None
    calls, expr = [], data
    while isinstance(expr, relax.Var) and any(is_op_call(var2val.get(expr), op) for op in _PACKING_VIEWS):
        calls.append(var2val[expr])
        expr = var2val[expr].args[0]
    shape = static_shape(expr)
    if not calls or shape is None or not 0 < int(np.prod(shape)) <= _MAX_ELEMENTS:
        return None
    if any(static_shape(c) is None for c in calls):
        return None
    source = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    viewed = source
    for call in reversed(calls):
        viewed = _apply_view(viewed, call)
    part = np.take(viewed, int(indices.value.numpy()), axis=int(value.attrs.axis))
    found = _last_axis_slice(source, part)
    return (expr, *found) if found is not None else None


def _split_as_slice(value: relax.TupleGetItem, var2val) -> tuple[relax.Expr, int, int] | None:
    """(P, lo, hi) when split(P, ..., last axis)[i] is P[..., lo:hi]."""
    split = var2val.get(value.tuple_value, value.tuple_value)
    if not is_op_call(split, "relax.split"):
        return None
    data = split.args[0]
    dims = known_dims(data)  # only the split axis need be static (a symbolic sequence length is fine)
    if dims is None:
        return None
    axis = int(split.attrs.axis) % len(dims)
    if axis != len(dims) - 1 or static_dim(dims[axis]) is None:
        return None
    size = static_dim(dims[axis])
    sections = split.attrs.indices_or_sections
    if isinstance(sections, (int, tvm.tirx.IntImm)):
        count = int(sections)
        if size % count:
            return None
        bounds = [size // count * k for k in range(count + 1)]
    else:
        bounds = [0, *(int(i) for i in sections), size]
    i = int(value.index)
    return data, bounds[i], bounds[i + 1]


def _same_part(var: relax.Var, source: relax.Expr, lo: int, hi: int) -> bool:
    """`var` has the shape and dtype of source[..., lo:hi]."""
    dims, part = known_dims(source), known_dims(var)
    if dims is None or part is None or len(dims) != len(part) or str(var.ty.dtype) != str(source.ty.dtype):
        return False
    analyzer = tvm.sym.Analyzer()
    same = all(analyzer.can_prove_equal(a, b) for a, b in zip(dims[:-1], part[:-1], strict=True))
    return same and static_dim(part[-1]) == hi - lo


def _slice(mutator, _binding, planned) -> relax.Expr:
    source, lo, hi = planned
    last = len(known_dims(source)) - 1
    return mutator.builder_.emit(relax.op.strided_slice(mutator.visit_expr(source), axes=[last], begin=[lo], end=[hi]))


def packed_projection_slices(func: relax.Function) -> relax.Function:
    """take(views(P), i) and split(P, last axis)[i] that are slices of P's last axis ->
    strided_slice(P, [last axis], [lo], [hi]) (see the module)."""
    var2val = get_var2val(func)
    plan = {}
    for var, value in var2val.items():
        try:
            if is_op_call(value, "relax.take"):
                found = _take_as_slice(value, var2val)
            elif isinstance(value, relax.TupleGetItem):
                found = _split_as_slice(value, var2val)
            else:
                continue
        except (tvm.TVMError, ValueError, TypeError):  # an unusual graph never fails the pipeline
            continue
        if found is not None and _same_part(var, *found):
            plan[var] = found
    if not plan:
        return func
    return rewrite_planned_bindings(func, plan, _slice)
