"""q, k and v taken out of one packed projection, written as slices of it.

Models that project q, k and v with one GEMM hand each to the attention through views that pick
its part: GPT-2 `split`s the (B, S, 3E) projection on its last axis; torch's
nn.MultiheadAttention (ViT) unflattens it to (3, S, B, E) with reshape, expand_dims, permute_dims
and squeeze, then `take`s part i; torchvision's Swin reshapes it to (B, S, 3, N, H), permutes it to
(3, B, N, S, H) and takes part i; BLOOM views it per head as (B, S, N, 3, H) and takes part i of
axis 3. TVM writes every one of those as a copy (ViT-B/16 at batch 8: 0.46 of its 1.70 ms on the
H200, measured 2026-11-27). `packed_projection_slices` rewrites each such part as what it is in
value, a view of a slice of the projection P's rows, `strided_slice(P', [last axis], [lo], [hi])`
with P' = P or (BLOOM) P with its rows cut into per-head groups, then the reshape and permute_dims
that put the part's axes where the model has them: forms the attention pattern takes into its
region. The kernel then reads q, k and v in place, through strides and an offset, and nothing is
copied. Exact: the views select the same elements in the same order.

The split form needs only its (last) axis static; the take form static shapes, as it is checked on
an index array of P (the chain of views applied to arange(P.size)): any chain whose part really is
such a view of a slice qualifies, and no other does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val

from ..ir import rewrite_planned_bindings, static_shape, use_counts, view_of_index
from .trace import is_op_call, known_dims, static_dim

# Views a take's packed tensor may be reached through from the projection.
_PACKING_VIEWS = ("relax.reshape", "relax.expand_dims", "relax.permute_dims", "relax.squeeze")

# Beyond this many elements the index array is not built (2**26, as kinds.evaluate).
_MAX_ELEMENTS = 1 << 26


@dataclass(frozen=True)
class PackedPart:
    """A part of projection `source` as views of a slice of its rows: the rows cut to length
    `row` (None: as they are), columns [lo, hi) of each, then reshaped to `shape` and permuted by
    `axes` (each None where not needed)."""

    source: relax.Expr
    lo: int
    hi: int
    row: int | None = None
    shape: tuple[int, ...] | None = None
    axes: tuple[int, ...] | None = None


def _unit_strides(part: np.ndarray) -> list[int]:
    """How far one step along each axis of `part` moves in the source's flat order (0 for axes of
    size 1)."""
    origin = int(part.reshape(-1)[0])
    strides = []
    for axis, size in enumerate(part.shape):
        step = [0] * part.ndim
        step[axis] = 1
        strides.append(int(part[tuple(step)]) - origin if size > 1 else 0)
    return strides


def _is_affine(part: np.ndarray, strides: list[int]) -> bool:
    """Every element of `part` sits at its first one's flat index plus its index times `strides`."""
    expected = np.full(part.shape, int(part.reshape(-1)[0]), dtype=np.int64)
    for axis, (size, stride) in enumerate(zip(part.shape, strides, strict=True)):
        shape = [1] * part.ndim
        shape[axis] = size
        expected = expected + (np.arange(size, dtype=np.int64) * stride).reshape(shape)
    return bool(np.array_equal(part, expected))


def slice_view(part: np.ndarray, source: relax.Expr, source_shape: tuple[int, ...]) -> PackedPart | None:
    """`part` (elements of `source`, of static shape `source_shape`, by flat index) as views of a
    slice of the source's rows, or None where it is none."""
    width = source_shape[-1]
    if not part.size or part.size >= int(np.prod(source_shape)):
        return None
    strides = _unit_strides(part)
    if min(strides) < 0 or not _is_affine(part, strides):
        return None
    # the axes from the outermost (largest stride) in; the innermost must be contiguous, and the
    # axes read contiguously from it form the slice's columns
    order = sorted((a for a in range(part.ndim) if part.shape[a] > 1), key=lambda a: -strides[a])
    if not order or strides[order[-1]] != 1:
        return None
    columns, reach = 1, 1
    inner = len(order)
    while inner and strides[order[inner - 1]] == reach:
        inner -= 1
        reach *= part.shape[order[inner]]
        columns = reach
    # the outer axes step over whole rows of length `row` (the first outer stride), together
    # covering every row once
    row = strides[order[inner - 1]] if inner else None
    lo = int(part.reshape(-1)[0])
    if row is None:  # the part is one run: a slice of a single row
        if int(np.prod(source_shape[:-1])) != 1:
            return None
        row = width
    reach = row
    for axis in reversed(order[:inner]):
        if strides[axis] != reach:
            return None
        reach *= part.shape[axis]
    if reach != int(np.prod(source_shape)) or lo + columns > row or (width % row and row != width):
        return None
    # the part read as (rows..., columns) in stride order, then permuted to the model's order
    sliced_shape = tuple(source_shape[:-1]) + ((width // row,) if row != width else ()) + (columns,)
    # the axes in stride order where the part has axes of more than one element, unit axes kept
    # where they are (a head axis of one stays between batch and rows)
    strided = iter(order)
    read_order = [a if part.shape[a] == 1 else next(strided) for a in range(part.ndim)]
    shape = tuple(int(part.shape[a]) for a in read_order)
    axes = tuple(read_order.index(a) for a in range(part.ndim))
    return PackedPart(
        source=source,
        lo=lo,
        hi=lo + columns,
        row=row if row != width else None,
        shape=shape if shape != sliced_shape else None,
        axes=axes if axes != tuple(range(part.ndim)) else None,
    )


def _take_as_slice(value: relax.Call, var2val) -> tuple[PackedPart, np.ndarray] | None:
    """take(X, i, axis) as views of a slice of P's rows, X a chain of views of P; with the part's
    index array (elements of P)."""
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
        viewed = view_of_index(viewed, call) if viewed is not None else None
    if viewed is None:
        return None
    part = np.take(viewed, int(indices.value.numpy()), axis=int(value.attrs.axis))
    if tuple(static_shape(value)) != part.shape:
        return None
    found = slice_view(part, expr, tuple(shape))
    return None if found is None else (found, part)


def _through_views(var: relax.Var, found: PackedPart, part: np.ndarray, var2val, readers) -> tuple:
    """(var, found) moved down the chain of reshapes and permutes that alone read `var`, to the
    last var on it that is a view of the same slice: a part (nn.MultiheadAttention's (S, B, E) parts
    of a (B, S, 3E) projection, split into heads and moved) reaches the attention as one reshape and
    one permute of the slice, the views its pattern takes, instead of a chain of them."""
    shape = static_shape(found.source)
    best = (var, found)
    while var in readers:
        var = readers[var]
        part = view_of_index(part, var2val[var])
        if part is None:
            break
        further = slice_view(part, found.source, tuple(shape))  # a merged axis may not be one
        if further is not None and (further.lo, further.hi, further.row) == (found.lo, found.hi, found.row):
            best = (var, further)
    return best


def _split_as_slice(value: relax.TupleGetItem, var2val) -> PackedPart | None:
    """split(P, ..., last axis)[i] as the slice P[..., lo:hi] it is."""
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
    return PackedPart(data, bounds[i], bounds[i + 1])


def _same_part(var: relax.Var, found: PackedPart) -> bool:
    """`var` has the shape and dtype of the part `found` describes."""
    source, lo, hi = found.source, found.lo, found.hi
    if found.row is not None or found.shape is not None or found.axes is not None:
        return str(var.ty.dtype) == str(source.ty.dtype)  # a take's part, its shape checked there
    dims, part = known_dims(source), known_dims(var)
    if dims is None or part is None or len(dims) != len(part) or str(var.ty.dtype) != str(source.ty.dtype):
        return False
    analyzer = tvm.sym.Analyzer()
    same = all(analyzer.can_prove_equal(a, b) for a, b in zip(dims[:-1], part[:-1], strict=True))
    return same and static_dim(part[-1]) == hi - lo


def _slice(mutator, _binding, found: PackedPart) -> relax.Expr:
    emit = mutator.builder_.emit
    source = mutator.visit_expr(found.source)
    dims = known_dims(found.source)
    if found.row is not None:  # rows cut into groups of `row` (static: the take form)
        width = static_dim(dims[-1])
        source = emit(relax.op.reshape(source, [*dims[:-1], width // found.row, found.row]))
        dims = known_dims(source)
    part = emit(relax.op.strided_slice(source, axes=[len(dims) - 1], begin=[found.lo], end=[found.hi]))
    if found.shape is not None:
        part = emit(relax.op.reshape(part, found.shape))
    if found.axes is not None:
        part = emit(relax.op.permute_dims(part, found.axes))
    return part


def packed_projection_slices(func: relax.Function) -> relax.Function:
    """take(views(P), i) and split(P, last axis)[i] that are views of a slice of P's rows ->
    those views of strided_slice(P, [last axis], [lo], [hi]) (see the module)."""
    var2val = get_var2val(func)
    uses = use_counts(func)
    readers = {  # var -> the reshape or permute that is its only reader
        value.args[0]: var
        for var, value in var2val.items()
        if any(is_op_call(value, op) for op in ("relax.reshape", "relax.permute_dims"))
        and isinstance(value.args[0], relax.Var)
        and uses.get(value.args[0], 0) == 1
        and static_shape(var) is not None
    }
    plan = {}
    for var, value in var2val.items():
        try:
            if is_op_call(value, "relax.take"):
                taken = _take_as_slice(value, var2val)
                found = None if taken is None else taken[0]
                if found is not None and _same_part(var, found):
                    var, found = _through_views(var, found, taken[1], var2val, readers)
            elif isinstance(value, relax.TupleGetItem):
                found = _split_as_slice(value, var2val)
            else:
                continue
        except (tvm.TVMError, ValueError, TypeError):  # an unusual graph never fails the pipeline
            continue
        if found is not None and _same_part(var, found):
            plan[var] = found
    if not plan:
        return func
    return rewrite_planned_bindings(func, plan, _slice)
