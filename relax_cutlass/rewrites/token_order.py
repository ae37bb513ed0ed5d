"""Transposes of the token axes that row-wise kernels make unnecessary.

torch's nn.MultiheadAttention is sequence-first: with batch_first=True (torchvision's ViT) it
transposes its (B, S, E) input to (S, B, E) before the in-projection and the attention's
(B, S, N, V) result back to (S, B, ...) before the out-projection, whose (S, B, E) output it
transposes to (B, S, E) again. A GEMM with a bias (a layer norm too) computes each row of
features on its own, so the order of its rows is the caller's choice: ViT-B/16 at batch 8 spent
0.15 of its 1.33 ms on the H200 in three such transposes per layer.

- `SinkTokenPermutes` (before partitioning): a row-wise op (a matmul by a 2-D weight, then an add
  of a per-feature bias) of a permute_dims that keeps the feature axis last is that op of the
  unpermuted tensor, permuted. The permute then sits between the in-projection and the views that
  take q, k and v out of it, which the attention kernel reads in place (kinds/attention/packed.py),
  or meets the model's own permute back, and views that leave the elements in order become one
  reshape.
- `CancelRowPermutations` (after codegen, on the offloaded calls): a row-wise region (a GEMM or a
  layer norm reading no other row-indexed tensor) whose input's rows are the rows of a tensor A in
  a permuted order, and whose output's only reader is a chain of views that puts the rows back in
  A's order, reads A's rows as they are; the views on both sides become reshapes (no copies).
  Checked on index arrays: exactly the views that only move whole rows qualify.

Both move values only: exact. Offloaded functions are left alone.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val
from tvm.relax.dpl import is_op, wildcard

from ..kinds.ir import (
    is_call,
    json_attr,
    planned_rewrite,
    rewrite_call_weights_hidden,
    static_shape,
    use_counts,
    view_of_index,
)
from .canonicalize import relax_functions
from .permutes import collapse_view_chains

# Ops that only rearrange their first argument (a broadcast_to only where it is a no-op).
_VIEW_OPS = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze", "relax.broadcast_to")

# Offloaded ops whose regions compute each row of their first argument's features on their own,
# as long as no other argument is indexed by row (a residual).
ROW_WISE_OPS = ("matmul", "norm")

# Beyond this many elements the index arrays are not built (2**26, as kinds.evaluate).
_MAX_ELEMENTS = 1 << 26


# ---------------------------------------------------------------------------------------------
# Before partitioning: a permute of the token axes moved past the in-projection
# ---------------------------------------------------------------------------------------------


def _keeps_last_axis(call: relax.Call) -> bool:
    axes = call.attrs.axes
    rank = len(call.ty.shape.values) if call.ty.shape is not None else None
    return axes is not None and rank is not None and int(axes[-1]) == rank - 1


def _per_feature(operand: relax.Expr, features) -> bool:
    """`operand` broadcasts along every axis but the last, which holds `features` elements."""
    shape = static_shape(operand)
    return shape is not None and all(d == 1 for d in shape[:-1]) and (not shape or shape[-1] in (1, features))


def sink_token_permutes(func: relax.Function) -> relax.Function:
    """matmul(permute_dims(x, p), W) [+ b] -> permute_dims(matmul(x, W) [+ b], p), p keeping the last
    axis, W 2-D, b per feature; a no-op broadcast_to between permute and matmul is dropped."""
    x, weight = wildcard(), wildcard()
    permuted = is_op("relax.permute_dims")(x)
    operand = is_op("relax.broadcast_to")(permuted, wildcard()) | permuted
    product = is_op("relax.matmul")(operand, weight)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        permute = m[permuted]
        if not isinstance(m[weight].ty, relax.TensorType) or m[weight].ty.ndim != 2 or not _keeps_last_axis(permute):
            return orig
        if static_shape(m[operand]) != static_shape(permute) or static_shape(permute) is None:
            return orig  # a broadcast_to that repeats data
        return relax.op.permute_dims(
            relax.Call(orig.op, [m[x], m[weight]], orig.attrs, orig.ty_args), permute.attrs.axes
        )

    func = rewrite_call_weights_hidden(product, rewriter, func)

    y, bias = wildcard(), wildcard()
    moved = is_op("relax.permute_dims")(is_op("relax.matmul")(y, wildcard()))
    biased = is_op("relax.add")(moved, bias) | is_op("relax.add")(bias, moved)

    def bias_rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        permute = m[moved]
        shape = static_shape(permute)
        if shape is None or not _keeps_last_axis(permute) or not _per_feature(m[bias], shape[-1]):
            return orig
        if static_shape(orig) != shape:
            return orig
        return relax.op.permute_dims(relax.op.add(permute.args[0], m[bias]), permute.attrs.axes)

    return rewrite_call_weights_hidden(biased, bias_rewriter, func)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.SinkTokenPermutes")
class SinkTokenPermutes:
    """A permute of the token axes before an in-projection moved after it, then every chain of
    views that leaves the elements in order one reshape (see the module)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return relax_functions(mod, lambda f: collapse_view_chains(sink_token_permutes(f)))


# ---------------------------------------------------------------------------------------------
# After codegen: row permutations on both sides of a row-wise region cancelled
# ---------------------------------------------------------------------------------------------


def _is_view(value) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _VIEW_OPS


def _row_order(rows: np.ndarray) -> np.ndarray | None:
    """For an index array viewed as (M, E) rows of another tensor's elements: which of that
    tensor's rows (read as (M, E)) each row is, or None where a row is not a whole one."""
    width = rows.shape[1]
    first = rows[:, 0]
    if np.any(first % width) or not np.array_equal(rows, first[:, None] + np.arange(width)):
        return None
    return first // width


def _source_rows(x: relax.Var, var2val, width: int) -> list[tuple[relax.Expr, np.ndarray]]:
    """[(A, order), ...]: the tensors `x` is a view of, furthest first, whose rows of `width`
    features are x's rows in the (non-identity) order `order`."""
    chain, expr = [], x
    while isinstance(expr, relax.Var) and _is_view(var2val.get(expr)):
        chain.append(var2val[expr])
        expr = var2val[expr].args[0]
    found = []
    for depth in range(len(chain), 0, -1):
        source = chain[depth - 1].args[0]
        shape = static_shape(source)
        if shape is None or not 0 < math.prod(shape) <= _MAX_ELEMENTS or math.prod(shape) % width:
            continue
        index = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
        for call in reversed(chain[:depth]):
            index = view_of_index(index, call) if index is not None else None
        order = None if index is None else _row_order(index.reshape(-1, width))
        if order is not None and not np.array_equal(order, np.arange(order.size)):
            found.append((source, order))
    return found


def _restoring_view(y: relax.Var, var2val, consumers, uses, order: np.ndarray) -> relax.Var | None:
    """The first var of the chain of single-use views reading `y` whose rows are y's put back in
    the order before `order` (row i of it is y's row with order == i), or None."""
    shape = static_shape(y)
    width = shape[-1]
    index = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    expr = y
    while uses.get(expr, 0) == 1 and expr in consumers:
        var = consumers[expr]
        index = view_of_index(index, var2val[var])
        if index is None:
            return None
        rows = _row_order(index.reshape(-1, width))
        if rows is not None and np.array_equal(order[rows], np.arange(rows.size)):
            return var
        expr = var
    return None


def _row_wise_symbols(mod: tvm.IRModule) -> set[str]:
    regions = json_attr(mod, "relax_cutlass.regions", [])
    return {r["symbol"] for r in regions if r.get("op") in ROW_WISE_OPS and len(r.get("outputs", {"out": 0})) == 1}


def _region_call(value) -> tuple[str, list] | None:
    """(symbol, arguments) of an offloaded call (call_dps_packed of an extern)."""
    if not is_call(value, "relax.call_dps_packed"):
        return None
    callee, args = value.args[0], value.args[1]
    if not isinstance(callee, relax.ExternFunc) or not isinstance(args, relax.Tuple):
        return None
    return str(callee.global_symbol), list(args.fields)


def _plan(func: relax.Function, symbols: set[str]) -> dict:
    var2val = get_var2val(func)
    uses = use_counts(func)
    consumers = {}
    for var, value in var2val.items():
        if _is_view(value) and isinstance(value.args[0], relax.Var):
            consumers.setdefault(value.args[0], var)
    plan = {}
    for var, value in var2val.items():
        call = _region_call(value)
        if call is None or call[0] not in symbols or not isinstance(var.ty, relax.TensorType):
            continue
        x, *others = call[1]
        x_shape, y_shape = static_shape(x), static_shape(var)
        if x_shape is None or y_shape is None or x_shape[:-1] != y_shape[:-1] or not isinstance(x, relax.Var):
            continue
        rows = math.prod(x_shape[:-1])
        # no other argument indexed by row (weights, biases, norm scales only)
        if any(static_shape(o) is None or (len(static_shape(o)) >= 2 and static_shape(o)[0] == rows) for o in others):
            continue
        if any(len(static_shape(o)) > 2 for o in others):
            continue
        for source, order in _source_rows(x, var2val, x_shape[-1]):
            restored = _restoring_view(var, var2val, consumers, uses, order)
            if restored is not None:
                plan[var] = (source, x_shape)
                plan[restored] = (var, None)
                break
    return plan


def _rewrite(mutator, binding, planned) -> relax.Expr:
    emit = mutator.builder_.emit
    source, shape = planned
    if shape is None:  # the view that restored the rows: a reshape of the region's new output
        return emit(relax.op.reshape(mutator.visit_expr(source), static_shape(binding.var)))
    call = binding.value
    rows = emit(relax.op.reshape(mutator.visit_expr(source), shape))
    args = [rows, *(mutator.visit_expr(a) for a in call.args[1].fields[1:])]
    return emit(relax.Call(call.op, [call.args[0], relax.Tuple(args)], call.attrs, call.ty_args))


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.CancelRowPermutations")
class CancelRowPermutations:
    """Row-wise offloaded regions read their input's rows in the order the views after them
    restore (see the module): the transposes on both sides go."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        symbols = _row_wise_symbols(mod)
        if not symbols:
            return mod

        return relax_functions(mod, lambda f: planned_rewrite(f, lambda g: _plan(g, symbols), _rewrite))
