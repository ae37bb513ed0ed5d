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
from functools import cache

import numpy as np
import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val
from tvm.relax.dpl import DFPattern, is_const, is_op, rewrite_call, wildcard

from .kernel_spec import BIAS_AXES, BIAS_VECTOR, Epilogue

CODEGEN = "relax_cutlass"
ATTENTION_DTYPES = ("float16", "bfloat16")
# Roles of the logical axes in the order the kernel's strides use them.
QUERY_AXES, KEY_AXES, VALUE_AXES = ("B", "S", "N", "H"), ("B", "T", "N", "H"), ("B", "T", "N", "V")
OPERAND_AXES = (("query", QUERY_AXES), ("key", KEY_AXES), ("value", VALUE_AXES))

# Ops that only change how a tensor is viewed (or are elementwise) on the way between the stages.
_VIEW_OPS = ("relax.permute_dims", "relax.reshape", "relax.broadcast_to")


@dataclass(frozen=True)
class AttentionPatternSpec:
    """One attention composite: `form` "op" (R.nn.attention) or "softmax" (decomposed)."""

    form: str

    @property
    def name(self) -> str:
        return f"{CODEGEN}.attention" + ("" if self.form == "op" else "_softmax")

    @property
    def size(self) -> int:
        return 100  # before every GEMM pattern: its matmuls must not be taken one by one

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue()


ATTENTION_SPECS = (AttentionPatternSpec("softmax"), AttentionPatternSpec("op"))


def _scaled(x: DFPattern) -> DFPattern:
    """x, optionally multiplied (or divided) by a scalar constant, possibly cast."""
    const = is_const()
    c = is_op("relax.astype")(const) | const
    multiply, divide = is_op("relax.multiply"), is_op("relax.divide")
    return multiply(x, c) | multiply(c, x) | divide(x, c) | x


def _views(x: DFPattern, ops: tuple[str, ...]) -> DFPattern:
    """x, optionally followed by each of `ops` in turn (each one present or not); "scale" is a
    scalar multiply or divide."""
    for op in ops:
        if op == "scale":
            x = _scaled(x)
        else:
            x = (is_op(op)(x) if op == "relax.permute_dims" else is_op(op)(x, wildcard())) | x
    return x


# The views seen between a head-split q/k/v and its matmul: torch.export writes
# permute -> [permute] -> [scale] -> broadcast_to -> reshape (the scale: torch's decomposed
# scaled_dot_product_attention multiplies q and k^T by sqrt(scale) each), TVM's own rewrites
# permute -> reshape -> permute.
_OPERAND_VIEWS = (
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


def _safe_softmax_tail(logits: DFPattern, softmax: DFPattern, ann: dict) -> DFPattern:
    """torch's `_safe_softmax`: where(row all -inf, fill, softmax(x)), the row test written as
    logical_not(astype(max(astype(logical_not(equal(x, -inf)), int8), -1, keepdims), bool))."""
    ann["tail_inf"] = neg_inf = is_const()
    finite = is_op("relax.logical_not")(is_op("relax.equal")(logits, neg_inf))
    ann["tail_max"] = row_any = is_op("relax.max")(is_op("relax.astype")(finite))
    masked_row = is_op("relax.logical_not")(is_op("relax.astype")(row_any))
    ann["tail_fill"] = fill = is_const()
    ann["tail"] = tail = is_op("relax.where")(masked_row, fill, softmax)
    return tail


@cache
def attention_pattern(spec: AttentionPatternSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """The DFPattern of `spec`, annotated query, key, value, root (the first matmul or the op),
    and for the decomposed form [bias] (the additive mask), softmax, second (the second matmul)."""
    q, k, v = wildcard(), wildcard(), wildcard()
    ann: dict[str, DFPattern] = {"query": q, "key": k, "value": v}
    if spec.form == "op":
        ann["root"] = out = is_op("relax.nn.attention")(q, k, v)
        return out, ann
    ann["root"] = scores = is_op("relax.matmul")(_views(q, _OPERAND_VIEWS), _views(k, _OPERAND_VIEWS))
    scaled = _scaled(_views(scores, _SCORE_VIEWS[:2]))
    scaled = is_op("relax.astype")(scaled) | scaled
    ann["bias"] = bias = wildcard()
    bias_in = is_op("relax.astype")(bias) | bias
    ann["bias_add"] = add = is_op("relax.add")(scaled, bias_in) | is_op("relax.add")(bias_in, scaled)
    logits = add | scaled
    logits = is_op("relax.astype")(logits) | logits
    ann["softmax"] = softmax = is_op("relax.nn.softmax")(logits)
    probs = _safe_softmax_tail(logits, softmax, ann) | softmax
    probs = _views(probs, _SCORE_VIEWS[1:])
    probs = is_op("relax.astype")(probs) | probs
    ann["second"] = second = is_op("relax.matmul")(probs, _views(v, _VALUE_VIEWS))
    return _views(second, _OUTPUT_VIEWS), ann


# ---------------------------------------------------------------------------------------------
# Layout tracing
# ---------------------------------------------------------------------------------------------

# A layout: for each dimension of a tensor, the logical axes merged into it, outermost first.
# Axes of static size 1 are left out (they place nothing in memory).
Layout = tuple[tuple[str, ...], ...]


class _NotAttention(Exception):
    """A view the kernel cannot express; the message says which and why."""


def _known_dims(expr: relax.Expr) -> list | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        return None
    return list(ty.shape.values)


def _dims(expr: relax.Expr) -> list:
    dims = _known_dims(expr)
    if dims is None:
        raise _NotAttention(f"{_name(expr)} has no known shape")
    return dims


def _name(expr: relax.Expr) -> str:
    return expr.name if isinstance(expr, relax.Var) else type(expr).__name__


def _is_one(dim) -> bool:
    return isinstance(dim, tvm.tirx.IntImm) and int(dim) == 1


def _static(dim) -> int | None:
    return int(dim) if isinstance(dim, (int, tvm.tirx.IntImm)) else None


def _is_call(expr: relax.Expr, op: str) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == op


class _Tracer:
    """Follows views from one tensor to another, keeping each dimension's logical axes."""

    def __init__(self, var2val, sizes: dict[str, tvm.tirx.PrimExpr], bias: relax.Expr | None = None):
        self.var2val = var2val
        self.sizes = sizes
        self.bias = bias  # the additive bias (a region input), if any: the add continues past it
        self.children: dict[str, tuple[str, str]] = {}  # axis -> its two sub-axes, once split
        self.analyzer = tvm.sym.Analyzer()

    def equal(self, a, b) -> bool:
        return self.analyzer.can_prove_equal(a, b)

    def label(self, expr: relax.Expr, names: tuple[str, ...]) -> Layout:
        """The layout of `expr` itself, its dimensions named `names`."""
        dims = _dims(expr)
        if len(dims) != len(names):
            raise _NotAttention(f"{_name(expr)} has rank {len(dims)}, not {len(names)}")
        for name, dim in zip(names, dims, strict=True):
            if name in self.sizes and not self.equal(self.sizes[name], dim):
                raise _NotAttention(f"{_name(expr)}'s {name} size {dim} differs from {self.sizes[name]}")
            self.sizes[name] = dim
        return tuple(() if _is_one(d) else (n,) for n, d in zip(names, dims, strict=True))

    def chain(self, end: relax.Expr, start: relax.Expr, allowed: tuple[str, ...]) -> list[relax.Call]:
        """The calls from `start` to `end`, first first; every one an op in `allowed` whose
        main argument (`main_arg`) continues the chain."""
        calls = []
        expr = end
        while not expr.same_as(start):
            value = self.value(expr)
            if value.same_as(start):  # a matched wildcard is the bound value, not the var
                break
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in allowed):
                raise _NotAttention(f"{_name(expr)} is not reached from {_name(start)} through {allowed}")
            calls.append(value)
            expr = self.main_arg(value)
        return calls[::-1]

    def value(self, expr: relax.Expr) -> relax.Expr:
        """What a dataflow var is bound to (the expression itself otherwise)."""
        return self.var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def is_side(self, expr: relax.Expr) -> bool:
        """`expr` is the additive bias, or the cast of it."""
        if self.bias is None:
            return False
        value = self.value(expr)
        if expr.same_as(self.bias) or value.same_as(self.bias):
            return True
        return _is_call(value, "relax.astype") and self.is_side(value.args[0])

    def scalar_const(self, expr: relax.Expr) -> tuple[tvm.ir.GenericConst, relax.Call | None] | None:
        """(constant, its cast or None) when `expr` is a scalar constant, possibly cast."""
        value = self.value(expr)
        cast = None
        if _is_call(value, "relax.astype"):
            cast, value = value, self.value(value.args[0])
        if isinstance(value, tvm.ir.GenericConst) and value.value.numpy().size == 1:
            return value, cast
        return None

    def main_arg(self, call: relax.Call) -> relax.Expr:
        """The argument a chain of views/elementwise ops continues through: the probabilities of
        the safe-softmax `where`, the scores of the bias add, the tensor a scale multiplies."""
        op = call.op.name
        if op == "relax.where":
            return call.args[2]
        if op == "relax.add":
            return call.args[1] if self.is_side(call.args[0]) else call.args[0]
        if op in ("relax.multiply", "relax.divide"):
            return call.args[1] if self.scalar_const(call.args[0]) is not None else call.args[0]
        return call.args[0]

    def apply(self, layout: Layout, call: relax.Call) -> Layout:
        op = call.op.name
        if op == "relax.permute_dims":
            axes = call.attrs.axes
            order = [int(a) for a in axes] if axes is not None else list(range(len(layout)))[::-1]
            return tuple(layout[a] for a in order)
        if op == "relax.reshape":
            return self.regroup(layout, _dims(call), call)
        if op == "relax.broadcast_to":
            before, after = _dims(call.args[0]), _dims(call)
            if len(before) != len(after) or not all(self.equal(a, b) for a, b in zip(before, after, strict=True)):
                raise _NotAttention(f"broadcast_to {[str(d) for d in after]} repeats data (only a no-op one is fused)")
            return layout
        return layout  # elementwise: astype, the scale, softmax (its axis is checked apart)

    def regroup(self, layout: Layout, new_dims: list, call) -> Layout:
        """A reshape: the same axes in the same order, grouped into the new dimensions. A static
        axis may be split (the head split of a (B, S, N*H) projection): it becomes two sub-axes."""
        axes = [a for group in layout for a in group]
        groups, i = [], 0
        for dim in new_dims:
            if _is_one(dim):
                groups.append(())
                continue
            group: list[str] = []
            size = tvm.tirx.IntImm("int64", 1)
            while not (group and self.equal(size, dim)):
                if i == len(axes):
                    raise _NotAttention(f"reshape to {[str(d) for d in new_dims]} does not regroup the axes")
                axis = axes[i]
                outer = self._split_off(axis, size, dim)
                if outer is not None:
                    axes[i : i + 1] = list(outer)
                    axis = axes[i]
                group.append(axis)
                size = size * self.sizes[axis]
                i += 1
            groups.append(tuple(group))
        if i != len(axes):
            raise _NotAttention(f"reshape to {[str(d) for d in new_dims]} drops axes")
        return tuple(groups)

    def _split_off(self, axis: str, size, dim) -> tuple[str, str] | None:
        """If `axis` is larger than what dimension `dim` still needs after `size`, split it into
        (that much, the rest) and return the two sub-axes; None when it fits whole."""
        whole, need, have = (_static(e) for e in (self.sizes[axis], dim, size))
        if None in (whole, need, have) or need % have or whole <= need // have:
            return None
        outer = need // have
        if whole % outer:
            raise _NotAttention(f"reshape to {dim} cuts axis {axis} of size {whole} unevenly")
        parts = (f"{axis}.0", f"{axis}.1")
        self.sizes[parts[0]] = tvm.tirx.IntImm("int64", outer)
        self.sizes[parts[1]] = tvm.tirx.IntImm("int64", whole // outer)
        self.children[axis] = parts
        return parts

    def leaves(self, axis: str) -> list[str]:
        """`axis`, or the sub-axes it was split into, outermost first."""
        return [leaf for part in self.children.get(axis, ()) for leaf in self.leaves(part)] or [axis]

    def read(self, names: list[str], axis: str) -> tuple[int, int]:
        """(dimension of the parameter, element factor within it) of a leaf axis: its stride is
        the dimension's packed stride times the sizes of the leaves inside it after this one."""
        for dim, root in enumerate(names):
            leaves = self.leaves(root)
            if axis in leaves:
                inner = leaves[leaves.index(axis) + 1 :]
                return dim, math.prod(_static(self.sizes[a]) for a in inner)
        raise _NotAttention(f"axis {axis} belongs to no parameter dimension")

    def follow(self, layout: Layout, calls: list[relax.Call]) -> Layout:
        for call in calls:
            layout = self.apply(layout, call)
        return layout


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

    @property
    def reads(self) -> tuple:
        """query, key, value reads, in OPERAND_AXES order."""
        return self.query, self.key, self.value


def _operand(
    tracer: _Tracer, param, matmul_arg, prefix: str, inner: tuple[str, str], allowed=_VIEW_OPS
) -> tuple[list, Layout, list[relax.Call]]:
    """Trace a q/k/v parameter to its matmul operand. -> (the parameter's dims named
    prefix0..3, the operand's layout, the calls between); the operand's last two dims must be
    single axes."""
    names = tuple(f"{prefix}{i}" for i in range(len(_dims(param))))
    calls = tracer.chain(matmul_arg, param, allowed)
    layout = tracer.follow(tracer.label(param, names), calls)
    if len(layout) < 2 or any(len(g) > 1 for g in layout[-2:]):
        raise _NotAttention(f"the {inner} of the {prefix} operand are not single axes")
    return list(names), layout, calls


def _assign(
    tracer: _Tracer, names: list[str], layout: Layout, roles: tuple[str, str], lone: str, what: str
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
        raise _NotAttention(f"{what} batches over {len(batch)} axes; attention has batch and heads")
    assigned |= dict(zip(batch, ("B", "N") if len(batch) == 2 else (lone,), strict=False))
    free = [r for r in ("B", "N", *roles) if r not in assigned.values()]
    for root in names:
        leaves = tracer.leaves(root)
        if any(leaf in assigned for leaf in leaves):
            continue
        if not free or not _is_one(tracer.sizes[root]):
            raise _NotAttention(f"{what} has a dimension that is none of batch, heads, rows, head dim")
        assigned[root] = free.pop(0)
    return assigned


def _reads(tracer: _Tracer, names: list[str], assigned: dict[str, str], order: tuple[str, ...]) -> tuple:
    by_role = {role: axis for axis, role in assigned.items()}
    missing = [role for role in order if role not in by_role]
    if missing:  # e.g. grouped-query keys/values, whose heads repeat through a broadcast
        raise _NotAttention(f"no axis of the operand holds the kernel's {', '.join(missing)} (read {dict(assigned)})")
    return tuple(tracer.read(names, by_role[role]) for role in order)


def attention_layout(spec: AttentionPatternSpec, ann: dict, out: relax.Expr, var2val) -> AttentionLayout:
    """Check that the matched region is softmax(q k^T * scale) v over (B, N) and return its
    layout. Raises ValueError (with the reason) when it is not, or not in a form the kernel runs."""
    try:
        return (_op_layout if spec.form == "op" else _softmax_layout)(ann, out, var2val)
    except _NotAttention as err:
        raise ValueError(str(err)) from None


def _op_layout(ann: dict, out: relax.Expr, _var2val) -> AttentionLayout:
    call = ann["root"]
    attrs = call.attrs
    if attrs.causal_mask is not None:
        raise _NotAttention(f"causal_mask={attrs.causal_mask!r}: masked attention is not fused yet")
    if getattr(attrs, "window_size", None) is not None:
        raise _NotAttention("sliding-window attention is not fused")
    tracer = _Tracer({}, {})
    for role, axes in OPERAND_AXES:
        tracer.label(ann[role], axes)
    sizes = tracer.sizes
    head_dim = sizes["H"]
    if not isinstance(head_dim, tvm.tirx.IntImm):
        raise _NotAttention("the head dim must be static")
    scale = float(attrs.scale.value) if attrs.scale is not None else 1.0 / math.sqrt(int(head_dim))
    whole = ((0, 1), (1, 1), (2, 1), (3, 1))
    return AttentionLayout(whole, whole, whole, (4, 4, 4), dict(sizes), scale)


def _scalar_value(const, cast=None) -> float:
    value = const.value.numpy().reshape(-1)
    if value.size != 1:
        raise _NotAttention("the scale is not a scalar")
    if cast is not None:
        value = value.astype(str(cast.ty.dtype))
    return float(value[0])


def _softmax_layout(ann: dict, out: relax.Expr, var2val) -> AttentionLayout:
    # A lone batch axis (the other of batch/heads has size 1) is heads or batch: the output's
    # layout tells which, so try both.
    try:
        return _softmax_layout_as(ann, out, var2val, "N")
    except _NotAttention as first_error:
        try:
            return _softmax_layout_as(ann, out, var2val, "B")
        except _NotAttention:
            raise first_error from None


def _softmax_layout_as(ann: dict, out: relax.Expr, var2val, lone: str) -> AttentionLayout:
    tracer = _Tracer(var2val, {}, ann.get("bias"))
    first, second = ann["root"], ann["second"]
    scaled = (*_VIEW_OPS, "relax.multiply", "relax.divide")
    q_names, q_op, q_calls = _operand(tracer, ann["query"], first.args[0], "q", ("rows", "head dim"), scaled)
    k_names, k_op, k_calls = _operand(tracer, ann["key"], first.args[1], "k", ("head dim", "rows"), scaled)
    v_names, v_op, _ = _operand(tracer, ann["value"], second.args[1], "v", ("rows", "head dim"))
    q_role = _assign(tracer, q_names, q_op, ("S", "H"), lone, "the query")
    k_role = _assign(tracer, k_names, k_op, ("H", "T"), lone, "the key")
    v_role = _assign(tracer, v_names, v_op, ("T", "V"), lone, "the value")
    sizes: dict[str, tvm.tirx.PrimExpr] = {}
    for roles, what in ((q_role, "query"), (k_role, "key"), (v_role, "value")):
        for axis, role in roles.items():
            size = tracer.sizes[axis]
            if role in sizes and not tracer.equal(sizes[role], size):
                raise _NotAttention(f"the {what}'s {role} size {size} differs from {sizes[role]}")
            sizes.setdefault(role, size)
    # Both operands of each matmul must batch over the same (B, N) grouping.
    q_batch = tuple(tuple(q_role[a] for a in g) for g in q_op[:-2])
    for layout, roles, what in ((k_op, k_role, "key"), (v_op, v_role, "value")):
        if tuple(tuple(roles[a] for a in g) for g in layout[:-2]) != q_batch:
            raise _NotAttention(f"the {what} operand is not batched like the query")
    tracer.sizes |= sizes
    kept = tuple(a for a in ("S", "T", "V") if not _is_one(sizes[a]))

    def rows(role: str) -> tuple[str, ...]:
        return (role,) if role in kept else ()

    # From the scores to the probabilities: views, casts, the scale, the bias, the softmax and
    # its safe tail only.
    score_layout = (*q_batch, rows("S"), rows("T"))
    allowed = (*_VIEW_OPS, "relax.astype", "relax.multiply", "relax.divide", "relax.add", "relax.nn.softmax")
    calls = tracer.chain(second.args[0], first, (*allowed, "relax.where"))
    layout = score_layout
    bias, bias_rank = None, 0
    for call in calls:
        if call.same_as(ann["softmax"]):
            axis = int(call.attrs.axis)
            if axis not in (-1, len(layout) - 1) or layout[-1] != rows("T"):
                raise _NotAttention(f"softmax over axis {axis} is not over the keys")
        if "bias_add" in ann and call.same_as(ann["bias_add"]):
            bias, bias_rank = _bias_reads(tracer, ann["bias"], layout, call)
        layout = tracer.apply(layout, call)
    if layout != score_layout:
        raise _NotAttention("the probabilities reach the second matmul in another layout than the scores")
    # The output: (B, S, N, V) in memory, however it is grouped.
    masked_rows = _masked_rows(ann, sizes)
    out_layout = tracer.follow((*q_batch, rows("S"), rows("V")), tracer.chain(out, second, _VIEW_OPS))
    order = [a for g in out_layout for a in g]
    want = [a for a in ("B", "S", "N", "V") if not _is_one(sizes[a])]
    if order != want:
        raise _NotAttention(f"the output is laid out as {''.join(order)}, not BSNV; the kernel writes (B, S, N, V)")
    return AttentionLayout(
        _reads(tracer, q_names, q_role, QUERY_AXES),
        _reads(tracer, k_names, k_role, KEY_AXES),
        _reads(tracer, v_names, v_role, VALUE_AXES),
        (len(q_names), len(k_names), len(v_names)),
        sizes,
        _scale(tracer, [*q_calls, *k_calls, *calls]),
        bias,
        bias_rank,
        # Without a bias no score is -inf: the (checked) tail never fires.
        masked_rows if bias is not None else "nan",
    )


def _scale(tracer: _Tracer, calls: list[relax.Call]) -> float:
    """The product of the scalar constants multiplying (or dividing) q, k^T and the scores."""
    scale = 1.0
    for call in calls:
        if call.op.name not in ("relax.multiply", "relax.divide"):
            continue
        main = tracer.main_arg(call)
        other = next(a for a in call.args if not a.same_as(main))
        found = tracer.scalar_const(other)
        if found is None:
            raise _NotAttention(f"{call.op.name} by {_name(other)}, which is no scalar constant, is not a scale")
        if call.op.name == "relax.divide" and not call.args[0].same_as(main):
            raise _NotAttention("a constant divided by the scores is not a scale")
        value = _scalar_value(*found)
        scale = scale / value if call.op.name == "relax.divide" else scale * value
    return scale


def _bias_reads(tracer: _Tracer, bias: relax.Expr, layout: Layout, add: relax.Call) -> tuple[tuple, int]:
    """How the kernel reads the additive bias added to scores laid out as `layout`: numpy
    broadcasting, right-aligned; a dimension of size 1 is broadcast (stride 0) over the axes of
    the scores' dimension, one of the scores' size holds them."""
    bias_dims, score_dims = _dims(bias), _dims(tracer.main_arg(add))
    out_dims = _dims(add)
    if len(out_dims) != len(score_dims) or not all(
        tracer.equal(a, b) for a, b in zip(out_dims, score_dims, strict=True)
    ):
        raise _NotAttention(f"the mask/bias {[str(d) for d in bias_dims]} broadcasts the scores to a larger shape")
    offset = len(score_dims) - len(bias_dims)
    reads: dict[str, AxisRead] = {}
    for i, group in enumerate(layout):
        j = i - offset
        if j < 0 or _is_one(bias_dims[j]) or not group:
            continue
        if not tracer.equal(bias_dims[j], score_dims[i]):
            raise _NotAttention(
                f"the mask/bias dim {j} has size {bias_dims[j]}: neither 1 nor the scores' {score_dims[i]}"
            )
        for pos, axis in enumerate(group):
            inner = [_static(tracer.sizes[a]) for a in group[pos + 1 :]]
            if None in inner:
                raise _NotAttention("the mask/bias merges a symbolic axis with another one in one dimension")
            reads[axis] = (j, math.prod(inner))
    return tuple(reads.get(axis) for axis in BIAS_AXES), len(bias_dims)


def _masked_rows(ann: dict, sizes: dict) -> str:
    """What a row whose every score is -inf gives, from the safe-softmax tail (if any)."""
    if "tail" not in ann:
        return "nan"
    neg_inf = ann["tail_inf"].value.numpy().reshape(-1)
    if neg_inf.size != 1 or not np.isneginf(neg_inf[0]):
        raise _NotAttention("the masked-row test of the softmax compares with something else than -inf")
    row_max = ann["tail_max"]
    rank = len(_dims(row_max.args[0]))
    axes = [int(a) % rank for a in row_max.attrs.axis] if row_max.attrs.axis is not None else None
    if axes != [rank - 1] or not row_max.attrs.keepdims:
        raise _NotAttention("the masked-row test of the softmax does not reduce over the keys")
    fill = ann["tail_fill"].value.numpy().reshape(-1)
    if fill.size != 1:
        raise _NotAttention("the value of a fully masked row is not a scalar")
    if fill[0] == 0:
        return "zero"
    keys = _static(sizes["T"])
    if keys is not None and fill[0] == np.float32(1.0) / np.float32(keys):
        return "mean"
    raise _NotAttention(
        f"a fully masked row gets probabilities {fill[0]:g}; the kernel gives 0 or 1/T "
        f"(T = {sizes['T']}: the mean of the values)"
    )


def attention_problems(spec: AttentionPatternSpec, ann: dict, out: relax.Expr, var2val) -> list[str]:
    """Why this matched region cannot run as the fused attention kernel (empty when it can)."""
    problems = []
    for role in ("query", "key", "value"):
        if _known_dims(ann[role]) is None:
            problems.append(f"{role} has no known shape")
            continue
        dtype = str(ann[role].ty.dtype)
        if dtype not in ATTENTION_DTYPES:
            problems.append(f"{role} dtype is {dtype}; fused attention takes {'/'.join(ATTENTION_DTYPES)}")
    if problems:
        return problems
    if len({str(ann[r].ty.dtype) for r in ("query", "key", "value")} | {str(out.ty.dtype)}) != 1:
        return ["query, key, value and output dtypes differ"]
    if "bias" in ann:
        dtype, element = str(ann["bias"].ty.dtype), str(ann["query"].ty.dtype)
        if _known_dims(ann["bias"]) is None:
            return ["the additive mask/bias has no known shape"]
        if dtype != element:
            return [
                f"the additive mask/bias is {dtype}, but the kernel reads it as {element} (a float32 mask "
                f"is cast to {element} before partitioning only where its values are provably exact in "
                f"{element} or a finite mask value that swamps the scores)"
            ]
    try:
        layout = attention_layout(spec, ann, out, var2val)
    except ValueError as err:
        return [str(err)]
    except Exception as err:  # a form the tracer does not know must never fail the user's pipeline
        return [f"the attention's layout could not be read ({type(err).__name__}: {err}); it stays in TVM"]
    return layout_problems(layout)


def layout_problems(layout: AttentionLayout) -> list[str]:
    """The kernel's own limits: static head dims, 4-element rows, the head dim innermost."""
    problems = []
    for axis in ("H", "V", "N"):
        if not isinstance(layout.sizes[axis], tvm.tirx.IntImm):
            problems.append(f"the {'heads' if axis == 'N' else 'head dim'} must be static")
    if problems:
        return problems
    h, hv = int(layout.sizes["H"]), int(layout.sizes["V"])
    if h % 4 or hv % 4:
        problems.append(f"head dims {h}/{hv} must be multiples of 4 (CUTLASS fMHA's narrowest vector)")
    if max(h, hv) > 512:
        problems.append(f"head dim {max(h, hv)} is over 512")
    outer_head_dims, merged_symbolic = [], []
    for (what, axes), reads, rank in zip(OPERAND_AXES, layout.reads, layout.ranks, strict=True):
        if reads[3] != (rank - 1, 1):
            outer_head_dims.append(f"the {what}'s head dim is not its innermost axis (the kernel reads rows of it)")
        held: dict[int, list[str]] = {}
        for axis, (dim, _) in zip(axes, reads, strict=True):
            if _static(layout.sizes[axis]) is None:
                held.setdefault(dim, []).append(axis)
        if any(len(symbolic) > 1 for symbolic in held.values()):
            merged_symbolic.append(f"the {what} merges two symbolic axes into one dimension")
    problems += outer_head_dims + merged_symbolic
    if layout.bias is not None:
        if layout.bias[3] != (layout.bias_rank - 1, 1):
            problems.append("the additive mask/bias is not contiguous along the keys (the kernel reads rows of it)")
        keys = _static(layout.sizes["T"])
        if keys is not None and keys % BIAS_VECTOR:
            problems.append(
                f"{keys} keys: with a mask/bias the keys must be a multiple of {BIAS_VECTOR} "
                "(the kernel loads bias rows 16 bytes at a time)"
            )
    if not np.isfinite(layout.scale) or layout.scale == 0:
        problems.append(f"scale {layout.scale} is not a finite non-zero number")
    return problems


# ---------------------------------------------------------------------------------------------
# float32 masks: cast to the kernel's element type before partitioning, where that is exact
# ---------------------------------------------------------------------------------------------

# A finite mask value at or below this swamps any float16 score in a float32 add: fl32(s + m) == m
# for |s| <= 65504 once ulp(m) / 2 > 65504, i.e. |m| >= 2**40 (finfo(float32).min, which Hugging
# Face's eager attention uses, is about 2**128).
SWAMPING_MASK = -(2.0**40)
_MASK_VIEWS = ("relax.broadcast_to", "relax.reshape", "relax.expand_dims", "relax.permute_dims", "relax.squeeze")


def _exact_in(values: np.ndarray, dtype: str) -> bool:
    """Every value of `values` (float32) survives a round trip through `dtype`."""
    values = np.asarray(values, dtype="float32")
    if np.isnan(values).any():
        return False
    if dtype == "bfloat16":
        return bool((values.view("uint32") & 0xFFFF == 0).all())
    with np.errstate(over="ignore"):
        back = values.astype("float16").astype("float32")
    return bool((back == values).all())


class _MaskValues:
    """What the values of a float32 mask are known to be, from the bindings that produce it."""

    def __init__(self, var2val):
        self.var2val = var2val

    def value(self, expr):
        return self.var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def constant(self, expr) -> np.ndarray | None:
        """The values of a constant-valued expression (a constant, full, casts and views of one)."""
        value = self.value(expr)
        if isinstance(value, tvm.ir.GenericConst):
            known = value.value.numpy()
            return known.astype("float32") if known.dtype.kind in "fiub" else None
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        op = value.op.name
        if op in _MASK_VIEWS:
            return self.constant(value.args[0])
        source = value.args[1] if op == "relax.full" else value.args[0] if op == "relax.astype" else None
        known = self.constant(source) if source is not None else None
        dtype = str(value.ty.dtype)
        if known is None or dtype not in ("float16", "float32", "float64", "bool", "int8", "int32", "int64"):
            return None
        return known.astype(dtype).astype("float32")

    def exact(self, expr, dtype: str) -> bool:
        """The expression's values are all exact in `dtype`."""
        known = self.constant(expr)
        if known is not None:
            return _exact_in(known, dtype)
        value = self.value(expr)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return False
        op = value.op.name
        if op in _MASK_VIEWS:
            return self.exact(value.args[0], dtype)
        if op == "relax.where":
            return self.exact(value.args[1], dtype) and self.exact(value.args[2], dtype)
        if op == "relax.astype":
            source = str(value.args[0].ty.dtype)
            if source in (dtype, "bool", "int8", "uint8"):
                return True
            return source == "float32" and self.exact(value.args[0], dtype)
        return False

    def swamping_where(self, expr) -> tuple[relax.Call, int, float] | None:
        """(where, index of its swamping branch, the other branch's value) for a float32 mask
        where(cond, finite exact value, finite value <= SWAMPING_MASK) (either way round)."""
        where = self.value(expr)
        if not _is_call(where, "relax.where"):
            return None
        branches = [self.constant(where.args[i]) for i in (1, 2)]
        if any(b is None or b.size != 1 for b in branches):
            return None
        (a,), (b,) = (x.reshape(-1) for x in branches)
        for index, (kept, huge) in ((2, (a, b)), (1, (b, a))):
            if np.isfinite(kept) and _exact_in(kept, "float16") and np.isfinite(huge) and huge <= SWAMPING_MASK:
                return where, index, float(kept)
        return None


def _from_matmul(expr, var2val, depth: int = 8) -> bool:
    """`expr` is a matmul's result, through views, casts and scalar scales (the scores)."""
    for _ in range(depth):
        value = var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr
        if _is_call(value, "relax.matmul"):
            return True
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return False
        if value.op.name not in (*_VIEW_OPS, "relax.astype", "relax.multiply", "relax.divide"):
            return False
        expr = value.args[0]
    return False


def _plan_masks(func: relax.Function) -> tuple[dict, dict]:
    """-> ({add var: (mask index, element dtype, swamping where or None)}, {softmax var: keys})."""
    var2val = get_var2val(func)
    uses: dict = {}

    def count(expr):
        if isinstance(expr, relax.Var):
            uses[expr] = uses.get(expr, 0) + 1

    relax.analysis.post_order_visit(func.body, count)
    known = _MaskValues(var2val)
    adds, tails = {}, {}
    for var, value in var2val.items():
        if not _is_call(value, "relax.nn.softmax") or not isinstance(value.args[0], relax.Var):
            continue
        x = value.args[0]
        add = var2val.get(x)
        if not _is_call(add, "relax.add") or str(add.ty.dtype) != "float32":
            continue
        for index in (1, 0):
            scores, mask = add.args[1 - index], add.args[index]
            cast = known.value(scores)
            if (
                _is_call(cast, "relax.astype")
                and str(cast.args[0].ty.dtype) in ATTENTION_DTYPES
                and str(mask.ty.dtype) == "float32"
                and _from_matmul(cast.args[0], var2val)
            ):
                break
        else:
            continue
        element = str(cast.args[0].ty.dtype)
        if known.exact(mask, element):
            adds[x] = (index, element, None)
            continue
        dims = _known_dims(x)
        keys = _static(dims[-1]) if dims else None
        swamping = known.swamping_where(mask) if element == "float16" else None
        if swamping is None or keys is None or uses.get(x, 0) != 1 or int(value.attrs.axis) not in (-1, len(dims) - 1):
            continue
        adds[x] = (index, element, swamping)
        tails[var] = keys
    return adds, tails


@relax.expr_functor.mutator
class _CastMasks(relax.PyExprMutator):
    def __init__(self, adds: dict, tails: dict):
        super().__init__()
        self.adds, self.tails = adds, tails
        self.cast: dict = {}  # mask var -> its float16 copy, per binding block

    def visit_dataflow_block_(self, block):
        self.cast = {}
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block):
        self.cast = {}
        return super().visit_binding_block_(block)

    def visit_var_binding_(self, binding):
        var = binding.var
        if var in self.adds:
            index, element, swamping = self.adds[var]
            mask = self.visit_expr(binding.value.args[index])
            low = self.cast.get(mask)
            if low is None:
                if swamping is None:
                    low = self.builder_.emit(relax.op.astype(mask, element))
                else:  # the swamping value becomes -inf; the tail below keeps what a full row gives
                    where, huge, kept = swamping
                    branches = [relax.const(kept, element), relax.const(-np.inf, element)]
                    args = branches if huge == 2 else branches[::-1]
                    low = self.builder_.emit(relax.op.where(self.visit_expr(where.args[0]), *args))
                self.cast[mask] = low
            args = list(binding.value.args)
            args[index] = self.builder_.emit(relax.op.astype(low, "float32"))
            args[1 - index] = self.visit_expr(args[1 - index])
            self.set_var_remap(var, self.builder_.emit(relax.op.add(*args)))
            return
        if var in self.tails:
            x = self.visit_expr(binding.value.args[0])
            probs = self.builder_.emit(relax.op.nn.softmax(x, axis=-1))
            emit = self.builder_.emit
            # torch's _safe_softmax test, so that the attention pattern reads it as such.
            finite = emit(relax.op.logical_not(emit(relax.op.equal(x, relax.const(-np.inf, "float32")))))
            row_any = emit(relax.op.max(emit(relax.op.astype(finite, "int8")), axis=[-1], keepdims=True))
            masked_row = emit(relax.op.logical_not(emit(relax.op.astype(row_any, "bool"))))
            uniform = relax.const(np.float32(1.0) / np.float32(self.tails[var]), "float32")
            self.set_var_remap(var, emit(relax.op.where(masked_row, uniform, probs)))
            return
        super().visit_var_binding_(binding)


def cast_attention_masks(func: relax.Function) -> relax.Function:
    """softmax(astype(scores, f32) + mask) with a float32 mask -> the same with the mask cast to
    the scores' (the kernel's) element type, where that changes no result:

    * the mask's values are provably exact in that type (a 0/-inf mask: `where(keep, 0, -inf)`,
      as torch's scaled_dot_product_attention writes a boolean mask): the cast is exact;
    * `where(keep, c, m)` for float16 scores, c finite and exact, m finite and <= -2**40
      (Hugging Face's eager attention: c = 0, m = finfo(float32).min): m swamps every float16
      score, so a masked key gets probability exactly 0, as with -inf, and a row whose every
      key is masked gets the uniform softmax of equal values. m becomes -inf, and torch's
      safe-softmax tail, with the value 1/T (not 0), keeps what such a row gives: the mean of
      the values.

    Other float32 masks are left alone (the attention region then stays in TVM, saying why)."""
    adds, tails = _plan_masks(func)
    if not adds:
        return func
    rewritten = _CastMasks(adds, tails).visit_expr(func)
    return relax.analysis.remove_all_unused(rewritten)


def scalar_where_fills(func: relax.Function) -> relax.Function:
    """where(cond, constant tensor of one repeated value, x) -> where(cond, that scalar, x) when x
    has the result's shape. torch.export writes the 0 of its safe softmax as a zeros tensor of the
    scores' shape; as a scalar it stays a literal of the attention region rather than becoming a
    tensor argument of it."""
    cond, fill, x = wildcard(), is_const(), wildcard()
    pattern = is_op("relax.where")(cond, fill, x)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        values = m[fill].value.numpy()
        if values.ndim == 0 or values.size == 0 or not (values == values.reshape(-1)[0]).all():
            return orig
        dims, out = _known_dims(m[x]), _known_dims(orig)
        if dims is None or out is None or len(dims) != len(out):
            return orig
        if not all(_static(a) is not None and _static(a) == _static(b) for a, b in zip(dims, out, strict=True)):
            return orig
        scalar = relax.const(values.reshape(-1)[0], str(values.dtype))
        return relax.op.where(m[cond], scalar, m[x])

    return rewrite_call(pattern, rewriter, func)


_OPERAND_CAST_VIEWS = ("relax.reshape", "relax.permute_dims", "relax.broadcast_to")


def _power_of_two(expr) -> bool:
    """`expr` is a float32 scalar constant 2**k, |k| <= 64."""
    if not isinstance(expr, tvm.ir.GenericConst) or str(expr.ty.dtype) != "float32":
        return False
    value = expr.value.numpy()
    if value.size != 1:
        return False
    mantissa, exponent = math.frexp(float(value.reshape(-1)[0]))
    return mantissa == 0.5 and abs(exponent - 1) <= 64


def _is_op_call(expr) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)


class _OperandCasts:
    """Plans `cast_attention_operands`: which float32 -> 16-bit casts of a matmul operand move up."""

    def __init__(self, func: relax.Function):
        self.var2val = get_var2val(func)
        self.uses: dict = {}

        def count(expr):
            if isinstance(expr, relax.Var):
                self.uses[expr] = self.uses.get(expr, 0) + 1

        relax.analysis.post_order_visit(func.body, count)

    def value(self, expr):
        return self.var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def narrow_source(self, expr, dtype: str):
        """The `dtype` tensor whose float32 copy `expr` is (through take), or None."""
        value = self.value(expr)
        if not _is_op_call(value):
            return None
        if value.op.name == "relax.astype":
            return value.args[0] if str(value.args[0].ty.dtype) == dtype else None
        if value.op.name == "relax.take":
            return self.narrow_source(value.args[0], dtype)
        return None

    def chain(self, x, dtype: str) -> tuple[relax.Expr, list[relax.Call]] | None:
        """(base, [calls from base to x]) of the views and power-of-two scales (float16 only)
        leading to float32 `x`, each intermediate used once, base the float32 copy of a `dtype`
        tensor (through take); None otherwise."""
        calls: list[relax.Call] = []
        while isinstance(x, relax.Var) and self.uses.get(x, 0) == 1:
            value = self.value(x)
            if not _is_op_call(value) or str(value.ty.dtype) != "float32":
                break
            op = value.op.name
            if op in _OPERAND_CAST_VIEWS:
                calls.append(value)
                x = value.args[0]
            elif op in ("relax.multiply", "relax.divide") and dtype == "float16":
                a, b = value.args
                if _power_of_two(b):
                    x = a
                elif op == "relax.multiply" and _power_of_two(a):
                    x = b
                else:
                    break
                calls.append(value)
            else:
                break
        if not calls or self.narrow_source(x, dtype) is None:
            # Only float32 copies of `dtype` values: then the views and scales run on the same
            # values in `dtype`, and a scale's exact product rounds once either way.
            return None
        return x, calls[::-1]


@relax.expr_functor.mutator
class _CastOperands(relax.PyExprMutator):
    def __init__(self, plan: dict, known: _OperandCasts):
        super().__init__()
        self.plan, self.known = plan, known

    def narrow(self, expr, dtype: str):
        value = self.known.value(expr)
        if _is_call(value, "relax.astype") and str(value.args[0].ty.dtype) == dtype:
            return self.visit_expr(value.args[0])
        if _is_call(value, "relax.take") and self.known.narrow_source(value.args[0], dtype) is not None:
            source = self.narrow(value.args[0], dtype)
            axis = None if value.attrs.axis is None else int(value.attrs.axis)
            index = self.visit_expr(value.args[1])
            return self.builder_.emit(relax.op.take(source, index, axis=axis, mode=str(value.attrs.mode)))
        return self.builder_.emit(relax.op.astype(self.visit_expr(expr), dtype))

    def visit_var_binding_(self, binding):
        if binding.var not in self.plan:
            super().visit_var_binding_(binding)
            return
        base, calls, dtype = self.plan[binding.var]
        low = self.narrow(base, dtype)
        for call in calls:
            op = call.op.name
            if op == "relax.permute_dims":
                low = relax.op.permute_dims(low, call.attrs.axes)
            elif op == "relax.reshape":
                low = relax.op.reshape(low, call.args[1])
            elif op == "relax.broadcast_to":
                low = relax.op.broadcast_to(low, call.args[1])
            else:
                a, b = call.args
                const = b if _power_of_two(b) else a
                half = relax.const(const.value.numpy().astype(dtype), dtype)
                if op == "relax.divide":
                    low = relax.op.divide(low, half)
                else:
                    low = relax.op.multiply(low, half) if const is b else relax.op.multiply(half, low)
            low = self.builder_.emit(low)
        self.set_var_remap(binding.var, low)


def cast_attention_operands(func: relax.Function) -> relax.Function:
    """matmul(astype(views(x), f16), ...) with float32 views -> the cast moved up to x, the views
    done in float16: torch.export of nn.MultiheadAttention after ToMixedPrecision splits heads,
    scales and transposes q, k and v in float32 and casts each just before its batched matmul,
    which hides the attention from its pattern (its operand views are those of the kernel's
    element type). The views (reshape, permute_dims, broadcast_to) change no value, so the move is
    bit-identical. Multiplies or divides by a scalar 2**k (|k| <= 64) move too, for float16 only
    and only where x is the float32 copy of float16 values (through take): the float32 product is
    then exact and rounds once either way, so those stay bit-identical as well; any other scale,
    or float32 values not known to be float16 ones, ends the move (a subnormal float16 result
    could round differently). A cast whose input is astype(y, f16) to float32, possibly through
    take (the packed q/k/v projection split by index), becomes y (take of y): no cast at all."""
    known = _OperandCasts(func)
    plan: dict = {}
    for value in known.var2val.values():
        if not _is_call(value, "relax.matmul"):
            continue
        for arg in value.args:
            cast = known.value(arg)
            if not (isinstance(arg, relax.Var) and _is_call(cast, "relax.astype")) or arg in plan:
                continue
            dtype = str(cast.ty.dtype)
            if dtype not in ATTENTION_DTYPES or str(cast.args[0].ty.dtype) != "float32":
                continue
            found = known.chain(cast.args[0], dtype)
            if found is not None:
                plan[arg] = (*found, dtype)
    if not plan:
        return func
    rewritten = _CastOperands(plan, known).visit_expr(func)
    return relax.analysis.remove_all_unused(rewritten)


@relax.expr_functor.mutator
class _MergeCasts(relax.PyExprMutator):
    def __init__(self):
        super().__init__()
        self.seen: dict = {}  # (source var, dtype) -> the first cast's var, per binding block

    def visit_dataflow_block_(self, block):
        self.seen = {}
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block):
        self.seen = {}
        return super().visit_binding_block_(block)

    def visit_var_binding_(self, binding):
        value = binding.value
        if _is_call(value, "relax.astype") and isinstance(binding.var, relax.DataflowVar):
            source = self.visit_expr(value.args[0])
            key = (source, str(value.ty.dtype))
            first = self.seen.get(key)
            if first is not None:
                self.set_var_remap(binding.var, first)
                return
            super().visit_var_binding_(binding)
            self.seen[key] = self.visit_expr(binding.var)
            return
        super().visit_var_binding_(binding)


def merge_repeated_casts(func: relax.Function) -> relax.Function:
    """Repeated astype(x, dtype) of one x in one block -> the first. ToMixedPrecision writes the
    float32 copy of the attention scores once for the softmax and once for torch's safe-softmax
    test; the attention pattern reads both as one value."""
    rewritten = _MergeCasts().visit_expr(func)
    return relax.analysis.remove_all_unused(rewritten)


@relax.expr_functor.mutator
class _SplitOutputs(relax.PyExprMutator):
    def __init__(self, plan: dict):
        super().__init__()
        self.plan = plan

    def visit_var_binding_(self, binding):
        if binding.var not in self.plan:
            super().visit_var_binding_(binding)
            return
        heads_first = self.visit_expr(self.plan[binding.var])
        bsnv = self.builder_.emit(relax.op.permute_dims(heads_first, [0, 2, 1, 3]))
        self.set_var_remap(binding.var, self.builder_.emit(relax.op.permute_dims(bsnv, [1, 0, 2, 3])))


def sequence_first_attention_outputs(func: relax.Function) -> relax.Function:
    """permute_dims chains taking a batched matmul's (B, N, S, V) result (through a reshape) to
    (S, B, N, V) -> one permute to (B, S, N, V), then one to (S, B, N, V). nn.MultiheadAttention
    is sequence-first: torch.export moves its heads back with three permutes that end in SBNV,
    which the attention kernel (it writes BSNV) cannot write; split this way the region ends at
    the BSNV tensor and the last transpose stays in TVM. Permutes move values only: exact."""
    var2val = get_var2val(func)
    uses: dict = {}

    def count(expr):
        if isinstance(expr, relax.Var):
            uses[expr] = uses.get(expr, 0) + 1

    relax.analysis.post_order_visit(func.body, count)
    consumed = set()  # permutes whose result another permute takes
    for value in var2val.values():
        if _is_call(value, "relax.permute_dims") and isinstance(value.args[0], relax.Var):
            consumed.add(value.args[0])
    plan = {}
    for var, value in var2val.items():
        if not _is_call(value, "relax.permute_dims") or var in consumed or len(_dims(var)) != 4:
            continue
        axes = [0, 1, 2, 3]
        x = var
        while _is_call(var2val.get(x), "relax.permute_dims") and (x is var or uses.get(x, 0) == 1):
            call = var2val[x]
            step = [int(a) for a in call.attrs.axes] if call.attrs.axes is not None else [3, 2, 1, 0]
            axes = [step[a] for a in axes]
            x = call.args[0]
        reshape = var2val.get(x)
        if axes == [2, 0, 1, 3] and _is_call(reshape, "relax.reshape") and _from_matmul(reshape.args[0], var2val, 1):
            plan[var] = x
    if not plan:
        return func
    return relax.analysis.remove_all_unused(_SplitOutputs(plan).visit_expr(func))
