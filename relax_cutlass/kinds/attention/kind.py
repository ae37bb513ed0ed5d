"""The fused attention kind: softmax(Q K^T * scale [+ bias]) V, decomposed or R.nn.attention, as
CUTLASS's examples/41 kernel (the xFormers forward kernel)."""

from __future__ import annotations

import tvm

from .. import Profiling, RegionKind
from ..ir import rules_at
from ..profiling import ProfileJob
from .causal import constant_causal_masks, split_padding_from_causal_masks
from .diagnose import explain_left_in_tvm
from .emit import attention_glue_function, emit_attention_kernel
from .masks import cast_attention_masks, scalar_where_fills
from .operands import (
    cast_attention_operands,
    merge_repeated_casts,
    merged_batch_transposes,
    sequence_first_attention_outputs,
    splits_before_transposes,
)
from .packed import packed_projection_slices
from .patterns import ATTENTION_OPS, ATTENTION_SPECS, AttentionPatternSpec, attention_pattern
from .problems import attention_flops, attention_problems, read_problem
from .profile import PROFILE_ATTENTION, attention_job
from .records import CAUSAL_CODE, AttentionKernel, AttentionProblem, AttentionRegion, report_line
from .select import attention_label, choose_attention_kernel
from .templates import ARGS_TYPE, ATTENTION_ARGS
from .terms import hoist_position_terms, merge_window_terms


def _independent_inputs(_spec, ann: dict) -> list[tuple]:
    bias = ann.get("bias")
    if bias is None or isinstance(bias, tvm.ir.GenericConst):
        return []
    return [(bias, "the attention's mask/bias is computed from its own scores")]


def _op_left_in_tvm(form: str):
    """The report row of an R.nn.attention call left in TVM (`form` "op" or "op_bias"): its FLOPs
    and why the attention kind refused it."""

    def row(call, var2val, _layout_skipped) -> tuple:
        reasons = rules_at(attention_pattern, attention_problems, AttentionPatternSpec(form), call, var2val)
        return "attention op", attention_flops(call), reasons or []

    return row


def plan(problem: AttentionProblem, _spec, options, db) -> tuple[AttentionKernel, dict]:
    return choose_attention_kernel(problem, options.arch, db if not options.tile else None, options.family), {}


def _jobs(problem: AttentionProblem, arch: int, family: str, _limit: int) -> list[ProfileJob]:
    job = attention_job(problem, arch, family)
    return [job] if job is not None else []


KIND = RegionKind(
    name="attention",
    specs=lambda: list(ATTENTION_SPECS),
    spec_type=AttentionPatternSpec,
    pattern=attention_pattern,
    rules=attention_problems,
    roles=("bias", "query", "key", "value"),
    independent_inputs=_independent_inputs,
    read_problem=read_problem,
    problem_type=AttentionProblem,
    kernel_type=AttentionKernel,
    region_type=AttentionRegion,
    plan=plan,
    emit_kernel=emit_attention_kernel,
    glue_function=attention_glue_function,
    args_type=ARGS_TYPE,
    args=ATTENTION_ARGS,
    profiling=Profiling(
        jobs=_jobs,
        label=lambda kernel, _split_k: attention_label(
            kernel.queries_per_block, kernel.keys_per_block, kernel.schedule
        ),
        timing_function=PROFILE_ATTENTION,
        job_fields=lambda job: {
            "attention": list(job.key.shape),
            "scale": job.problem.scale,
            "causal": CAUSAL_CODE[job.problem.causal],
            "kv_group": job.problem.kv_group,
            "softcap": job.problem.softcap or 0.0,  # the kernel's is compiled in (0: none)
        },
    ),
    report_line=report_line,
    left_in_tvm={op: _op_left_in_tvm(form) for form, op in ATTENTION_OPS.items()},
    explain_left_in_tvm=explain_left_in_tvm,
    # Casts and views that frontends and mixed precision put around attention, brought to the
    # forms the patterns match (around the shared canonicalizations, in this order).
    prepare=(
        merged_batch_transposes,
        splits_before_transposes,
        merge_repeated_casts,
        cast_attention_operands,
        packed_projection_slices,
    ),
    # Masks computed from no input that are causal made canonical, last: each attention's mask is
    # its own binding, which a later rewrite_call would merge into one (CSE).
    finish=(
        sequence_first_attention_outputs,
        scalar_where_fills,
        hoist_position_terms,
        cast_attention_masks,
        split_padding_from_causal_masks,
        constant_causal_masks,
        merge_window_terms,
    ),
    report_refused=True,
)
