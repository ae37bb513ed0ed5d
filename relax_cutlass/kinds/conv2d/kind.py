"""The conv2d kind: NHWC x OHWI forward convolution (+ bias, activation, residual add(+relu)) as a
CUTLASS 2.x implicit GEMM, with serial split-K where the output cannot fill the GPU, or as a CUTLASS
3.x kernel (TMA im2col + wgmma on sm_90a, + tcgen05 on sm_100a / sm_103a / sm_110a: emit_3x.py);
grouped convs (1 < groups, not depthwise: + bias, activation) as its grouped kernels (groups.py)."""

from __future__ import annotations

from .. import Profiling, RegionKind
from ..epilogue import Epilogue
from ..epilogue_patterns import epilogue_problems, residual_input
from ..gemm.profile import candidate_label
from ..gemm.records import TILE_SPELLING
from ..nhwc import conv1d_refusal, conv_flops
from ..profiling import ProfileJob, by_label
from ..region import mnk_report_line
from .channels import pad_odd_input_channels
from .emit import conv2d_glue_function, emit_conv2d_kernel
from .groups import grouped_epilogue_problems
from .patterns import (
    Conv2dPatternSpec,
    all_conv2d_specs,
    conv2d_pattern,
    conv2d_problems,
    left_in_tvm_row,
    read_problem,
)
from .profile import PROFILE_CONV2D, conv2d_candidates, split_k_uncertain
from .records import Conv2dKernel, Conv2dProblem, Conv2dRegion, conv2d_key
from .select import choose_conv2d_kernel, conv2d_family, conv2d_tiles, splits_k
from .supergroups import merge_narrow_groups
from .templates import ARGS_TYPE, CONV2D_ARGS


def _rules(spec, ann, out, _var2val) -> list[str]:
    root = ann["root"]
    return (
        conv2d_problems(root)
        or grouped_epilogue_problems(int(root.attrs.groups), spec.residual)
        or epilogue_problems(spec, ann, out)
    )


def plan(problem: Conv2dProblem, spec, options, db) -> tuple[Conv2dKernel, dict]:
    kernel, split_k = choose_conv2d_kernel(problem, spec.epilogue, options.arch, 1, options.family, options.tile, db)
    # A symbolic batch can grow past what the slice count was chosen for: no split-K then.
    return kernel, {"split_k": split_k if problem.n is not None else 1}


def _keys(problem: Conv2dProblem, arch: int, family: str) -> list[tuple]:
    """Static batches only: a symbolic one gets the heuristic (the report says so)."""
    return [] if problem.n is None else [(conv2d_key(problem, arch, conv2d_family(problem, arch, family)), problem)]


def _jobs(problem: Conv2dProblem, arch: int, family: str, limit: int) -> list[ProfileJob]:
    return [
        ProfileJob(
            key,
            problem,
            tuple(
                (Conv2dKernel(problem, Epilogue(), t, target=arch, selected_by="profiling"), split)
                for t, split in conv2d_candidates(problem, arch, limit, family)
            ),
        )
        for key, _ in _keys(problem, arch, family)
    ]


def _stage2_candidates(p: Conv2dProblem, epilogue: Epilogue, arch: int, key, record) -> tuple:
    family = "auto" if key.family != 80 else "sm80"
    heuristic, split = choose_conv2d_kernel(p, epilogue, arch, family=family)
    # A split tile is timed unsplit where the epilogue (a residual) rules split-K out (splits_k).
    ranked = by_label(conv2d_tiles(p, arch, family), record)
    return heuristic, split, [(t, s if splits_k(p, epilogue, t) else 1) for t, s in ranked]


def _job_fields(job: ProfileJob) -> dict:
    p = job.problem
    return {"conv": [p.n, p.h, p.w, p.c, p.k, p.r, p.s, p.p, p.q, *p.pad, *p.stride, *p.dilation, p.groups]}


def _report_line(r: dict) -> str:
    conv = r["conv"]
    detail = (
        f" {'x'.join(map(str, conv['kernel_size']))} stride {conv['stride']} pad {conv['padding']}"
        + (f" groups {conv['groups']}" if conv["groups"] > 1 else "")
        + (f" split-K {conv['split_k']}" if conv["split_k"] > 1 else "")
    )
    return mnk_report_line(r, detail)


def conv1d_left_in_tvm_row(call, _var2val, _layout_skipped) -> tuple:
    """A conv1d left in TVM: offload_pipeline rewrites the NCW ones as conv2d (Conv1dAsConv2d)."""
    why = conv1d_refusal(call) or (
        "a conv1d is offloaded as a conv2d of height 1, which offload_pipeline's Conv1dAsConv2d writes before "
        "partitioning; run offload_pipeline (or relax_cutlass.transform.Conv1dAsConv2d first)"
    )
    return "conv1d", conv_flops(call), [why]


KIND = RegionKind(
    name="conv2d",
    specs=all_conv2d_specs,
    spec_type=Conv2dPatternSpec,
    pattern=conv2d_pattern,
    rules=_rules,
    roles=("data", "weight", "bias", "residual"),
    independent_inputs=residual_input,
    read_problem=read_problem,
    problem_type=Conv2dProblem,
    kernel_type=Conv2dKernel,
    region_type=Conv2dRegion,
    plan=plan,
    emit_kernel=emit_conv2d_kernel,
    glue_function=conv2d_glue_function,
    args_type=ARGS_TYPE,
    args=CONV2D_ARGS,
    profiling=Profiling(
        jobs=_jobs,
        label=lambda kernel, split_k: candidate_label(kernel.tile, split_k),
        timing_function=PROFILE_CONV2D,
        job_fields=_job_fields,
        stage2_keys=_keys,
        stage2_candidates=_stage2_candidates,
        uncertain=split_k_uncertain,
    ),
    report_line=_report_line,
    flops_name="conv2d",
    left_in_tvm={"relax.nn.conv2d": left_in_tvm_row, "relax.nn.conv1d": conv1d_left_in_tvm_row},
    # after the shared canonicalizations, so that the conv is the 16-bit one its patterns match
    finish=(pad_odd_input_channels, merge_narrow_groups),
    tile_spelling=TILE_SPELLING,
)
