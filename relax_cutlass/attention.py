"""Attention regions: softmax(Q K^T * scale) V as one fused CUTLASS kernel.

Two forms are matched. `R.nn.attention(q, k, v)` (BSNH, no bias or mask), and the decomposed
form frontends produce: two batched matmuls with a scalar scale and a softmax between them, each
operand reached through the views that split and move the heads (permute_dims, reshape, a no-op
broadcast_to), optionally with casts around the softmax. torch.export of a Hugging Face BERT
gives the second form.

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
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from .kernel_spec import Epilogue

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


def _views(x: DFPattern, ops: tuple[str, ...]) -> DFPattern:
    """x, optionally followed by each of `ops` in turn (each one present or not)."""
    for op in ops:
        x = (is_op(op)(x) if op == "relax.permute_dims" else is_op(op)(x, wildcard())) | x
    return x


# The views seen between a head-split q/k/v and its matmul: torch.export writes
# permute -> [permute] -> broadcast_to -> reshape, TVM's own rewrites permute -> reshape -> permute.
_OPERAND_VIEWS = (
    "relax.permute_dims",
    "relax.permute_dims",
    "relax.broadcast_to",
    "relax.reshape",
    "relax.permute_dims",
)
_SCORE_VIEWS = ("relax.reshape", "relax.broadcast_to", "relax.reshape")
_OUTPUT_VIEWS = ("relax.reshape", "relax.permute_dims", "relax.reshape")


@cache
def attention_pattern(spec: AttentionPatternSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """The DFPattern of `spec`, annotated query, key, value, root (the first matmul or the op)."""
    q, k, v = wildcard(), wildcard(), wildcard()
    ann: dict[str, DFPattern] = {"query": q, "key": k, "value": v}
    if spec.form == "op":
        ann["root"] = out = is_op("relax.nn.attention")(q, k, v)
        return out, ann
    ann["root"] = scores = is_op("relax.matmul")(_views(q, _OPERAND_VIEWS), _views(k, _OPERAND_VIEWS))
    scores = _views(scores, _SCORE_VIEWS[:2])
    ann["scale"] = scale = is_const()
    scale_in = scale | is_op("relax.astype")(scale)
    ann["scaled_mul"] = mul = is_op("relax.multiply")(scores, scale_in) | is_op("relax.multiply")(scale_in, scores)
    ann["scaled_div"] = div = is_op("relax.divide")(scores, scale_in)
    scaled = mul | div
    ann["softmax"] = softmax = is_op("relax.nn.softmax")(scaled | is_op("relax.astype")(scaled))
    probs = _views(softmax, _SCORE_VIEWS[1:])
    probs = is_op("relax.astype")(probs) | probs
    ann["second"] = second = is_op("relax.matmul")(probs, _views(v, _OPERAND_VIEWS))
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


class _Tracer:
    """Follows views from one tensor to another, keeping each dimension's logical axes."""

    def __init__(self, var2val, sizes: dict[str, tvm.tirx.PrimExpr]):
        self.var2val = var2val
        self.sizes = sizes
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
        first argument continues the chain."""
        calls = []
        expr = end
        while not expr.same_as(start):
            value = self.var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr
            if value.same_as(start):  # a matched wildcard is the bound value, not the var
                break
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in allowed):
                raise _NotAttention(f"{_name(expr)} is not reached from {_name(start)} through {allowed}")
            calls.append(value)
            expr = value.args[0]
        return calls[::-1]

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


@dataclass(frozen=True)
class AttentionLayout:
    """What a matched region computes: for q, k and v, how each logical axis is read (in
    QUERY_AXES / KEY_AXES / VALUE_AXES order) and the parameter's rank; sizes; the scale."""

    query: tuple[AxisRead, AxisRead, AxisRead, AxisRead]
    key: tuple[AxisRead, AxisRead, AxisRead, AxisRead]
    value: tuple[AxisRead, AxisRead, AxisRead, AxisRead]
    ranks: tuple[int, int, int]
    sizes: dict  # logical axis -> PrimExpr
    scale: float

    @property
    def reads(self) -> tuple:
        """query, key, value reads, in OPERAND_AXES order."""
        return self.query, self.key, self.value


def _operand(tracer: _Tracer, param, matmul_arg, prefix: str, inner: tuple[str, str]) -> tuple[list, Layout]:
    """Trace a q/k/v parameter to its matmul operand. -> (the parameter's dims named
    prefix0..3, the operand's layout); the operand's last two dims must be single axes."""
    names = tuple(f"{prefix}{i}" for i in range(len(_dims(param))))
    layout = tracer.follow(tracer.label(param, names), tracer.chain(matmul_arg, param, _VIEW_OPS))
    if len(layout) < 2 or any(len(g) > 1 for g in layout[-2:]):
        raise _NotAttention(f"the {inner} of the {prefix} operand are not single axes")
    return list(names), layout


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


def _scalar_value(const, cast) -> float:
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
    tracer = _Tracer(var2val, {})
    first, second = ann["root"], ann["second"]
    q_names, q_op = _operand(tracer, ann["query"], first.args[0], "q", ("rows", "head dim"))
    k_names, k_op = _operand(tracer, ann["key"], first.args[1], "k", ("head dim", "rows"))
    v_names, v_op = _operand(tracer, ann["value"], second.args[1], "v", ("rows", "head dim"))
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

    # From the scores to the probabilities: views, casts, the scale and the softmax only.
    score_layout = (*q_batch, rows("S"), rows("T"))
    calls = tracer.chain(
        second.args[0], first, (*_VIEW_OPS, "relax.astype", "relax.multiply", "relax.divide", "relax.nn.softmax")
    )
    layout = score_layout
    for call in calls:
        if call.same_as(ann["softmax"]):
            axis = int(call.attrs.axis)
            if axis not in (-1, len(layout) - 1) or layout[-1] != rows("T"):
                raise _NotAttention(f"softmax over axis {axis} is not over the keys")
        layout = tracer.apply(layout, call)
    if layout != score_layout:
        raise _NotAttention("the probabilities reach the second matmul in another layout than the scores")
    # The output: (B, S, N, V) in memory, however it is grouped.
    out_layout = tracer.follow((*q_batch, rows("S"), rows("V")), tracer.chain(out, second, _VIEW_OPS))
    order = [a for g in out_layout for a in g]
    want = [a for a in ("B", "S", "N", "V") if not _is_one(sizes[a])]
    if order != want:
        raise _NotAttention(f"the output is laid out as {''.join(order)}, not BSNV; the kernel writes (B, S, N, V)")
    const = ann["scale"]
    scale = _scalar_value(const, _cast_of(const, calls))
    if "scaled_div" in ann and any(c.same_as(ann["scaled_div"]) for c in calls):
        scale = 1.0 / scale
    return AttentionLayout(
        _reads(tracer, q_names, q_role, QUERY_AXES),
        _reads(tracer, k_names, k_role, KEY_AXES),
        _reads(tracer, v_names, v_role, VALUE_AXES),
        (len(q_names), len(k_names), len(v_names)),
        sizes,
        scale,
    )


def _cast_of(const, calls: list[relax.Call]):
    """The astype the scale constant goes through before multiplying, if any."""
    for call in calls:
        if call.op.name in ("relax.multiply", "relax.divide"):
            for arg in call.args:
                if isinstance(arg, relax.Call) and arg.op.name == "relax.astype" and arg.args[0].same_as(const):
                    return arg
    return None


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
    try:
        layout = attention_layout(spec, ann, out, var2val)
    except ValueError as err:
        return [str(err)]
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
    if not np.isfinite(layout.scale) or layout.scale == 0:
        problems.append(f"scale {layout.scale} is not a finite non-zero number")
    return problems
