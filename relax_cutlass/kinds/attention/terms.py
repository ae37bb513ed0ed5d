"""A position bias added to the scores before a view, with a mask added after it, brought to the form
the attention pattern reads: both terms added where the softmax reads the scores.

BLOOM adds its ALiBi bias (slopes x key positions, (B*N, 1, T)) to the scores in the (B*N, S, T)
frame its baddbmm computes in, reshapes them to (B, N, S, T) and then adds the causal mask. The
attention pattern reads a bias and a causal mask added in one frame, so `hoist_position_terms`
moves the reshape in front of the first add, reshaping the bias alike (its (B*N) axis split into
(B, N), its broadcast axes kept broadcast): the bias stays a (B, N, 1, T) tensor the kernel reads
with stride 0 across the queries, never written out at (B, N, S, T).

torchvision's Swin adds its relative position bias (1, N, S, S) to the scores of every window
(B*nW, N, S, S), views them as (B, nW, N, S, S) to add the shifted windows' mask (1, nW, 1, S, S),
and views them back. Both terms are computed from no input, but no stride pattern reads their sum
in the (B*nW) frame (the mask repeats every nW windows), so `merge_window_terms` adds them into one
bias of the scores' shape (broadcast over B), which TVM computes (or folds into a constant): the
attention then reads one dense (B*nW, N, S, S) bias instead of staying in TVM."""

from __future__ import annotations

import math

from tvm import relax
from tvm.relax.analysis import get_var2val

from ..evaluate import input_free_vars, is_input_free
from ..ir import bound_value, planned_rewrite, static_shape, use_counts
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
    """{the softmax's add var: (index of its mask, the reshape's shape, the scores, the term, the
    term's new shape)} for each softmax(reshape(scores + term) + mask) whose reshape and inner add nothing
    else reads."""
    var2val = get_var2val(func)
    uses = use_counts(func)
    planned = {}
    for _, x, add in softmax_adds(var2val):
        for index in (1, 0):
            viewed, mask = add.args[1 - index], add.args[index]
            reshape = bound_value(viewed, var2val)
            if not is_op_call(reshape, "relax.reshape") or is_matmul_result(mask, var2val):
                continue
            inner = bound_value(reshape.args[0], var2val)
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


def _plan_window_terms(func: relax.Function) -> dict:
    """{the view back's var: (the scores, the first term, its shape in the window frame, the window
    frame's shape, the second term, its index in its add)} for each softmax([astype]
    reshape(reshape(scores + term) + term2)) whose terms are computed from no input, whose views go
    from the scores' shape and back, and whose inner values nothing else reads."""
    var2val = get_var2val(func)
    uses = use_counts(func)
    free = input_free_vars(func)
    planned = {}
    for softmax in var2val.values():
        if not is_op_call(softmax, "relax.nn.softmax"):
            continue
        back_var = softmax.args[0]
        if is_op_call(bound_value(back_var, var2val), "relax.astype"):
            back_var = bound_value(back_var, var2val).args[0]
        back = bound_value(back_var, var2val)
        if not is_op_call(back, "relax.reshape") or uses.get(back_var) != 1:
            continue
        outer = bound_value(back.args[0], var2val)
        if not is_op_call(outer, "relax.add") or uses.get(back.args[0]) != 1:
            continue
        for index in (1, 0):
            view_var, term2 = outer.args[1 - index], outer.args[index]
            view = bound_value(view_var, var2val)
            if not is_op_call(view, "relax.reshape") or uses.get(view_var) != 1 or not is_input_free(term2, free):
                continue
            inner = bound_value(view.args[0], var2val)
            if not is_op_call(inner, "relax.add") or uses.get(view.args[0]) != 1:
                continue
            scores = [is_matmul_result(arg, var2val) for arg in inner.args]
            if scores.count(True) != 1 or not is_input_free(inner.args[scores.index(False)], free):
                continue
            score, term = inner.args[scores.index(True)], inner.args[scores.index(False)]
            src, mid = static_shape(inner), static_shape(view)
            if src is None or mid is None or static_shape(back) != src or static_shape(score) != src:
                continue
            if len({str(e.ty.dtype) for e in (score, term, term2, outer)}) != 1:
                continue
            term_dims = static_shape(term)
            shape = None if term_dims is None else reshaped_broadcast(term_dims, src, mid)
            if shape is not None and static_shape(outer) == mid:
                planned[back_var] = (score, term, shape, mid, term2, index)
                break
    return planned


def _merged(mutator, binding, planned) -> relax.Expr:
    score, term, shape, mid, term2, index = planned
    emit = mutator.builder_.emit
    src = static_shape(binding.var)
    terms = [emit(relax.op.reshape(mutator.visit_expr(term), shape)), mutator.visit_expr(term2)]
    summed = emit(relax.op.add(*(terms if index == 1 else terms[::-1])))
    bias = emit(relax.op.reshape(emit(relax.op.broadcast_to(summed, mid)), src))
    return emit(relax.op.add(mutator.visit_expr(score), bias))


def merge_window_terms(func: relax.Function) -> relax.Function:
    """softmax(reshape(reshape(scores + term) + term2)), both terms computed from no input and the
    reshapes a view and its inverse (Swin's windows) -> softmax(scores + bias), bias = the two
    terms added in the window frame, broadcast to it and viewed in the scores' shape: one term the
    attention pattern reads. The same sums up to the order of the two rounded adds."""
    return planned_rewrite(func, _plan_window_terms, _merged)
