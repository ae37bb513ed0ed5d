"""Read an offloaded Relax function back into its kind's region record.

The composite's name gives its pattern spec; re-matching that spec's pattern on the composite body
recovers which parameter plays which of the kind's roles (operands, bias, residual, ...), so
nothing depends on parameter order.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.analysis import get_var2val

from ..kinds import kind_of
from ..kinds.ir import dtype_of, dtype_or_shape, shape_of
from .constants import composite_of
from .patterns import pattern_of, region_problems, spec_by_name

SHAPE_ROLE = "shape"  # prefix of the role of an R.Shape parameter


class RegionError(ValueError):
    """An offloaded function that relax_cutlass cannot turn into a kernel."""


def analyze(func: relax.Function, symbol: str, accumulator: str = "float32"):
    """-> (spec, roles, problem, composite, aliases) for one offloaded function,
    validated again. `roles` has one role per parameter; `aliases` the (role, parameter's role) pairs
    of a parameter that plays a second role."""
    composite = composite_of(func)
    name = str(composite.attrs["Composite"])
    spec = spec_by_name().get(name)
    if spec is None:
        raise RegionError(f"{symbol}: composite {name!r} is not a relax_cutlass pattern")
    matched = match_composite(composite, spec)
    if matched is None:
        raise RegionError(f"{symbol}: body of {name} no longer matches its pattern")
    ann, out_expr, var2val = matched
    problems = region_problems(spec, ann, out_expr, var2val)
    if problems:
        raise RegionError(f"{symbol}: {'; '.join(problems)}")

    params = list(composite.params)
    roles: list[str | None] = [None] * len(params)
    aliases: list[tuple[str, str]] = []  # (role, role of the parameter that also plays it)
    kind = kind_of(spec)
    for role in kind.roles:
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

    problem = kind.read_problem(spec, ann, out_expr, var2val, accumulator)
    return spec, tuple(roles), problem, composite, tuple(aliases)


def match_composite(composite: relax.Function, spec):
    """-> (annotations, matched output, var2val) of the composite's body, or None. A composite that
    returns a tuple (a region with extra outputs) is matched at the field the pattern's output is."""
    pattern, annotations = pattern_of(spec)
    var2val = get_var2val(composite)
    body = composite.body.body
    for out in body.fields if isinstance(body, relax.Tuple) else [body]:
        matched = pattern.extract_matched_expr(out, var2val)
        if matched is not None:
            ann = {key: matched[pat] for key, pat in annotations.items() if pat in matched}
            return ann, matched[pattern], var2val
    return None


def region_outputs(composite: relax.Function) -> tuple:
    """(role, shape, dtype) of each output of a composite that returns a tuple, in its order (the
    DPS order of the kernel's outputs): "out" for the pattern's output, else the name of the
    annotation the value is (RegionKind.extra_outputs); () for a composite with one output."""
    body = composite.body.body
    if not isinstance(body, relax.Tuple):
        return ()
    spec = spec_by_name()[str(composite.attrs["Composite"])]
    ann, out_expr, var2val = match_composite(composite, spec)
    outputs = []
    for field in body.fields:
        value = var2val.get(field, field)
        if value.same_as(out_expr):
            role = "out"
        else:
            role = next((n for n in kind_of(spec).extra_outputs if n in ann and ann[n].same_as(value)), None)
            if role is None:
                name = composite.attrs["Composite"]
                raise RegionError(f"{name}: output {field} is no annotated value of its pattern")
        outputs.append((role, shape_of(field), dtype_of(field)))
    return tuple(outputs)


def make_region(
    func: relax.Function,
    symbol: str,
    kernel,
    roles,
    composite,
    aliases=(),
    **extra,
):
    """The region record of `kernel`'s kind (`extra`: the kind's own fields, from its `plan`)."""
    # the pattern's own output: the only one, or the tuple's "out" field
    body, outputs = composite.body.body, region_outputs(composite)
    _, out_shape, out_dtype = (
        next(o for o in outputs if o[0] == "out") if outputs else ("out", shape_of(body), dtype_of(body))
    )
    return kind_of(kernel).region_type(
        symbol=symbol,
        kernel=kernel,
        arg_roles=roles,
        role_aliases=aliases,
        arg_shapes=tuple(shape_of(p) for p in composite.params),
        arg_dtypes=tuple(dtype_or_shape(p) for p in composite.params),
        out_shape=out_shape,
        out_dtype=out_dtype,
        outputs=outputs,
        composite=str(composite.attrs["Composite"]),
        **extra,
    )


def covers_body(composite: relax.Function, spec) -> bool:
    """`spec`'s pattern matches the composite's output and takes in every call of its body."""
    pattern, _ = pattern_of(spec)
    var2val = get_var2val(composite)
    calls = [b.value for block in composite.body.blocks for b in block.bindings if isinstance(b.value, relax.Call)]
    body = composite.body.body
    for out in body.fields if isinstance(body, relax.Tuple) else [body]:
        found = pattern.extract_matched_expr(out, var2val)
        if found is not None:
            return all(any(call.same_as(e) for e in found.values()) for call in calls)
    return False
