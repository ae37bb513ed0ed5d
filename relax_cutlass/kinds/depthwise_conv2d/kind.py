"""The depthwise conv2d kind: NHWC x (C, R, S, 1) convolutions with groups == C == K (+ bias,
activation) on relax_cutlass's blocked direct kernel (dilation 1, stride 1 or 2; fp16 and bf16)
or else CUTLASS 2.x's SIMT direct convolution (examples/46); both run on every arch from sm_80."""

from __future__ import annotations

from .. import RegionKind
from ..region import calls_suffix
from .emit import depthwise_glue_function, emit_depthwise_kernel
from .patterns import (
    DepthwisePatternSpec,
    all_depthwise_specs,
    depthwise_pattern,
    depthwise_rules,
    left_in_tvm_row,
    read_problem,
)
from .records import DepthwiseKernel, DepthwiseProblem, DepthwiseRegion
from .select import TILE_SPELLING, choose_depthwise_kernel
from .templates import ARGS_TYPE, DWCONV2D_ARGS


def plan(problem: DepthwiseProblem, spec, options, _db) -> tuple[DepthwiseKernel, dict]:
    """The heuristic's kernel (not profiled yet: one tile per filter size), or the pinned tile."""
    kernel, split_k = choose_depthwise_kernel(problem, spec.epilogue, options.arch, options.family, options.tile)
    return kernel, {"split_k": split_k}


def _report_line(r: dict) -> str:
    conv = r["conv"]
    m, c, rs = r["mnk"]
    return (
        f"  [offloaded] dwconv2d N*P*Q={m} C={c} {'x'.join(map(str, conv['kernel_size']))} stride {conv['stride']} "
        f"pad {conv['padding']} epilogue={r['epilogue']} kernel={r['kernel']} ({r['selected_by']}; {r['note']})"
        + calls_suffix(r)
    )


KIND = RegionKind(
    name="depthwise_conv2d",
    specs=all_depthwise_specs,
    spec_type=DepthwisePatternSpec,
    pattern=depthwise_pattern,
    rules=depthwise_rules,
    roles=("data", "weight", "bias"),
    independent_inputs=lambda _spec, _ann: [],
    read_problem=read_problem,
    problem_type=DepthwiseProblem,
    kernel_type=DepthwiseKernel,
    region_type=DepthwiseRegion,
    plan=plan,
    emit_kernel=emit_depthwise_kernel,
    glue_function=depthwise_glue_function,
    args_type=ARGS_TYPE,
    args=DWCONV2D_ARGS,
    report_line=_report_line,
    flops_name="dwconv2d",
    left_in_tvm={"relax.nn.conv2d": left_in_tvm_row},
    tile_spelling=TILE_SPELLING,
)
