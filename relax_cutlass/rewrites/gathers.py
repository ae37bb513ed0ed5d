"""TakesAsSlices: gathers that pick runs of consecutive positions, written as the slices they are.

torch.export writes torch.roll(x, shift, dim) as a take of x along dim with the index vector
(arange(n) - shift) mod n, computed in the graph, and an indexing with a constant position
(x[:, 0], a part of a packed tensor) as a take of a scalar index. TVM's CUDA build gives every take
a kernel of its own: the read through an index tensor is opaque to its fusion, so the gather
writes its whole output, and whatever reads it (the window partition after Swin's roll, a
reshape and a permute_dims) is another copy. torchvision's Swin-T rolls its activations before and
after every shifted-window attention: 24 such takes, with the packed q/k/v takes 0.87 of its
4.06 ms at batch 32 on the H200.

A take whose indices (constant, or computed from no input and evaluated once here) are a few
ascending runs of consecutive positions is the concatenation of those runs as strided slices; a
roll is two. A scalar index is a one-element slice squeezed away. Both are injective ops that
FuseOps fuses with the copies around them into one kernel. Exact: the same elements in the same
order. Offloaded functions are left alone.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val

from ..kinds.evaluate import evaluate_input_free, input_free_vars
from ..kinds.ir import is_call, planned_rewrite, static_int
from .canonicalize import relax_functions

# More runs than this and the gather stays a gather (a concatenation of many slices is no cheaper).
MAX_RUNS = 4


def ascending_runs(indices: np.ndarray, size: int) -> list[tuple[int, int]] | None:
    """`indices` (positions along an axis of `size`) as [(start, stop), ...] runs of consecutive
    positions, or None where one is out of range or there are more than MAX_RUNS runs."""
    values = indices.astype(np.int64).reshape(-1)
    if not values.size or values.min() < 0 or values.max() >= size:
        return None
    breaks = np.nonzero(np.diff(values) != 1)[0] + 1
    if len(breaks) >= MAX_RUNS:
        return None
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [values.size]])
    return [(int(values[a]), int(values[b - 1]) + 1) for a, b in zip(starts, stops, strict=True)]


def _index_values(func, indices: relax.Expr, free: set, cache: dict) -> np.ndarray | None:
    """The values of a take's indices: a constant's, or those of a vector computed from no input."""
    if isinstance(indices, tvm.ir.GenericConst):
        return indices.value.numpy()
    if not isinstance(indices, relax.Var) or indices not in free:
        return None
    if indices not in cache:
        cache[indices] = evaluate_input_free(func, indices, free)
    return cache[indices]


def _plan(func: relax.Function) -> dict:
    """var -> (data, axis, runs, whether the index is a scalar) for every take that is slices."""
    plan, cache, free = {}, {}, None
    for var, value in get_var2val(func).items():
        if not is_call(value, "relax.take") or value.attrs.axis is None:
            continue
        data, indices = value.args
        index_type = indices.ty
        if not isinstance(index_type, relax.TensorType) or index_type.ndim not in (0, 1):
            continue
        if not isinstance(data.ty, relax.TensorType) or data.ty.shape is None or data.ty.ndim < 1:
            continue
        axis = int(value.attrs.axis) % data.ty.ndim
        size = static_int(data.ty.shape.values[axis])
        if size is None:
            continue
        if free is None:
            free = input_free_vars(func)
        values = _index_values(func, indices, free, cache)
        if values is None:
            continue
        runs = ascending_runs(values, size)
        if runs is not None:
            plan[var] = (data, axis, runs, index_type.ndim == 0)
    return plan


def _as_slices(mutator, _binding, planned) -> relax.Expr:
    data, axis, runs, scalar = planned
    emit = mutator.builder_.emit
    data = mutator.visit_expr(data)
    size = static_int(data.ty.shape.values[axis])
    pieces = [
        data if (start, stop) == (0, size) else emit(relax.op.strided_slice(data, [axis], [start], [stop]))
        for start, stop in runs
    ]
    if scalar:  # the one-element slice, its axis squeezed away
        return emit(relax.op.squeeze(pieces[0], [axis]))
    if len(pieces) > 1:
        return emit(relax.op.concat(pieces, axis))
    return pieces[0] if isinstance(pieces[0], relax.Var) else emit(pieces[0])  # the whole axis, in order


def takes_as_slices(func: relax.Function) -> relax.Function:
    """Every take of `func` whose indices are a few runs of consecutive positions -> those slices,
    concatenated (see the module)."""
    return planned_rewrite(func, _plan, _as_slices)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.TakesAsSlices")
class TakesAsSlices:
    """Takes of consecutive runs of positions (torch.roll, constant indexing) as slices that TVM
    fuses with the copies around them, on what stays in TVM (see the module's docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return relax_functions(mod, takes_as_slices)
