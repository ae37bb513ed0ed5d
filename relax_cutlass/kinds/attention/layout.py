"""Attention regions: softmax(Q K^T * scale) V as one fused CUTLASS kernel.

Two forms are matched. `R.nn.attention(q, k, v)` (BSNH, no bias or mask), and the decomposed
form frontends produce: two batched matmuls with a softmax between them, each operand reached
through the views that split and move the heads (permute_dims, reshape, a no-op broadcast_to),
optionally with casts around the softmax. The scale is any product of scalar constants applied
to the scores, to q and to k^T (torch's decomposed `scaled_dot_product_attention` scales q and
k^T by sqrt(scale) each). An additive mask / bias may be added to the scores before the softmax
(read by the kernel, broadcast axes with stride 0), and the softmax may end in torch's "safe
softmax" tail, which gives 0 for a row whose every score is -inf. torch.export of a Hugging Face
BERT gives this form, with attn_implementation "eager" and with the default "sdpa".

The views are not fused by shape-guessing: `attention_layout` follows every view op from the
region's q, k and v parameters to the two matmuls, and from the second matmul to the output,
tracking which logical axis (batch B, heads N, query rows S, key rows T, head dims H and V) each
dimension holds. A region is offloaded only when the matmuls contract and batch over exactly the
axes attention needs and the output lands as (B, S, N, V) in memory; the kernel then reads q, k
and v in their own layouts through strides, so the transposes before the matmuls vanish too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .masks import SWAMPING_MASK
from .patterns import VIEW_OPS, AttentionPatternSpec
from .records import BIAS_AXES
from .trace import Layout, NotAttention, Tracer, expr_dims, expr_name, is_one, static_dim

# Roles of the logical axes in the order the kernel's strides use them.
QUERY_AXES, KEY_AXES, VALUE_AXES = ("B", "S", "N", "H"), ("B", "T", "N", "H"), ("B", "T", "N", "V")
OPERAND_AXES = (("query", QUERY_AXES), ("key", KEY_AXES), ("value", VALUE_AXES))


# ---------------------------------------------------------------------------------------------
# Layout tracing
# ---------------------------------------------------------------------------------------------


# How the kernel reads one logical axis of an operand: (dimension of the parameter, element
# factor within that dimension); its stride is the dimension's packed stride times the factor.
AxisRead = tuple[int, int]


# How the kernel reads one axis of the additive bias: as for q/k/v, or None where the bias is
# broadcast along it (stride 0).
BiasRead = AxisRead | None


@dataclass(frozen=True)
class AttentionLayout:
    """What a matched region computes: for q, k and v, how each logical axis is read (in
    QUERY_AXES / KEY_AXES / VALUE_AXES order) and the parameter's rank; sizes; the scale; the
    additive bias's reads (in BIAS_AXES order) and rank, and what a fully masked row gives."""

    query: tuple[AxisRead, AxisRead, AxisRead, AxisRead]
    key: tuple[AxisRead, AxisRead, AxisRead, AxisRead]
    value: tuple[AxisRead, AxisRead, AxisRead, AxisRead]
    ranks: tuple[int, int, int]
    sizes: dict  # logical axis -> PrimExpr
    scale: float
    bias: tuple[BiasRead, BiasRead, BiasRead, BiasRead] | None = None
    bias_rank: int = 0
    masked_rows: str = "nan"
    causal: str | None = None  # relax.nn.attention's causal_mask (AttentionProblem.causal)
    kv_group: int = 1  # query heads per key/value head (AttentionProblem.kv_group)
    slices: tuple = ()  # (role, dim, first, whole) of a sliced parameter dim (AttentionProblem.slices)
    softcap: float | None = None  # c of c * tanh(scale * q.k) (AttentionProblem.softcap)

    @property
    def reads(self) -> tuple:
        """query, key, value reads, in OPERAND_AXES order."""
        return self.query, self.key, self.value


def _operand(
    tracer: Tracer, param, matmul_arg, prefix: str, inner: tuple[str, str], allowed=VIEW_OPS
) -> tuple[list, Layout, list[relax.Call]]:
    """Trace a q/k/v parameter to its matmul operand. -> (the parameter's dims named
    prefix0..3, the operand's layout, the calls between); the operand's last two dims must be
    single axes."""
    names = tuple(f"{prefix}{i}" for i in range(len(expr_dims(param))))
    calls = tracer.chain(matmul_arg, param, allowed)
    layout = tracer.follow(tracer.label(param, names), calls)
    if len(layout) < 2 or any(len(g) > 1 for g in layout[-2:]):
        raise NotAttention(f"the {inner} of the {prefix} operand are not single axes")
    return list(names), layout, calls


def _assign(
    tracer: Tracer, names: list[str], layout: Layout, roles: tuple[str, str], lone: str, what: str
) -> dict[str, str]:
    """Name the operand's axes: its last two dims take `roles`; its batch axes, flattened, are B
    then N (a lone batch axis is `lone`: the other one has size 1). Parameter dims of size 1 left
    over take the roles left over (their strides never matter)."""
    assigned: dict[str, str] = {}
    for group, role in zip(layout[-2:], roles, strict=True):
        if group:
            assigned[group[0]] = role
    batch = [a for group in layout[:-2] for a in group]
    if len(batch) > 2:
        raise NotAttention(f"{what} batches over {len(batch)} axes; attention has batch and heads")
    assigned |= dict(zip(batch, ("B", "N") if len(batch) == 2 else (lone,), strict=False))
    free = [r for r in ("B", "N", *roles) if r not in assigned.values()]
    for root in names:
        leaves = tracer.leaves(root)
        if any(leaf in assigned for leaf in leaves):
            continue
        if not free or not is_one(tracer.sizes[root]):
            raise NotAttention(f"{what} has a dimension that is none of batch, heads, rows, head dim")
        assigned[root] = free.pop(0)
    return assigned


def _reads(tracer: Tracer, names: list[str], assigned: dict[str, str], order: tuple[str, ...]) -> tuple:
    by_role = {role: axis for axis, role in assigned.items()}
    missing = [role for role in order if role not in by_role]
    if missing:  # e.g. grouped-query keys/values, whose heads repeat through a broadcast
        raise NotAttention(f"no axis of the operand holds the kernel's {', '.join(missing)} (read {dict(assigned)})")
    return tuple(tracer.read(names, by_role[role]) for role in order)


def attention_layout(spec: AttentionPatternSpec, ann: dict, out: relax.Expr, var2val) -> AttentionLayout:
    """Check that the matched region is softmax(q k^T * scale) v over (B, N) and return its
    layout. Raises ValueError (with the reason) when it is not, or not in a form the kernel runs."""
    try:
        if spec.form in ("op", "op_bias"):
            return _op_layout(ann, out, var2val)
        return _softmax_layout(ann, out, var2val, grouped=spec.form == "softmax_gqa")
    except NotAttention as err:
        raise ValueError(str(err)) from None


def _op_layout(ann: dict, out: relax.Expr, _var2val) -> AttentionLayout:
    call = ann["root"]
    attrs = call.attrs
    if attrs.causal_mask not in (None, "TopLeft", "BottomRight"):
        raise NotAttention(f"causal_mask={attrs.causal_mask!r} is none of TVM's TopLeft / BottomRight")
    if getattr(attrs, "window_size", None) is not None:
        raise NotAttention("sliding-window attention is not fused")
    tracer = Tracer({}, {})
    for role, axes in OPERAND_AXES:
        tracer.label(ann[role], axes)
    sizes = tracer.sizes
    head_dim = sizes["H"]
    if not isinstance(head_dim, tvm.tirx.IntImm):
        raise NotAttention("the head dim must be static")
    scale = float(attrs.scale.value) if attrs.scale is not None else 1.0 / math.sqrt(int(head_dim))
    whole = ((0, 1), (1, 1), (2, 1), (3, 1))
    causal = None if attrs.causal_mask is None else str(attrs.causal_mask)
    bias, bias_rank = _op_bias_reads(tracer, ann["bias"]) if "bias" in ann else (None, 0)
    # relax.nn.attention_bias has no safe-softmax tail: a row whose every score is -inf is NaN
    return AttentionLayout(whole, whole, whole, (4, 4, 4), dict(sizes), scale, bias, bias_rank, causal=causal)


def _op_bias_reads(tracer: Tracer, bias: relax.Expr) -> tuple[tuple, int]:
    """How the kernel reads relax.nn.attention_bias's bias: numpy broadcasting, right-aligned, to
    the scores' (B, N, S, T); a dimension of size 1 is broadcast (stride 0)."""
    dims = expr_dims(bias)  # rank 4: TVM's type inference of relax.nn.attention_bias requires it
    offset = len(BIAS_AXES) - len(dims)
    reads: list = []
    for i, axis in enumerate(BIAS_AXES):
        j = i - offset
        if j < 0 or is_one(dims[j]):
            reads.append(None)
        elif tracer.equal(dims[j], tracer.sizes[axis]):
            reads.append((j, 1))
        else:
            raise NotAttention(f"the bias dim {j} has size {dims[j]}: neither 1 nor the scores' {tracer.sizes[axis]}")
    return tuple(reads), len(dims)


def _scalar_value(const, cast=None) -> float:
    value = const.value.numpy().reshape(-1)
    if value.size != 1:
        raise NotAttention("the scale is not a scalar")
    if cast is not None:
        value = value.astype(str(cast.ty.dtype))
    return float(value[0])


def _softmax_layout(ann: dict, out: relax.Expr, var2val, grouped: bool = False) -> AttentionLayout:
    # A lone batch axis (the other of batch/heads has size 1) is heads or batch: the output's
    # layout tells which, so try both.
    try:
        return _softmax_layout_as(ann, out, var2val, "N", grouped)
    except NotAttention as first_error:
        try:
            return _softmax_layout_as(ann, out, var2val, "B", grouped)
        except NotAttention:
            raise first_error from None


def _kv_heads(tracer: Tracer, layout: Layout, what: str) -> tuple[Layout, str | None, int, tuple | None]:
    """Grouped-query keys/values: the operand's layout without its repeat axis, the axis the repeat
    follows in its dimension (None where it leads it), the group size G (query heads per kv head; 1
    without a repeat) and where the repeat sat ((dimension, position), None without one). Query
    head n reads kv head n // G: the repeat must sit right inside the kv heads in one dimension, as
    transformers' repeat_kv (repeat_interleave) puts it; or, multi-query attention (one kv head:
    Falcon's broadcast of it to every query head), stand where the query's heads stand."""
    found = [(i, pos, a) for i, g in enumerate(layout) for pos, a in enumerate(g) if a in tracer.repeats]
    if not found:
        return layout, None, 1, None
    if len(found) > 1:
        raise NotAttention(f"the {what} repeats along {len(found)} axes; grouped-query attention repeats one")
    i, pos, axis = found[0]
    group = layout[i]
    if i >= len(layout) - 2 or pos != len(group) - 1:
        raise NotAttention(
            f"the {what}'s repeat is not right inside its heads in one dimension (grouped-query attention as "
            "repeat_interleave: query head n reads kv head n // G); a repeat of all heads (torch's repeat) is "
            "left to TVM"
        )
    before = group[pos - 1] if pos else None
    return (*layout[:i], group[:-1], *layout[i + 1 :]), before, tracer.repeats[axis], (i, pos)


def _batch_roles(layout: Layout, roles: dict[str, str], repeat: tuple | None = None) -> tuple:
    """The roles of the operand's batch dimensions; a multi-query repeat (`repeat`: where it sat)
    counts as the heads it serves."""
    batch = [[roles[a] for a in g] for g in layout[:-2]]
    if repeat is not None:
        batch[repeat[0]].insert(repeat[1], "N")
    return tuple(tuple(g) for g in batch)


def _multi_query(tracer: Tracer, roles: dict[str, str], heads: str | None, where: tuple | None) -> tuple | None:
    """Where the repeat of a single kv head sat (multi-query attention), None for grouped-query
    attention (the repeat follows the kv-head axis) or no repeat. The kv operand's heads are then a
    unit dimension (read at head 0 only: its stride never matters)."""
    if where is None or (heads is not None and roles.get(heads) == "N"):
        return None
    unit_heads = [a for a, role in roles.items() if role == "N"]
    if not unit_heads or not all(is_one(tracer.sizes[a]) for a in unit_heads):
        raise NotAttention("the repeated axis of the keys/values is not their heads")
    return where


def _softmax_layout_as(ann: dict, out: relax.Expr, var2val, lone: str, grouped: bool = False) -> AttentionLayout:
    tracer = Tracer(var2val, {}, tuple(ann[name] for name in ("bias", "causal_mask") if name in ann))
    first, second = ann["root"], ann["second"]
    # q and k^T may be scaled, in float32 between casts where the scale is no power of two
    # q, k and v may each be a strided_slice of one packed projection (`packed_projection_slices`)
    scaled = (*VIEW_OPS, "relax.multiply", "relax.divide", "relax.astype", "relax.strided_slice")
    q_names, q_op, q_calls = _operand(tracer, ann["query"], first.args[0], "q", ("rows", "head dim"), scaled)
    # grouped-query keys and values: repeat_kv's expand_dims and repeating broadcast_to (a
    # multi-query one, of the single kv head, is a broadcast among the operand views themselves)
    tracer.repeats_allowed = True
    repeat = ("relax.expand_dims",) if grouped else ()
    k_names, k_op, k_calls = _operand(tracer, ann["key"], first.args[1], "k", ("head dim", "rows"), (*scaled, *repeat))
    v_views = (*VIEW_OPS, "relax.strided_slice", *repeat)
    v_names, v_op, _ = _operand(tracer, ann["value"], second.args[1], "v", ("rows", "head dim"), v_views)
    tracer.repeats_allowed = False
    k_op, k_heads, group, k_where = _kv_heads(tracer, k_op, "key")
    v_op, v_heads, v_group, v_where = _kv_heads(tracer, v_op, "value")
    if group != v_group or (grouped and group == 1):
        raise NotAttention("the keys and values are not repeated alike across the query heads")
    q_role = _assign(tracer, q_names, q_op, ("S", "H"), lone, "the query")
    k_role = _assign(tracer, k_names, k_op, ("H", "T"), lone, "the key")
    v_role = _assign(tracer, v_names, v_op, ("T", "V"), lone, "the value")
    k_where = _multi_query(tracer, k_role, k_heads, k_where)
    v_where = _multi_query(tracer, v_role, v_heads, v_where)
    if (k_where is None) != (v_where is None):
        raise NotAttention("the keys and values are not repeated alike across the query heads")
    sizes: dict[str, tvm.tirx.PrimExpr] = {}
    for roles, what in ((q_role, "query"), (k_role, "key"), (v_role, "value")):
        for axis, role in roles.items():
            size = tracer.sizes[axis]
            if role == "N" and what != "query":
                size = size * group  # the query heads the kv heads serve
            if role in sizes and not tracer.equal(sizes[role], size):
                raise NotAttention(f"the {what}'s {role} size {size} differs from {sizes[role]}")
            sizes.setdefault(role, size)
    # Both operands of each matmul must batch over the same (B, N) grouping.
    q_batch = _batch_roles(q_op, q_role)
    for layout, roles, where, what in ((k_op, k_role, k_where, "key"), (v_op, v_role, v_where, "value")):
        if _batch_roles(layout, roles, where) != q_batch:
            raise NotAttention(f"the {what} operand is not batched like the query")
    tracer.sizes |= sizes
    kept = tuple(a for a in ("S", "T", "V") if not is_one(sizes[a]))

    def rows(role: str) -> tuple[str, ...]:
        return (role,) if role in kept else ()

    # From the scores to the probabilities: views, casts, the scale, the bias, the softmax and
    # its safe tail only.
    score_layout = (*q_batch, rows("S"), rows("T"))
    allowed = (*VIEW_OPS, "relax.astype", "relax.multiply", "relax.divide", "relax.add", "relax.nn.softmax")
    calls = tracer.chain(second.args[0], first, (*allowed, "relax.where", "relax.tanh"))
    score_calls, softcap = _soft_cap(tracer, ann, calls)
    layout = score_layout
    bias, bias_rank, causal = None, 0, None
    for call in calls:
        if call.same_as(ann["softmax"]):
            axis = int(call.attrs.axis)
            if axis not in (-1, len(layout) - 1) or layout[-1] != rows("T"):
                raise NotAttention(f"softmax over axis {axis} is not over the keys")
        if "bias_add" in ann and call.same_as(ann["bias_add"]):
            if "bias" in ann:
                bias, bias_rank = _bias_reads(tracer, ann["bias"], layout, call)
            else:
                causal = _causal(tracer, ann, layout, (rows("S"), rows("T")), call)
        if "causal_add" in ann and call.same_as(ann["causal_add"]):  # a causal mask beside the bias
            causal = _causal(tracer, ann, layout, (rows("S"), rows("T")), call)
        layout = tracer.apply(layout, call)
    if layout != score_layout:
        raise NotAttention("the probabilities reach the second matmul in another layout than the scores")
    # The output: (B, S, N, V) in memory, however it is grouped.
    masked_rows = _masked_rows(ann, sizes)
    out_layout = tracer.follow((*q_batch, rows("S"), rows("V")), tracer.chain(out, second, VIEW_OPS))
    order = [a for g in out_layout for a in g]
    want = [a for a in ("B", "S", "N", "V") if not is_one(sizes[a])]
    if order != want:
        raise NotAttention(f"the output is laid out as {''.join(order)}, not BSNV; the kernel writes (B, S, N, V)")
    return AttentionLayout(
        _reads(tracer, q_names, q_role, QUERY_AXES),
        _reads(tracer, k_names, k_role, KEY_AXES),
        _reads(tracer, v_names, v_role, VALUE_AXES),
        (len(q_names), len(k_names), len(v_names)),
        sizes,
        _scale(tracer, [*q_calls, *k_calls, *score_calls]),
        bias,
        bias_rank,
        # Without a bias no score is -inf, and a causal mask leaves every row a key: the
        # (checked) tail never fires.
        masked_rows if bias is not None else "nan",
        causal=causal,
        kv_group=group,
        slices=tuple(
            (role, dim, *tracer.slices[root])
            for role, names in (("query", q_names), ("key", k_names), ("value", v_names))
            for dim, root in enumerate(names)
            if root in tracer.slices
        ),
        softcap=softcap,
    )


def _soft_cap(tracer: Tracer, ann: dict, calls: list[relax.Call]) -> tuple[list[relax.Call], float | None]:
    """(the calls from the scores to the softmax whose scalars make the scale, the soft-cap c or
    None): with soft-capping, c * tanh(s * q.k) with s the product of the scalars before the tanh
    and c of those after it; any mask or bias is added after the cap (a -inf added before the tanh
    would be -1, not a masked key)."""
    if "softcap_tanh" not in ann:
        return calls, None
    at = next(i for i, call in enumerate(calls) if call.same_as(ann["softcap_tanh"]))
    before, after = calls[:at], calls[at + 1 :]
    if any(call.op.name == "relax.add" for call in before):
        raise NotAttention("a mask or bias added to the scores before their soft-capping tanh is not fused")
    return before, _scale(tracer, after)


def _causal(tracer: Tracer, ann: dict, layout: Layout, rows_keys: tuple, add: relax.Call) -> str:
    """TVM's causal mask name for the matched triu(-inf broadcast to (S, T), k) mask: "TopLeft" for
    k = 1 (query i sees keys j <= i), "BottomRight" for k = 1 + T - S (T > S)."""
    triu, fill = ann["causal_triu"], tracer.scalar_const(ann["causal_fill"])
    value = _scalar_value(*fill) if fill is not None else None
    float32_add = str(add.ty.dtype) == "float32"
    if value is None or not (value == -math.inf or (float32_add and math.isfinite(value) and value <= SWAMPING_MASK)):
        raise NotAttention(f"the triu mask's fill {value} is not -inf (or, added in float32, <= {SWAMPING_MASK:g})")
    if tuple(layout[-2:]) != rows_keys:
        raise NotAttention("the triu mask is not added where the scores are (queries, keys)")
    mask_dims, score_dims = expr_dims(triu), expr_dims(tracer.main_arg(add))
    rows, keys = (static_dim(d) for d in score_dims[-2:])
    if rows is None or keys is None or [static_dim(d) for d in mask_dims[-2:]] != [rows, keys]:
        raise NotAttention("a causal triu mask needs static (queries, keys) sizes that are the scores'")
    viewed = [static_dim(d) for d in expr_dims(ann["causal_mask"])[-2:]]
    if not all(is_one(d) for d in mask_dims[:-2]) or viewed != [rows, keys]:
        raise NotAttention("the triu mask's views move its (queries, keys) plane")
    diagonal = static_dim(triu.args[1]) if isinstance(triu.args[1], tvm.tirx.IntImm) else None
    offsets = {0: "TopLeft", keys - rows: "TopLeft" if keys == rows else "BottomRight"}
    if diagonal is None or diagonal - 1 not in offsets or keys < rows:
        raise NotAttention(
            f"a causal mask with diagonal {diagonal} over {rows} queries x {keys} keys is neither TVM's "
            "TopLeft (triu k=1) nor BottomRight (k=1+keys-queries)"
        )
    return offsets[diagonal - 1]


def _scale(tracer: Tracer, calls: list[relax.Call]) -> float:
    """The product of the scalar constants multiplying (or dividing) q, k^T and the scores."""
    scale = 1.0
    for call in calls:
        if call.op.name not in ("relax.multiply", "relax.divide"):
            continue
        main = tracer.main_arg(call)
        other = next(a for a in call.args if not a.same_as(main))
        found = tracer.scalar_const(other)
        if found is None:
            raise NotAttention(f"{call.op.name} by {expr_name(other)}, which is no scalar constant, is not a scale")
        if call.op.name == "relax.divide" and not call.args[0].same_as(main):
            raise NotAttention("a constant divided by the scores is not a scale")
        value = _scalar_value(*found)
        scale = scale / value if call.op.name == "relax.divide" else scale * value
    return scale


def _bias_reads(tracer: Tracer, bias: relax.Expr, layout: Layout, add: relax.Call) -> tuple[tuple, int]:
    """How the kernel reads the additive bias added to scores laid out as `layout`: numpy
    broadcasting, right-aligned; a dimension of size 1 is broadcast (stride 0) over the axes of
    the scores' dimension, one of the scores' size holds them."""
    bias_dims, score_dims = expr_dims(bias), expr_dims(tracer.main_arg(add))
    out_dims = expr_dims(add)
    if len(out_dims) != len(score_dims) or not all(
        tracer.equal(a, b) for a, b in zip(out_dims, score_dims, strict=True)
    ):
        raise NotAttention(f"the mask/bias {[str(d) for d in bias_dims]} broadcasts the scores to a larger shape")
    offset = len(score_dims) - len(bias_dims)
    reads: dict[str, AxisRead] = {}
    for i, group in enumerate(layout):
        j = i - offset
        if j < 0 or is_one(bias_dims[j]) or not group:
            continue
        if not tracer.equal(bias_dims[j], score_dims[i]):
            raise NotAttention(
                f"the mask/bias dim {j} has size {bias_dims[j]}: neither 1 nor the scores' {score_dims[i]}"
            )
        for pos, axis in enumerate(group):
            inner = [static_dim(tracer.sizes[a]) for a in group[pos + 1 :]]
            if None in inner:
                raise NotAttention("the mask/bias merges a symbolic axis with another one in one dimension")
            reads[axis] = (j, math.prod(inner))
    return tuple(reads.get(axis) for axis in BIAS_AXES), len(bias_dims)


def _masked_rows(ann: dict, sizes: dict) -> str:
    """What a row whose every score is -inf gives, from the safe-softmax tail (if any)."""
    if "tail_nan" in ann:  # where(isnan(p), fill, p)
        fill = ann["tail_nan_fill"].value.numpy().reshape(-1)
        if fill.size != 1 or fill[0] != 0:
            raise NotAttention("a fully masked row (NaN probabilities) is filled with something else than 0")
        return "zero"
    if "tail" not in ann:
        return "nan"
    neg_inf = ann["tail_inf"].value.numpy().reshape(-1)
    if neg_inf.size != 1 or not np.isneginf(neg_inf[0]):
        raise NotAttention("the masked-row test of the softmax compares with something else than -inf")
    row_max = ann["tail_max"]
    rank = len(expr_dims(row_max.args[0]))
    axes = [int(a) % rank for a in row_max.attrs.axis] if row_max.attrs.axis is not None else None
    if axes != [rank - 1] or not row_max.attrs.keepdims:
        raise NotAttention("the masked-row test of the softmax does not reduce over the keys")
    if "tail_uniform" in ann:  # softmax(zeros_like(scores)): 1/T whatever T is
        uniform = ann["tail_uniform"]
        rank = len(expr_dims(uniform))
        if uniform.attrs.axis is None or int(uniform.attrs.axis) % rank != rank - 1:
            raise NotAttention("the fill of a fully masked row is a softmax over another axis than the keys")
        return "mean"
    fill = ann["tail_fill"].value.numpy().reshape(-1)
    if fill.size != 1:
        raise NotAttention("the value of a fully masked row is not a scalar")
    if fill[0] == 0:
        return "zero"
    keys = static_dim(sizes["T"])
    if keys is not None and fill[0] == np.float32(1.0) / np.float32(keys):
        return "mean"
    raise NotAttention(
        f"a fully masked row gets probabilities {fill[0]:g}; the kernel gives 0 or 1/T "
        f"(T = {sizes['T']}: the mean of the values)"
    )
