"""The channel-affine kind's record: everything the shared stages need (docs/architecture.md)."""

from __future__ import annotations

from .. import RegionKind
from ..region import calls_suffix
from .emit import ARGS, ARGS_TYPE, emit_kernel, glue_function
from .patterns import (
    ACTIVATIONS,
    BN_PARAMETERS,
    ChannelAffineSpec,
    all_specs,
    left_in_tvm_row,
    part_role,
    pattern,
    read_problem,
    rules,
)
from .records import MAX_PARTS, ChannelAffineKernel, ChannelAffineProblem, ChannelAffineRegion


def plan(problem: ChannelAffineProblem, _spec, options, _db) -> tuple[ChannelAffineKernel, dict]:
    """One kernel per dtype and activation: nothing to choose, nothing to tune."""
    return ChannelAffineKernel(problem, target=options.arch, note="CUDA per-channel batch norm of the parts"), {}


def report_line(r: dict) -> str:
    rows, channels, _ = r["mnk"]
    return (
        f"  [offloaded] channel_affine rows={rows} channels={channels} parts={r['parts']} "
        f"eps={r['epsilon']:g} epilogue={r['epilogue']} kernel={r['kernel']}" + calls_suffix(r)
    )


KIND = RegionKind(
    name="channel_affine",
    specs=all_specs,
    spec_type=ChannelAffineSpec,
    pattern=pattern,
    rules=rules,
    roles=(*(part_role(i) for i in range(MAX_PARTS)), *BN_PARAMETERS),
    independent_inputs=lambda _spec, _ann: [],
    read_problem=read_problem,
    problem_type=ChannelAffineProblem,
    kernel_type=ChannelAffineKernel,
    region_type=ChannelAffineRegion,
    plan=plan,
    emit_kernel=emit_kernel,
    glue_function=glue_function,
    args_type=ARGS_TYPE,
    args=ARGS,
    report_line=report_line,
    left_in_tvm={f"relax.nn.{a}": left_in_tvm_row for a in ACTIVATIONS},
)
