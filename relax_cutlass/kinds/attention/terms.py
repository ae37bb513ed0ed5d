"""A position bias added to the scores before a view, with a mask added after it, brought to the form
the attention pattern reads: both terms added where the softmax reads the scores.

BLOOM adds its ALiBi bias (slopes x key positions, (B*N, 1, T)) to the scores in the (B*N, S, T)
frame its baddbmm computes in, reshapes them to (B, N, S, T) and then adds the causal mask. The
attention pattern reads a bias and a causal mask added in one frame, so `hoist_position_terms`
moves the reshape in front of the first add, reshaping the bias alike (its (B*N) axis split into
(B, N), its broadcast axes kept broadcast): the bias stays a (B, N, 1, T) tensor the kernel reads
with stride 0 across the queries, never written out at (B, N, S, T)."""

from __future__ import annotations

import math

from tvm import relax
from tvm.relax.analysis import get_var2val

from ..ir import planned_rewrite, static_shape, use_counts
from .masks import is_matmul_result
from .trace import is_op_call, softmax_adds


def reshape_groups(src: list[int], dst: list[int]) -> list[tuple[range, range]] | None:
    """A reshape from `src` to `dst` as consecutive groups of axes whose sizes multiply alike (an
    axis kept, split or merged), each (its `src` axes, its `dst` axes); None where no such grouping
    exists. Trailing unit axes join the last group."""
    if 0 in src or 0 in dst or math.prod(src) != math.prod(dst):
        return None
    groups, i, j = [], 0, 0
    while i < len(src) and j < len(dst):
        i0, j0 = i, j
        a, b = src[i], dst[j]
        i, j = i + 1, j + 1
        while a != b:
            if a < b:
                a, i = a * src[i], i + 1
            else:
                b, j = b * dst[j], j + 1
        groups.append((range(i0, i), range(j0, j)))
    if groups and (i < len(src) or j < len(dst)):  # unit axes left on one side
        last_src, last_dst = groups[-1]
        groups[-1] = (range(last_src.start, len(src)), range(last_dst.start, len(dst)))
    return groups


def reshaped_broadcast(term: list[int], src: list[int], dst: list[int]) -> list[int] | None:
    """The shape of `term` (broadcast to `src`, right-aligned) reshaped as `src` is to `dst`: each
    group of axes taken whole where the term has them whole, kept of size 1 where the term
    broadcasts them all; None where a group is partly broadcast (the term would have to be written
    out at full size first)."""
    groups = reshape_groups(src, dst)
    if groups is None or len(term) > len(src):
        return None
    padded = [1] * (len(src) - len(term)) + list(term)
    shape: list[int] = []
    for src_axes, dst_axes in groups:
        if all(padded[k] == src[k] for k in src_axes):
            shape += [dst[k] for k in dst_axes]
        elif all(padded[k] == 1 for k in src_axes):
            shape += [1] * len(dst_axes)
        else:
            return None
    return shape


def _plan(func: relax.Function) -> dict:
    """{the softmax's add var: (index of its mask, the reshape, the scores, the term, the term's new
    shape)} for each softmax(reshape(scores + term) + mask) whose reshape and inner add nothing
    else reads."""
    var2val = get_var2val(func)
    uses = use_counts(func)
    planned = {}
    for _, x, add in softmax_adds(var2val):
        for index in (1, 0):
            viewed, mask = add.args[1 - index], add.args[index]
            reshape = var2val.get(viewed) if isinstance(viewed, relax.Var) else None
            if not is_op_call(reshape, "relax.reshape") or is_matmul_result(mask, var2val):
                continue
            inner = var2val.get(reshape.args[0]) if isinstance(reshape.args[0], relax.Var) else None
            if not is_op_call(inner, "relax.add") or uses.get(viewed) != 1 or uses.get(reshape.args[0]) != 1:
                continue
            scores = [is_matmul_result(arg, var2val) for arg in inner.args]
            if scores.count(True) != 1:
                continue
            score, term = inner.args[scores.index(True)], inner.args[scores.index(False)]
            src, dst, term_dims = static_shape(inner), static_shape(reshape), static_shape(term)
            if src is None or dst is None or term_dims is None or static_shape(score) != src:
                continue
            shape = reshaped_broadcast(term_dims, src, dst)
            if shape is not None:
                planned[x] = (index, dst, score, term, shape)
                break
    return planned


def _hoisted(mutator, binding, planned) -> relax.Expr:
    index, dst, score, term, shape = planned
    emit = mutator.builder_.emit
    scores = emit(relax.op.reshape(mutator.visit_expr(score), dst))
    biased = emit(relax.op.add(scores, emit(relax.op.reshape(mutator.visit_expr(term), shape))))
    args = [biased, mutator.visit_expr(binding.value.args[index])]
    return emit(relax.op.add(*(args if index == 1 else args[::-1])))


def hoist_position_terms(func: relax.Function) -> relax.Function:
    """softmax(reshape(scores + term) + mask) -> softmax((reshape(scores) + reshape'(term)) + mask),
    where the term's reshape' keeps its broadcast axes (`reshaped_broadcast`); other graphs as they
    are. The same values in the same float32 adds, in the same order."""
    return planned_rewrite(func, _plan, _hoisted)
