"""Read an offloaded Relax function back into a `GemmRegion` record.

The composite's name gives its `GemmPatternSpec`; re-matching that spec's pattern on the composite
body recovers which parameter is lhs / rhs / bias / residual, so nothing depends on parameter order.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.analysis import get_var2val

from .constants import composite_of
from .kernel_spec import GemmKernel, GemmProblem, GemmRegion
from .patterns import dtype_of, gemm_pattern, region_problems, spec_by_name

ROLES = ("lhs", "rhs", "bias", "residual")


class RegionError(ValueError):
    """An offloaded function that relax_cutlass cannot turn into a kernel."""


def _dim(d) -> int | str:
    return int(d) if hasattr(d, "value") else str(d)


def _shape(expr) -> tuple[int | str, ...]:
    return tuple(_dim(d) for d in expr.ty.shape.values)


def analyze(func: relax.Function, symbol: str, accumulator: str = "float32"):
    """-> (spec, roles, GemmProblem) for one offloaded function, validating it again."""
    composite = composite_of(func)
    name = str(composite.attrs["Composite"])
    spec = spec_by_name().get(name)
    if spec is None:
        raise RegionError(f"{symbol}: composite {name!r} is not a relax_cutlass pattern")
    pattern, annotations = gemm_pattern(spec)
    out = composite.body.body
    matched = pattern.extract_matched_expr(out, get_var2val(composite))
    if matched is None:
        raise RegionError(f"{symbol}: body of {name} no longer matches its pattern")
    ann = {key: matched[pat] for key, pat in annotations.items() if pat in matched}
    out_expr = matched[pattern]
    problems = region_problems(spec, ann, out_expr)
    if problems:
        raise RegionError(f"{symbol}: {'; '.join(problems)}")

    params = list(composite.params)
    roles: list[str | None] = [None] * len(params)
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
        roles[next(i for i, p in enumerate(params) if expr.same_as(p))] = role
    if None in roles:
        raise RegionError(
            f"{symbol}: parameters {[p.name for p, r in zip(params, roles, strict=True) if r is None]} have no role"
        )

    root = ann["root"]
    rhs_shape = _shape(ann["rhs"])
    n, k = rhs_shape if spec.b_transposed else rhs_shape[::-1]
    lhs_shape = _shape(ann["lhs"])
    m = 1
    for d in lhs_shape[:-1]:
        m = m * d if isinstance(d, int) and isinstance(m, int) else None
    # fp32 outputs and bf16 inputs always accumulate in fp32 (tensor cores have no bf16 accumulator).
    acc = "float32" if dtype_of(root) == "float32" or dtype_of(ann["lhs"]) == "bfloat16" else accumulator
    problem = GemmProblem(
        m=m,
        n=int(n),
        k=int(k),
        b_transposed=spec.b_transposed,
        element_a=dtype_of(ann["lhs"]),
        element_b=dtype_of(ann["rhs"]),
        element_out=dtype_of(out_expr),
        element_accumulator=acc,
    )
    return spec, tuple(roles), problem, composite


def make_region(func: relax.Function, symbol: str, kernel: GemmKernel, roles, composite) -> GemmRegion:
    return GemmRegion(
        symbol=symbol,
        kernel=kernel,
        arg_roles=roles,
        arg_shapes=tuple(_shape(p) for p in composite.params),
        arg_dtypes=tuple(dtype_of(p) for p in composite.params),
        out_shape=_shape(composite.body.body),
        out_dtype=dtype_of(composite.body.body),
        composite=str(composite.attrs["Composite"]),
    )
