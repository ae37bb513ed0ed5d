"""Causal masks the model computes from no input (or holds as a constant), recognized at build time.

Hugging Face's decoders hand their attention a float mask built from `arange`s (cumsum,
index_tensor, comparisons, then where(keep, 0, -inf) or finfo.min); FoldConstant leaves it, so the
attention would read it as a (1, 1, S, T) additive bias on the SM80 kernel and TVM would rebuild it
on every inference. `constant_causal_masks` evaluates such a mask once on the CPU and, where it
is causal, replaces it with the canonical form `triu(-inf broadcast to (S, T), k)` that the attention
pattern takes as a causal mask: the region then runs the kernels' own causal masking (SM90
included), with no mask tensor at all. The decision is made on the values, so a mask that is
causal only in form (a padding mask folded in, a sliding window) is left as it was. An imported
ONNX graph holds such a mask as a constant (from_onnx folds the subgraph that builds it): the same
decision on its values.

A mask that is zero everywhere (Hugging Face's BERT without an attention_mask builds one from
`arange(S) >= 0`) masks nothing: the add goes, and the region runs with no mask at all (so on the
SM90 kernel, which takes no additive bias).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val

from ..evaluate import evaluate_input_free, input_free_vars, is_input_free
from ..ir import bound_value, planned_rewrite, static_shape
from .masks import SWAMPING_MASK
from .trace import is_op_call, softmax_adds


def causal_offset(mask: np.ndarray, rows: int, keys: int, float32_add: bool) -> int | None:
    """d when `mask` (broadcast to (..., rows, keys)) is the additive causal mask under which query
    i sees exactly keys j <= i + d: 0 on those, -inf (or, added in float32, a value that swamps
    every score, <= SWAMPING_MASK) elsewhere, alike for every batch and head. d is 0 (TVM's
    TopLeft) or keys - rows (BottomRight); None for any other mask."""
    if mask.ndim < 2 or mask.shape[-2:] != (rows, keys) or keys < rows:
        return None
    planes = mask.reshape(-1, rows, keys)
    first = planes[0]
    if not all(np.array_equal(first, p) for p in planes[1:]):
        return None
    seen = first == 0
    hidden = np.isneginf(first) | (float32_add & np.isfinite(first) & (first <= SWAMPING_MASK))
    if not (seen | hidden).all():
        return None
    i, j = np.indices((rows, keys))
    for offset in dict.fromkeys((0, keys - rows)):
        if np.array_equal(seen, j <= i + offset):
            return offset
    return None


def causal_mask_expr(rows: int, keys: int, offset: int, dtype: str) -> relax.Expr:
    """The canonical causal mask the attention pattern matches: -inf above diagonal `offset`.
    (A broadcast scalar, not R.full: TVM 0.27's legalization of full fails on its dtype.)"""
    filled = relax.op.broadcast_to(relax.const(-np.inf, dtype), relax.ShapeExpr([rows, keys]))
    return relax.op.triu(filled, offset + 1)


def _is_canonical(expr, var2val) -> bool:
    value = var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr
    return is_op_call(value, "relax.triu")


def _plan(func: relax.Function) -> dict:
    """{add var: (index of the mask argument, (rows, keys, offset, dtype)), or None for a mask
    of zeros that the add can drop} for each additive mask in front of a softmax that is
    input-free and causal or zero."""
    var2val = get_var2val(func)
    free = input_free_vars(func)
    planned, known = {}, {}
    for value in var2val.values():
        if not is_op_call(value, "relax.nn.softmax") or not isinstance(value.args[0], relax.Var):
            continue
        x = value.args[0]
        add = var2val.get(x)
        if is_op_call(add, "relax.astype") and isinstance(add.args[0], relax.Var):
            x, add = add.args[0], var2val.get(add.args[0])
        if not is_op_call(add, "relax.add") or static_shape(add) is None or len(static_shape(add)) < 2:
            continue
        # an input-free binding, or a constant (an imported graph's mask, folded already)
        is_free = [is_input_free(arg, free) for arg in add.args]
        if is_free.count(True) != 1:
            continue
        index = is_free.index(True)
        mask = add.args[index]
        if _is_canonical(mask, var2val):
            continue
        if mask not in known:
            constant = isinstance(mask, tvm.ir.GenericConst)
            known[mask] = mask.value.numpy() if constant else evaluate_input_free(func, mask, free)
        values = known[mask]
        rows, keys = static_shape(add)[-2:]
        dtype = str(add.ty.dtype)
        if values is None or values.dtype.kind != "f":
            continue
        scores = add.args[1 - index]
        if not values.any() and _same_type(scores, add):
            planned[x] = (index, None)
            continue
        offset = causal_offset(values.astype("float32"), rows, keys, float32_add=dtype == "float32")
        if offset is not None:
            planned[x] = (index, (rows, keys, offset, dtype))
    return planned


def _same_type(a: relax.Expr, b: relax.Expr) -> bool:
    """Same static shape and dtype: the add leaves `a` as it is (no broadcast, no promotion)."""
    shape = static_shape(a)
    return shape is not None and shape == static_shape(b) and str(a.ty.dtype) == str(b.ty.dtype)


def _canonical_mask(mutator, binding, planned) -> relax.Expr:
    """Each attention gets a mask of its own: one shared by every layer would be an intermediate
    value read outside each region, which no region may have (and inside one it costs nothing)."""
    index, key = planned
    if key is None:  # a mask of zeros: the scores as they are
        return mutator.visit_expr(binding.value.args[1 - index])
    mask = mutator.builder_.emit(causal_mask_expr(*key))
    args = [mutator.visit_expr(a) for a in binding.value.args]
    args[index] = mask
    return mutator.builder_.emit(relax.op.add(*args))


def constant_causal_masks(func: relax.Function) -> relax.Function:
    """softmax(scores + mask), with `mask` computed from no input and causal in value, -> the same
    with the canonical causal mask (`causal_mask_expr`) in its place; zero in value -> softmax(scores).
    The old mask's bindings go once nothing else reads them."""
    return planned_rewrite(func, _plan, _canonical_mask)


_AND_OPS = ("relax.bitwise_and", "relax.logical_and")


def _causal_and_padding(cond, var2val, free) -> tuple[relax.Expr, relax.Expr] | None:
    """(the input-free part, the other part) of a boolean `cond` = and(causal, padding) (through a
    broadcast_to), the other part read once per key (size 1 on the query axis); None otherwise."""
    value = bound_value(cond, var2val)
    if is_op_call(value, "relax.broadcast_to"):
        return _causal_and_padding(value.args[0], var2val, free)
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _AND_OPS):
        return None
    is_free = [isinstance(a, relax.Var) and a in free for a in value.args]
    if is_free.count(True) != 1:
        return None
    causal, padding = value.args[is_free.index(True)], value.args[is_free.index(False)]
    dims = static_shape(padding)
    if dims is None or len(dims) < 2 or dims[-2] != 1:
        return None
    return causal, padding


def _plan_split(func: relax.Function) -> dict:
    """{softmax's add var: (index of the mask, the padding part, (rows, keys, offset, dtype))} for
    each softmax(scores + where(and(causal, padding), 0, -inf)) whose causal part is computed from
    no input and causal in value."""
    var2val = get_var2val(func)
    free = input_free_vars(func)
    planned = {}
    for _, x, add in softmax_adds(var2val):
        if static_shape(add) is None or len(static_shape(add)) < 2:
            continue
        for index in (1, 0):
            where, casts = _under_casts(add.args[index], var2val)
            if not is_op_call(where, "relax.where"):
                continue
            kept, masked = (a.value.numpy() if isinstance(a, tvm.ir.GenericConst) else None for a in where.args[1:])
            if kept is None or masked is None or kept.size != 1 or masked.size != 1:
                continue
            if kept.reshape(-1)[0] != 0 or not np.isneginf(masked.reshape(-1)[0]):
                continue
            parts = _causal_and_padding(where.args[0], var2val, free)
            if parts is None:
                continue
            values = evaluate_input_free(func, parts[0], free)
            rows, keys = static_shape(add)[-2:]
            if values is None or values.dtype != np.bool_:
                continue
            additive = np.where(values, np.float32(0), np.float32(-np.inf))
            offset = causal_offset(additive, rows, keys, float32_add=False)
            if offset is not None:
                mask_dtype = str(where.ty.dtype)
                planned[x] = (index, parts[1], mask_dtype, casts, (rows, keys, offset, str(add.ty.dtype)))
                break
    return planned


def _under_casts(expr, var2val) -> tuple[relax.Expr | None, list[str]]:
    """(the value under `expr`'s chain of astypes, the chain's dtypes, innermost first): a mask
    `cast_attention_masks` cast to the scores' type and back to float32."""
    casts: list[str] = []
    value = bound_value(expr, var2val)
    while is_op_call(value, "relax.astype"):
        casts.insert(0, str(value.attrs.dtype))
        value = bound_value(value.args[0], var2val)
    return value, casts


def _split(mutator, binding, planned) -> relax.Expr:
    index, padding, mask_dtype, casts, causal = planned
    emit = mutator.builder_.emit
    kept, masked = relax.const(0.0, mask_dtype), relax.const(-np.inf, mask_dtype)
    padded = emit(relax.op.where(mutator.visit_expr(padding), kept, masked))
    for dtype in casts:  # the mask's casts, as they were
        padded = emit(relax.op.astype(padded, dtype))
    scores = mutator.visit_expr(binding.value.args[1 - index])
    return emit(relax.op.add(emit(relax.op.add(scores, padded)), emit(causal_mask_expr(*causal))))


def split_padding_from_causal_masks(func: relax.Function) -> relax.Function:
    """softmax(scores + where(and(causal, padding), 0, -inf)) -> softmax((scores + where(padding, 0,
    -inf)) + canonical causal mask), where the causal part is computed from no input and causal in
    value and the padding part is one row of keys per sequence (transformers' mask of a padded
    decoder batch: causal and the attention_mask in one boolean (B, 1, S, T); its sdpa form, or
    its eager finfo.min form as `cast_attention_masks` leaves it in float16: -inf and a tail that
    keeps a fully masked row's mean), the mask's casts kept. The same values: a key masked by
    either is -inf either way. The region then reads a (B, 1, 1, T) bias and masks
    causally in the kernel (which skips the hidden tiles), instead of reading a (B, 1, S, T) one."""
    return planned_rewrite(func, _plan_split, _split)
