"""Read an offloaded Relax function back into a `GemmRegion` / `Conv2dRegion` record.

The composite's name gives its pattern spec; re-matching that spec's pattern on the composite body
recovers which parameter is lhs / rhs (data / weight) / bias / residual, so nothing depends on
parameter order.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.analysis import get_var2val

from ..attention import AttentionPatternSpec, attention_layout
from ..kernel_spec import (
    AttentionKernel,
    AttentionProblem,
    AttentionRegion,
    Conv2dKernel,
    Conv2dProblem,
    Conv2dRegion,
    GemmKernel,
    GemmProblem,
    GemmRegion,
)
from ..patterns import Conv2dPatternSpec, dtype_of, pattern_of, region_problems, spec_by_name
from .constants import composite_of

ROLES = ("lhs", "rhs", "data", "weight", "bias", "residual", "query", "key", "value")
SHAPE_ROLE = "shape"  # prefix of the role of an R.Shape parameter


class RegionError(ValueError):
    """An offloaded function that relax_cutlass cannot turn into a kernel."""


def _dim(d) -> int | str:
    return int(d) if hasattr(d, "value") else str(d)


def _shape(expr) -> tuple[int | str, ...]:
    if isinstance(expr.ty, relax.ShapeType):
        return tuple(_dim(d) for d in expr.ty.values) if expr.ty.values is not None else ()
    return tuple(_dim(d) for d in expr.ty.shape.values)


def _dtype(expr) -> str:
    return "shape" if isinstance(expr.ty, relax.ShapeType) else dtype_of(expr)


def analyze(func: relax.Function, symbol: str, accumulator: str = "float32"):
    """-> (spec, roles, GemmProblem | Conv2dProblem, composite, aliases) for one offloaded function,
    validated again. `roles` has one role per parameter; `aliases` the (role, parameter's role) pairs
    of a parameter that plays a second role."""
    composite = composite_of(func)
    name = str(composite.attrs["Composite"])
    spec = spec_by_name().get(name)
    if spec is None:
        raise RegionError(f"{symbol}: composite {name!r} is not a relax_cutlass pattern")
    pattern, annotations = pattern_of(spec)
    out = composite.body.body
    var2val = get_var2val(composite)
    matched = pattern.extract_matched_expr(out, var2val)
    if matched is None:
        raise RegionError(f"{symbol}: body of {name} no longer matches its pattern")
    ann = {key: matched[pat] for key, pat in annotations.items() if pat in matched}
    out_expr = matched[pattern]
    problems = region_problems(spec, ann, out_expr, var2val)
    if problems:
        raise RegionError(f"{symbol}: {'; '.join(problems)}")

    params = list(composite.params)
    roles: list[str | None] = [None] * len(params)
    aliases: list[tuple[str, str]] = []  # (role, role of the parameter that also plays it)
    for role in ROLES:
        if role not in ann:
            continue
        expr = ann[role]
        if not isinstance(expr, relax.Var) or not any(expr.same_as(p) for p in params):
            raise RegionError(
                f"{symbol}: the {role} of {name} is {type(expr).__name__}, not a parameter; run "
                "relax_cutlass.transform.LiftConstants() before codegen so tensor constants become "
                "parameters (generated C++ never embeds tensor data)"
            )
        index = next(i for i, p in enumerate(params) if expr.same_as(p))
        if roles[index] is None:
            roles[index] = role
        else:  # one tensor in two roles, e.g. y = act(x @ w + b) + x: the residual is the lhs
            aliases.append((role, roles[index]))
    for index, param in enumerate(params):
        # A view with a symbolic shape (reshape to (batch * heads, S, H)) takes its shape as an
        # argument once fused: the kernel reads sizes from the tensors, so it is only passed along.
        if roles[index] is None and isinstance(param.ty, relax.ShapeType):
            roles[index] = f"{SHAPE_ROLE}{index}"
    if None in roles:
        raise RegionError(
            f"{symbol}: parameters {[p.name for p, r in zip(params, roles, strict=True) if r is None]} have no role"
        )

    if isinstance(spec, AttentionPatternSpec):
        problem = _attention_problem(spec, ann, out_expr, var2val)
    else:
        problem = (_conv2d_problem if isinstance(spec, Conv2dPatternSpec) else _gemm_problem)(
            spec, ann, out_expr, accumulator
        )
    return spec, tuple(roles), problem, composite, tuple(aliases)


def _accumulator(root, inputs, requested: str) -> str:
    # fp32 outputs and bf16 inputs always accumulate in fp32 (tensor cores have no bf16 accumulator).
    return "float32" if dtype_of(root) == "float32" or dtype_of(inputs) == "bfloat16" else requested


def _gemm_problem(spec, ann, out_expr, accumulator: str) -> GemmProblem:
    rhs_shape = _shape(ann["rhs"])
    n, k = rhs_shape if spec.b_transposed else rhs_shape[::-1]
    m = 1
    for d in _shape(ann["lhs"])[:-1]:
        m = m * d if isinstance(d, int) and isinstance(m, int) else None
    return GemmProblem(
        m=m,
        n=int(n),
        k=int(k),
        b_transposed=spec.b_transposed,
        element_a=dtype_of(ann["lhs"]),
        element_b=dtype_of(ann["rhs"]),
        element_out=dtype_of(out_expr),
        element_accumulator=_accumulator(ann["root"], ann["lhs"], accumulator),
    )


def _conv2d_problem(spec, ann, out_expr, accumulator: str) -> Conv2dProblem:
    conv = ann["root"]
    n, h, w, c = _shape(ann["data"])
    k, r, s, _ = _shape(ann["weight"])
    _, p, q, _ = _shape(conv)
    attrs = conv.attrs
    return Conv2dProblem(
        n=n if isinstance(n, int) else None,
        h=h, w=w, c=c, k=k, r=r, s=s, p=p, q=q,
        pad=(int(attrs.padding[0]), int(attrs.padding[1])),
        stride=tuple(int(v) for v in attrs.strides),
        dilation=tuple(int(v) for v in attrs.dilation),
        element=dtype_of(ann["data"]),
        element_accumulator=_accumulator(conv, ann["data"], accumulator),
    )  # fmt: skip


def _attention_problem(spec, ann, out_expr, var2val) -> AttentionProblem:
    layout = attention_layout(spec, ann, out_expr, var2val)

    def size(axis: str) -> int | None:
        d = layout.sizes[axis]
        return int(d) if hasattr(d, "value") else None

    return AttentionProblem(
        batch=size("B"),
        heads=int(layout.sizes["N"]),
        seq_q=size("S"),
        seq_kv=size("T"),
        head_dim=int(layout.sizes["H"]),
        head_dim_value=int(layout.sizes["V"]),
        scale=layout.scale,
        element=dtype_of(ann["query"]),
        query_reads=layout.query,
        key_reads=layout.key,
        value_reads=layout.value,
        bias_reads=layout.bias,
        masked_rows=layout.masked_rows,
    )


def make_region(
    func: relax.Function,
    symbol: str,
    kernel: GemmKernel | Conv2dKernel | AttentionKernel,
    roles,
    composite,
    aliases=(),
    **extra,
) -> GemmRegion | Conv2dRegion | AttentionRegion:
    record = {Conv2dKernel: Conv2dRegion, AttentionKernel: AttentionRegion}.get(type(kernel), GemmRegion)
    return record(
        symbol=symbol,
        kernel=kernel,
        arg_roles=roles,
        role_aliases=aliases,
        arg_shapes=tuple(_shape(p) for p in composite.params),
        arg_dtypes=tuple(_dtype(p) for p in composite.params),
        out_shape=_shape(composite.body.body),
        out_dtype=dtype_of(composite.body.body),
        composite=str(composite.attrs["Composite"]),
        **extra,
    )
