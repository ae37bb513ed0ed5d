"""The norm kind: [residual add ->] LayerNorm / RMSNorm over the last axis [-> cast] as one
row-wise CUDA kernel (a warp per row up to n = 1024, a CTA per row above), which also writes the
sum and the un-cast norm where the graph uses them outside the region (RegionKind.extra_outputs)."""

from __future__ import annotations

from .. import RegionKind
from ..ir import rules_at
from ..region import calls_suffix
from .emit import emit_kernel, glue_function
from .patterns import NormSpec, all_specs, pattern, read_problem, rules
from .records import NormKernel, NormProblem, NormRegion
from .templates import ARGS, ARGS_TYPE


def plan(problem: NormProblem, _spec, options, _db) -> tuple[NormKernel, dict]:
    """One kernel per problem (its row layout follows from n): nothing to choose, nothing to tune."""
    kernel = NormKernel(problem, target=options.arch, note="CUDA row-wise norm (statistics in float32)")
    return kernel, {}


def _left_in_tvm(norm: str):
    """The report row of a `norm` op (R.nn.layer_norm / R.nn.rms_norm) left in TVM: why the norm
    kind refused it (no FLOPs: the kind is memory-bound)."""

    def row(call, var2val, _layout_skipped) -> tuple:
        return norm, 0, rules_at(pattern, rules, NormSpec(norm), call, var2val) or []

    return row


def report_line(r: dict) -> str:
    rows, n, _ = r["mnk"]
    dtypes = r["dtypes"]
    return (
        f"  [offloaded] norm {r['norm']} rows={rows} n={n} eps={r['epsilon']:g} residual={r['residual']} "
        f"outputs={','.join(r['output_roles'])} {dtypes.get('data')}->{dtypes['out']} kernel={r['kernel']}"
        + calls_suffix(r)
    )


KIND = RegionKind(
    name="norm",
    specs=all_specs,
    spec_type=NormSpec,
    pattern=pattern,
    rules=rules,
    roles=("data", "residual", "gamma", "beta"),
    independent_inputs=lambda _spec, _ann: [],
    read_problem=read_problem,
    problem_type=NormProblem,
    kernel_type=NormKernel,
    region_type=NormRegion,
    plan=plan,
    emit_kernel=emit_kernel,
    glue_function=glue_function,
    args_type=ARGS_TYPE,
    args=ARGS,
    report_line=report_line,
    left_in_tvm={f"relax.nn.{norm}": _left_in_tvm(norm) for norm in ("layer_norm", "rms_norm")},
    report_refused=True,
    extra_outputs=("sum", "norm"),
)
