"""The patterns of the conv2d kind (NHWC x OHWI conv2d + epilogue), its legality rules, how a matched
region reads back into a Conv2dProblem, and the report row of a conv2d left in TVM."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from .. import CODEGEN
from ..epilogue_patterns import (
    SUPPORTED_INPUT_DTYPES,
    EpilogueSpec,
    dtype_of,
    epilogue_pattern,
    epilogue_specs,
    shape_dims,
    static_int,
)
from ..ir import accumulator_for, is_depthwise, shape_of
from ..nhwc import conv_flops, conv_geometry_of, layout_problem
from .groups import grouped_conv_problems
from .records import Conv2dProblem
from .select import grouped_tile_widths


@dataclass(frozen=True)
class Conv2dPatternSpec(EpilogueSpec):
    """The shape of one conv2d composite: conv2d root, then bias, activation, residual add(+relu)."""

    bias: bool = False
    activation: str = "identity"
    residual: bool = False
    residual_relu: bool = False
    cast: bool = False  # never set: conv outputs keep the input dtype (see conv2d_problems)

    @property
    def name(self) -> str:
        return f"{CODEGEN}." + "_".join(["conv2d", *self.epilogue.parts()])

    @property
    def size(self) -> int:
        return 1 + self.bias + (self.activation != "identity") * 2 + self.residual + self.residual_relu


def all_conv2d_specs() -> list[Conv2dPatternSpec]:
    """Every supported epilogue, largest first."""
    return epilogue_specs(Conv2dPatternSpec)


@cache
def conv2d_pattern(spec: Conv2dPatternSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Build the DFPattern for `spec` with annotations data, weight, root, [bias], [residual], ..."""
    data, weight = wildcard(), wildcard()
    ann: dict[str, DFPattern] = {"data": data, "weight": weight}
    ann["root"] = root = is_op("relax.nn.conv2d")(data, weight)
    out = epilogue_pattern(root, ann, spec)
    return out, dict(ann)


def conv2d_problems(conv: relax.Call, layout_skipped: str | None = None) -> list[str]:
    """Why this R.nn.conv2d cannot become a CUTLASS implicit-GEMM fprop kernel, ungrouped or grouped
    (groups.py); empty when it can. Depthwise convs (groups == C == K) are the depthwise kind's.

    layout_skipped: why ConvertToNHWC left the conv's function in NCHW, if it did."""
    data, weight = conv.args
    problems = [why] if (why := layout_problem(conv, layout_skipped)) else []
    in_dtype = dtype_of(data)
    if in_dtype not in SUPPORTED_INPUT_DTYPES or dtype_of(weight) != in_dtype:
        problems.append(
            f"data/weight dtypes {in_dtype}/{dtype_of(weight)}: both must be one of {SUPPORTED_INPUT_DTYPES}"
        )
    if dtype_of(conv) != in_dtype:
        problems.append(f"out_dtype {dtype_of(conv)} differs from the input dtype {in_dtype}")
    dshape, wshape, oshape = shape_dims(data), shape_dims(weight), shape_dims(conv)
    if len(dshape) != 4 or len(wshape) != 4 or len(oshape) != 4:
        problems.append("data, weight and output must be 4-D")
        return problems
    static = [static_int(d) for d in (*dshape[1:], *wshape, *oshape[1:])]
    if None in static:
        problems.append("H, W, C and the filter shape must be static; only the batch N may be symbolic")
        return problems
    if problems:
        return problems
    c, k, groups = static_int(dshape[3]), static_int(wshape[0]), int(conv.attrs.groups)
    if static_int(wshape[3]) * groups != c:
        problems.append(f"filter channels {wshape[3]} x groups {groups} do not match the input's C={c}")
    if groups > 1:
        problems += grouped_conv_problems(c, k, groups, grouped_tile_widths(in_dtype))
    elif c % 2 or k % 2:
        problems.append(
            f"C={c} and K={k} must both be even (fp16 tensor-op kernels need at least 2-element aligned "
            "channels); an odd C (an RGB stem) is padded to 8 channels when the filter is a constant: bind the "
            "weights (from_torch, or BindParams then FoldConstant) to offload it"
        )
    return problems


def read_problem(spec, ann, out_expr, _var2val, accumulator: str) -> Conv2dProblem:
    return Conv2dProblem(
        k=shape_of(ann["weight"])[0],
        groups=int(ann["root"].attrs.groups),
        element_accumulator=accumulator_for(ann["root"], ann["data"], accumulator),
        **conv_geometry_of(ann),
    )


def left_in_tvm_row(call: relax.Call, _var2val, layout_skipped: str | None) -> tuple | None:
    """(op, FLOPs, reasons) of a conv2d left in TVM; None for a depthwise one (its kind reports it)."""
    if is_depthwise(call):
        return None
    return "conv2d", conv_flops(call), conv2d_problems(call, layout_skipped)
