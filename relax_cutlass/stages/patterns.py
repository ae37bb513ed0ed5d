"""Patterns for FuseOpsByPattern: every registered kind's specs, their checks, and the spec a
composite's name stands for.

A pattern is built from a spec (data), never from its name string; the spec is also what codegen
reads back from a composite's name, so partition and codegen cannot drift apart.
"""

from __future__ import annotations

from functools import cache

from tvm import relax

from ..kinds import generation, kind_of, kinds


def all_specs() -> list:
    """Every pattern of every kind, largest first (the sort is stable: kinds in registration order
    at equal size)."""
    return sorted([spec for kind in kinds() for spec in kind.specs()], key=lambda s: -s.size)


def clear_caches() -> None:
    """Forget the built patterns and specs (after the set of activations or kinds changed)."""
    for kind in kinds():
        if hasattr(kind.pattern, "cache_clear"):
            kind.pattern.cache_clear()
    _specs_by_name.cache_clear()


def pattern_of(spec) -> tuple:
    """(DFPattern, {annotation name: DFPattern}) of `spec`."""
    return kind_of(spec).pattern(spec)


def spec_by_name() -> dict:
    """{composite name: spec} of every registered kind's patterns."""
    return _specs_by_name(generation())


@cache
def _specs_by_name(_generation: int) -> dict:
    return {s.name: s for s in all_specs()}


# Legality: each rule returns the problems it finds as sentences, so the same rules drive the
# pattern check (offload or not) and the offload report (why not).


def region_problems(spec, ann: dict[str, relax.Expr], out: relax.Expr, var2val=None) -> list[str]:
    """All legality problems of one matched region (`var2val`: the bindings of the region, for
    rules that follow chains of views)."""
    return kind_of(spec).rules(spec, ann, out, var2val or {})


def _make_check(spec, log=None):
    """The pattern check: offload iff `check_problems` finds none; `log.record(spec, ctx, problems)`
    sees every decision (PartitionForCutlass uses it to report refused fusions)."""

    def check(ctx: relax.transform.PatternCheckContext) -> bool:
        problems = check_problems(spec, ctx)
        if log is not None:
            log.record(spec, ctx, problems)
        return not problems

    return check


def check_problems(spec, ctx: relax.transform.PatternCheckContext) -> list[str]:
    """Why the structurally matched region `ctx` must not be offloaded as `spec` (empty: it may)."""
    ann = dict(ctx.annotated_expr)
    if leaking := leaking_intermediates(spec, ctx, ann):
        return [
            f"an intermediate value of the region ({', '.join(sorted(leaking))}) is also used outside it "
            "(a fused kernel does not produce it)"
        ]
    for expr, reason in kind_of(spec).independent_inputs(spec, ann):
        if not _independent(expr, ann, ctx):
            return [reason]
    var2val = {var: value for value, var in ctx.value_to_bound_var.items()} | dict(ctx.matched_bindings)
    return region_problems(spec, ann, ctx.matched_expr, var2val)


def leaking_intermediates(spec, ctx, ann: dict) -> list[str]:
    """The intermediate values of the matched region `ctx` used outside it that the kernel does not
    produce (by annotation name, else "a <op> value"): every one, unless the spec's kind lists its
    annotation in `extra_outputs` (the region then returns it too). As TVM's
    has_leaking_intermediate_variables, a value that is not a DataflowVar counts as used outside."""
    output_var = ctx.value_to_bound_var[ctx.matched_expr]
    allowed = {
        ctx.value_to_bound_var[ann[name]]
        for name in kind_of(spec).extra_outputs
        if name in ann and ann[name] in ctx.value_to_bound_var
    }
    names = {ctx.value_to_bound_var[e]: n for n, e in ann.items() if e in ctx.value_to_bound_var}
    defined = set(ctx.matched_bindings.keys())
    leaking = []
    for var, value in ctx.matched_bindings.items():
        if var.same_as(output_var):
            continue
        used_outside = not isinstance(var, relax.DataflowVar) or any(u not in defined for u in ctx.var_usages[var])
        if used_outside and (var not in allowed or not isinstance(var, relax.DataflowVar)):
            op = value.op.name if isinstance(value, relax.Call) and hasattr(value.op, "name") else "a binding's"
            leaking.append(names.get(var, f"the {op} result"))
    return leaking


def _independent(expr, ann, ctx) -> bool:
    """A region input (a residual, a mask) must not be computed from the region's root
    (it would be read before written)."""
    from tvm.relax.backend.cuda.cutlass import _has_dependency

    if not isinstance(expr, relax.Var):
        expr = ctx.value_to_bound_var.get(expr)
        if expr is None:
            return False
    root_var = ctx.value_to_bound_var[ann["root"]]
    return not _has_dependency(from_var=expr, to_var=root_var, var_usages=ctx.var_usages)


def fusion_patterns(log=None) -> list[relax.transform.FusionPattern]:
    """All relax_cutlass patterns, in priority order, for FuseOpsByPattern (`log`: see _make_check)."""
    return [relax.transform.FusionPattern(spec.name, *pattern_of(spec), _make_check(spec, log)) for spec in all_specs()]
