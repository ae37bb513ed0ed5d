"""The bias + activation kind's record: everything the shared stages need (docs/architecture.md)."""

from __future__ import annotations

from .. import RegionKind
from .emit import ARGS, ARGS_TYPE, emit_kernel, glue_function
from .patterns import BiasActSpec, all_specs, pattern, read_problem, rules
from .records import BiasActKernel, BiasActProblem, BiasActRegion


def plan(problem: BiasActProblem, _spec, options, _db) -> tuple[BiasActKernel, dict]:
    """One kernel per dtype and activation: nothing to choose, nothing to tune."""
    return BiasActKernel(problem, target=options.arch), {}


def report_line(r: dict) -> str:
    rows, n, _ = r["mnk"]
    return f"  [offloaded] bias_act rows={rows} n={n} epilogue={r['epilogue']} kernel={r['kernel']}"


KIND = RegionKind(
    name="bias_act",
    specs=all_specs,
    spec_type=BiasActSpec,
    pattern=pattern,
    rules=rules,
    roles=("data", "bias"),
    independent_inputs=lambda _spec, _ann: [],
    read_problem=read_problem,
    problem_type=BiasActProblem,
    kernel_type=BiasActKernel,
    region_type=BiasActRegion,
    plan=plan,
    emit_kernel=emit_kernel,
    glue_function=glue_function,
    args_type=ARGS_TYPE,
    args=ARGS,
    report_line=report_line,
)
