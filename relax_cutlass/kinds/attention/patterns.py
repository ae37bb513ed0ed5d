"""The patterns of fused attention: `R.nn.attention`, and softmax(q k^T * scale [+ bias]) v decomposed
with the views that split and move the heads around it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from .. import CODEGEN
from ..epilogue import Epilogue

ATTENTION_DTYPES = ("float16", "bfloat16")


# Ops that only change how a tensor is viewed (or are elementwise) on the way between the stages.
VIEW_OPS = ("relax.permute_dims", "relax.reshape", "relax.broadcast_to")


@dataclass(frozen=True)
class AttentionPatternSpec:
    """One attention composite: `form` "op" (R.nn.attention), "op_bias" (R.nn.attention given a
    bias, which TVM spells relax.nn.attention_bias), "softmax" (decomposed) or "softmax_gqa"
    (decomposed, with keys and values repeated across groups of query heads in the region: the
    kernel reads each kv head for its whole group, and the repeat is never written)."""

    form: str
    # Which of q, k and v are parts of one packed projection, read in place (`_packed`): "qkv" all
    # three (GPT-2, BERT), "v" the value only (Llama, GPT-NeoX: their rotary q and k are computed
    # from their parts, so TVM writes those anyway, but v reaches the attention through views
    # only), "" none. Each its own spec, tried first: where such a region is refused, the plain one
    # still fuses the attention (the parts then written by TVM).
    packed: str = ""

    @property
    def name(self) -> str:
        form = "" if self.form == "op" else f"_{self.form}"
        return f"{CODEGEN}.attention{form}" + {"": "", "qkv": "_packed", "v": "_packed_v"}[self.packed]

    @property
    def size(self) -> int:
        # before every GEMM pattern: its matmuls must not be taken one by one; a packed one before
        # the plain one (it takes the slices too), all three parts before the value alone, each
        # reported where refused
        return {"": 100, "v": 101, "qkv": 102}[self.packed]

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue()


# Grouped-query first: where its layout is refused (a repeat the kernel cannot read through
# strides), the plain decomposed pattern still takes the attention, the repeat left to TVM.
ATTENTION_SPECS = (
    AttentionPatternSpec("softmax_gqa", packed="qkv"),
    AttentionPatternSpec("softmax_gqa", packed="v"),
    AttentionPatternSpec("softmax_gqa"),
    AttentionPatternSpec("softmax", packed="qkv"),
    AttentionPatternSpec("softmax", packed="v"),
    AttentionPatternSpec("softmax"),
    AttentionPatternSpec("op"),
    AttentionPatternSpec("op_bias"),
)

# The Relax ops the "op" forms match: TVM's R.nn.attention is relax.nn.attention without a bias
# and relax.nn.attention_bias with one.
ATTENTION_OPS = {"op": "relax.nn.attention", "op_bias": "relax.nn.attention_bias"}


def _scale_of(x: DFPattern) -> DFPattern:
    """x multiplied (or divided) by a scalar constant, possibly cast."""
    const = is_const()
    c = is_op("relax.astype")(const) | const
    multiply, divide = is_op("relax.multiply"), is_op("relax.divide")
    return multiply(x, c) | multiply(c, x) | divide(x, c)


def _scaled(x: DFPattern) -> DFPattern:
    """x, optionally scaled (`_scale_of`)."""
    return _scale_of(x) | x


def _operand_scaled(x: DFPattern) -> DFPattern:
    """x, optionally scaled in its own type or in float32 between two casts: the form
    `cast_attention_operands` gives a scale that is no power of two (the kernel applies it to the
    scores in float32)."""
    cast = is_op("relax.astype")
    return cast(_scale_of(cast(x))) | _scaled(x)


def _views(x: DFPattern, ops: tuple[str, ...]) -> DFPattern:
    """x, optionally followed by each of `ops` in turn (each one present or not); "scale" is a
    scalar multiply or divide."""
    for op in ops:
        if op == "scale":
            x = _operand_scaled(x)
        else:
            x = _view(op, x) | x
    return x


def _view(op: str, x: DFPattern) -> DFPattern:
    return is_op(op)(x) if op in ("relax.permute_dims", "relax.expand_dims") else is_op(op)(x, wildcard())


def _repeated_kv(x: DFPattern) -> DFPattern:
    """transformers' `repeat_kv` of (B, N_kv, T, H) keys or values: expand_dims to (B, N_kv, 1, T, H),
    broadcast_to (B, N_kv, G, T, H), reshape to (B, N_kv * G, T, H)."""
    for op in _REPEAT_KV:
        x = _view(op, x)
    return x


_REPEAT_KV = ("relax.expand_dims", "relax.broadcast_to", "relax.reshape")


def _packed(x: DFPattern) -> DFPattern:
    """x, or its part of a packed q/k/v projection: strided_slice(x) (`packed_projection_slices`
    writes GPT-2's split and nn.MultiheadAttention's unflatten-and-take so), then the views that
    split the heads off it ((B, S, N, H), or nn.MultiheadAttention's (S, B*N, H) -> (B*N, S, H)
    -> (B, N, S, H))."""
    sliced = is_op("relax.strided_slice")(x, varg_default_wildcard=True)
    return _views(sliced, ("relax.reshape", "relax.permute_dims", "relax.reshape"))


# The views seen between a head-split q/k/v and its matmul: torch.export writes
# permute -> [permute] -> [scale] -> broadcast_to -> reshape (the scale: torch's decomposed
# scaled_dot_product_attention multiplies q and k^T by sqrt(scale) each), TVM's own rewrites
# permute -> reshape -> permute; a leading broadcast_to is a multi-query kv head expanded to
# every query head (`expand`) before the transpose.
_OPERAND_VIEWS = (
    "relax.broadcast_to",
    "relax.permute_dims",
    "relax.permute_dims",
    "scale",
    "relax.broadcast_to",
    "relax.reshape",
    "relax.permute_dims",
)


_VALUE_VIEWS = tuple(op for op in _OPERAND_VIEWS if op != "scale")  # a scaled v is no attention


_SCORE_VIEWS = ("relax.reshape", "relax.broadcast_to", "relax.reshape")


# torch.export of sdpa moves the heads back with three permutes ((B,N,S,V) -> (S,B,N,V) -> ...).
_OUTPUT_VIEWS = ("relax.reshape", "relax.permute_dims", "relax.permute_dims", "relax.permute_dims", "relax.reshape")


def safe_softmax_tail(logits: DFPattern, softmax: DFPattern, ann: dict) -> DFPattern:
    """torch's `_safe_softmax`: where(row all -inf, fill, softmax(x)), the row test written as
    logical_not(astype(max(astype(logical_not(equal(x, -inf)), int8), -1, keepdims), bool)); the
    fill a constant, or softmax(zeros_like(x)) (1/T)."""
    ann["tail_inf"] = neg_inf = is_const()
    finite = is_op("relax.logical_not")(is_op("relax.equal")(logits, neg_inf))
    ann["tail_max"] = row_any = is_op("relax.max")(is_op("relax.astype")(finite))
    masked_row = is_op("relax.logical_not")(is_op("relax.astype")(row_any))
    ann["tail_fill"] = fill = is_const()
    # 1/T for a symbolic key count T (masks.cast_attention_masks): the softmax of a row of zeros
    ann["tail_uniform"] = uniform = is_op("relax.nn.softmax")(is_op("relax.zeros_like")(logits))
    ann["tail"] = tail = is_op("relax.where")(masked_row, fill | uniform, softmax)
    return tail


def _nan_softmax_tail(softmax: DFPattern, ann: dict) -> DFPattern:
    """The safe softmax as torch.onnx exports it: where(isnan(p), fill, p), p = softmax(x). With
    finite scores and -inf masks p is NaN exactly on the rows whose every score is -inf."""
    ann["tail_nan_fill"] = fill = is_const()
    ann["tail_nan"] = tail = is_op("relax.where")(is_op("relax.isnan")(softmax), fill, softmax)
    return tail


def _causal_mask(ann: dict) -> DFPattern:
    """triu(fill broadcast to (S, T), k), optionally cast and given leading unit / broadcast dims:
    the causal mask `constant_causal_masks` writes. Matched inside the region, so no mask tensor
    is passed; the layout check reads the causal offset from it."""
    ann["causal_fill"] = fill = is_const()
    ann["causal_triu"] = mask = is_op("relax.triu")(is_op("relax.broadcast_to")(fill, wildcard()), wildcard())
    mask = is_op("relax.astype")(mask) | mask
    mask = is_op("relax.expand_dims")(mask) | is_op("relax.reshape")(mask, wildcard()) | mask
    ann["causal_mask"] = mask = is_op("relax.broadcast_to")(mask, wildcard()) | mask
    return mask


def _soft_capped(scores: DFPattern, ann: dict) -> DFPattern:
    """Logit soft-capping (Gemma-2, Grok): cap * tanh(scores / cap), the division (or a multiply by
    1 / cap) optional and the product with the cap too, a cast after it optional. The layout reads
    the cap from the scalars after the tanh and the scale from those before it."""
    ann["softcap_tanh"] = tanh = is_op("relax.tanh")(_scaled(scores))
    capped = _scaled(tanh)
    return is_op("relax.astype")(capped) | capped


@cache
def attention_pattern(spec: AttentionPatternSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """The DFPattern of `spec`, annotated query, key, value, root (the first matmul or the op),
    and for the decomposed form [bias] (the additive mask) and/or [causal_*] (a causal mask matched
    in the region; with a bias, added after it: causal_add), [softcap_tanh] (soft-capped scores),
    softmax, second (the second matmul)."""
    q, k, v = wildcard(), wildcard(), wildcard()
    ann: dict[str, DFPattern] = {"query": q, "key": k, "value": v}
    q_seen, k_seen, v_seen = (_packed(x) if r in spec.packed else x for x, r in zip((q, k, v), "qkv", strict=True))
    if spec.form == "softmax_gqa":
        k_seen, v_seen = _repeated_kv(k_seen), _repeated_kv(v_seen)
    if spec.form == "op":
        ann["root"] = out = is_op(ATTENTION_OPS["op"])(q, k, v)
        return out, ann
    if spec.form == "op_bias":
        ann["bias"] = bias = wildcard()
        ann["root"] = out = is_op(ATTENTION_OPS["op_bias"])(q, k, v, bias)
        return out, ann
    ann["root"] = scores = is_op("relax.matmul")(_views(q_seen, _OPERAND_VIEWS), _views(k_seen, _OPERAND_VIEWS))
    scaled = _scaled(_views(scores, _SCORE_VIEWS[:2]))
    scaled = is_op("relax.astype")(scaled) | scaled
    # the scores computed as (B*N, S, T) and viewed as (B, N, S, T) for the mask (BLOOM's baddbmm,
    # its reshape moved in front of its ALiBi bias by `hoist_position_terms`)
    scaled = is_op("relax.reshape")(scaled, wildcard()) | scaled
    scaled = _soft_capped(scaled, ann) | scaled
    ann["bias"] = bias = wildcard()
    causal = _causal_mask(ann)
    bias_in = causal | is_op("relax.astype")(bias) | bias
    ann["bias_add"] = add = is_op("relax.add")(scaled, bias_in) | is_op("relax.add")(bias_in, scaled)
    # a bias and then a causal mask (BLOOM's ALiBi, `hoist_position_terms`): the kernel takes both
    ann["causal_add"] = causal_add = is_op("relax.add")(add, causal) | is_op("relax.add")(causal, add)
    logits = causal_add | add | scaled
    logits = is_op("relax.astype")(logits) | logits
    ann["softmax"] = softmax = is_op("relax.nn.softmax")(logits)
    probs = safe_softmax_tail(logits, softmax, ann) | _nan_softmax_tail(softmax, ann) | softmax
    probs = is_op("relax.astype")(probs) | probs  # the cast before the views (cast_attention_operands)
    probs = _views(probs, _SCORE_VIEWS[1:])
    probs = is_op("relax.astype")(probs) | probs
    ann["second"] = second = is_op("relax.matmul")(probs, _views(v_seen, _VALUE_VIEWS))
    return _views(second, _OUTPUT_VIEWS), ann
