"""What the NHWC convolution kinds (conv2d, depthwise_conv2d) share: their layouts, FLOP count,
the shape checks of their glue functions and the geometry of their report rows."""

from __future__ import annotations

import math

from tvm import relax

from ..toolkit.glue import launch_call, operand_arrays, unpack_args
from .ir import dtype_of, shape_of, static_shape

# NHWC activations x OHWI filters (what ConvertToNHWC produces).
CONV2D_LAYOUTS = {"data_layout": "NHWC", "kernel_layout": "OHWI", "out_layout": "NHWC"}


def layout_problem(conv: relax.Call, layout_skipped: str | None) -> str | None:
    """Why `conv` is not NHWC/OHWI (None when it is); layout_skipped: why ConvertToNHWC left the
    conv's function in NCHW, if it did."""
    layouts = {key: str(getattr(conv.attrs, key)) for key in CONV2D_LAYOUTS}
    if layouts == CONV2D_LAYOUTS:
        return None
    return f"layouts {layouts} are not NHWC/OHWI; " + (
        f"ConvertToNHWC skipped the layout conversion of this function ({layout_skipped})"
        if layout_skipped
        else "run relax_cutlass.transform.ConvertToNHWC() first (offload_pipeline does)"
    )


def conv_geometry_of(ann: dict) -> dict:
    """The shape and geometry fields of a matched NHWC x OHWI conv (annotations data, weight,
    root), as both conv kinds' problem records take them (the batch None when symbolic)."""
    conv, attrs = ann["root"], ann["root"].attrs
    n, h, w, c = shape_of(ann["data"])
    _, r, s, _ = shape_of(ann["weight"])
    _, p, q, _ = shape_of(conv)
    return dict(
        n=n if isinstance(n, int) else None,
        h=h, w=w, c=c, r=r, s=s, p=p, q=q,
        pad=(int(attrs.padding[0]), int(attrs.padding[1])),
        stride=tuple(int(v) for v in attrs.strides),
        dilation=tuple(int(v) for v in attrs.dilation),
        element=dtype_of(ann["data"]),
    )  # fmt: skip


# The conv1d form rewrites.conv1d.Conv1dAsConv2d turns into a conv2d of height 1.
CONV1D_LAYOUTS = {"data_layout": "NCW", "kernel_layout": "OIW", "out_layout": "NCW"}


def conv1d_refusal(call: relax.Call) -> str | None:
    """Why `call` (a relax.nn.conv1d) is not rewritten as a conv2d, or None."""
    attrs = call.attrs
    for name, layout in CONV1D_LAYOUTS.items():
        if str(getattr(attrs, name)) != layout:
            return f"a conv1d with {name} {getattr(attrs, name)} (Conv1dAsConv2d rewrites {layout} only)"
    if any(getattr(a.ty, "ndim", -1) != 3 for a in call.args[:2]):
        return "a conv1d whose operands are not 3-D"
    return None


def conv_flops(call: relax.Call) -> int | None:
    """2 x output elements x C/groups x R x S; None when a shape is symbolic."""
    out, data, weight = static_shape(call), static_shape(call.args[0]), static_shape(call.args[1])
    if out is None or data is None or weight is None:
        return None
    out_channels = weight[str(call.attrs.kernel_layout).index("O")]
    return 2 * math.prod(out) * math.prod(weight) // out_channels


# The glue's checks of an NHWC convolution's tensors (weight (K, R, S, weight_i)), then its batch n;
# `$args` follows (the kind's argument struct, filled from them).
NHWC_CONV_CHECKS = """\
  TRY(CheckDim(fn, "data rank (NHWC)", data->ndim, 4, data));
  TRY(CheckDim(fn, "data H", data->shape[1], $h, data));
  TRY(CheckDim(fn, "data W", data->shape[2], $w, data));
  TRY(CheckDim(fn, "data C", data->shape[3], $c, data));
  TRY(CheckDim(fn, "weight rank (OHWI)", weight->ndim, 4, weight));
  TRY(CheckDim(fn, "weight O", weight->shape[0], $k, weight));
  TRY(CheckDim(fn, "weight H", weight->shape[1], $r, weight));
  TRY(CheckDim(fn, "weight W", weight->shape[2], $s, weight));
  TRY(CheckDim(fn, "weight I", weight->shape[3], $weight_i, weight));
  const int64_t n = data->shape[0];
  TRY(CheckDim(fn, "output rank (NHWC)", out->ndim, 4, out));
  TRY(CheckDim(fn, "output N", out->shape[0], n, out));
  TRY(CheckDim(fn, "output H", out->shape[1], $p, out));
  TRY(CheckDim(fn, "output W", out->shape[2], $q, out));
  TRY(CheckDim(fn, "output C", out->shape[3], $k, out));
$extra_checks
  if (n == 0) return 0;
  if (n > INT32_MAX / ($h * $w * $c) || n > INT32_MAX / ($p * $q * $k)) {
    return Raise("ValueError", "%s: batch %lld makes a tensor of more than 2^31 elements, which CUTLASS's 32-bit "
                 "conv2d indexing cannot address; split the batch", fn, static_cast<long long>(n));
  }
"""


def conv_glue_values(region, k: int, weight_i: int, extra_checks: list[str]) -> dict:
    """The template values every NHWC convolution's glue function takes (checks: the caller's)."""
    p = region.kernel.problem
    roles = region.roles
    bias = [f'  TRY(CheckDim(fn, "bias size", Numel(bias), {k}, bias));'] if "bias" in roles else []
    return dict(
        operand_arrays=operand_arrays(region),
        symbol=region.symbol,
        unpack=unpack_args(region),
        h=p.h, w=p.w, c=p.c, k=k, r=p.r, s=p.s, p=p.p, q=p.q, weight_i=weight_i,
        pad_h=p.pad[0], pad_w=p.pad[1], stride_h=p.stride[0], stride_w=p.stride[1],
        dilation_h=p.dilation[0], dilation_w=p.dilation[1], split_k=region.split_k,
        extra_checks="\n".join(bias + extra_checks),
        bias_ptr="Data(bias)" if "bias" in roles else "nullptr",
        launch=launch_call(region.kernel),
    )  # fmt: skip


def conv_geometry(problem, split_k: int) -> dict:
    """The `conv` entry of a convolution's report row."""
    return {
        "kernel_size": [problem.r, problem.s],
        "stride": list(problem.stride),
        "padding": list(problem.pad),
        "dilation": list(problem.dilation),
        "split_k": split_k,
    }
