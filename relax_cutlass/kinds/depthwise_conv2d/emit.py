"""C++ of the depthwise kind: each family's kernel translation unit (CUTLASS's direct convolution,
relax_cutlass's blocked direct kernel) and a region's glue."""

from __future__ import annotations

from ...cutlass_lib import data_type
from ...cutlass_lib import load as load_cutlass_library
from ...toolkit.compile import Source
from ...toolkit.glue import check_device, role_aliases, tensor_checks
from ..cutlass_device import device_kernel_source
from ..nhwc import conv_glue_values
from .direct_templates import DIRECT_INCLUDES, DIRECT_KERNEL, DIRECT_TU
from .records import MAX_GRID_Z, DepthwiseKernel, DepthwiseRegion
from .templates import ARGS_TYPE, ARGUMENTS, DWCONV2D_ARGS, GLUE_FUNCTION, INCLUDES, INSTANCE

SCALE = "cutlass::epilogue::thread::ScaleType::"


def _epilogue(kernel: DepthwiseKernel, element: str, accumulator: str) -> str:
    """The thread-level epilogue: act(acc + bias) with the bias as an unscaled source
    (NoBetaScaling), alpha * acc without one; 8 elements (128 bits) per access."""
    epi = kernel.epilogue
    scale = SCALE + ("NoBetaScaling" if epi.bias else "OnlyAlphaScaling")
    if epi.activation == "identity":
        return f"cutlass::epilogue::thread::LinearCombination<{element}, 8, {accumulator}, {accumulator}, {scale}>"
    act = epi.functors(kernel.problem.element_out)[0]
    return (
        f"cutlass::epilogue::thread::LinearCombinationGeneric<{act.functor}, {element}, 8, {accumulator}, "
        f"{accumulator}, {scale}, cutlass::FloatRoundStyle::round_to_nearest, {str(act.is_heavy).lower()}>"
    )


def _kernel_parts(kernel: DepthwiseKernel) -> dict[str, str]:
    load_cutlass_library()
    from cutlass_library.library import DataTypeTag

    p, t = kernel.problem, kernel.tile
    element, accumulator = DataTypeTag[data_type(p.element)], DataTypeTag[data_type(p.element_accumulator)]
    fixed = kernel.fixed_stride
    instance = INSTANCE.substitute(
        name=kernel.name,
        element=element,
        element_acc=accumulator,
        tile_p=t.tile_p,
        tile_q=t.tile_q,
        tile_pq=t.tile_p * t.tile_q,
        warp_m=t.tile_p * t.tile_q // t.warps,
        groups=t.groups_per_cta,
        r=p.r,
        s=p.s,
        rs=p.r * p.s,
        epilogue=_epilogue(kernel, element, accumulator),
        stages=t.stages,
        iterator="cutlass::conv::IteratorAlgorithm::" + ("kFixedStrideDilation" if fixed else "kOptimized"),
        stride_support="cutlass::conv::StrideSupport::" + ("kFixed" if fixed else "kStrided"),
        stride_r=p.stride[0] if fixed else -1,
        stride_s=p.stride[1] if fixed else -1,
        dilation_r=p.dilation[0] if fixed else -1,
        dilation_s=p.dilation[1] if fixed else -1,
    )
    return {
        "includes": INCLUDES,
        "instance": instance,
        "operation_type": f"cutlass::conv::device::DirectConvolution<{kernel.name}_kernel>",
        "arguments": ARGUMENTS,
    }


# The CUDA element type of each 16-bit dtype the blocked direct kernel takes.
DIRECT_ELEMENT = {"float16": "__half", "bfloat16": "__nv_bfloat16"}


def direct_kernel_text(kernel: DepthwiseKernel) -> str:
    """The blocked direct kernel's translation unit (direct_templates.py)."""
    p, t, epi = kernel.problem, kernel.tile, kernel.epilogue
    activation = epi.functors(p.element_out)[0]
    return DIRECT_TU.substitute(
        name=kernel.name,
        includes=DIRECT_INCLUDES,
        args=DWCONV2D_ARGS,
        definitions=epi.definitions(p.element_out),
        kernel=DIRECT_KERNEL,
        r=p.r,
        s=p.s,
        stride_h=p.stride[0],
        stride_w=p.stride[1],
        tile_p=t.tile_p,
        tile_q=t.tile_q,
        groups=t.groups_per_cta,
        rows_per_thread=t.rows_per_thread,
        cols_per_thread=t.cols_per_thread,
        element=DIRECT_ELEMENT[p.element],
        activation=f"{activation.functor}<float>",  # applied to each float32 sum
        bias=str(epi.bias).lower(),
        check_device=check_device(kernel),
    )


def emit_depthwise_kernel(kernel: DepthwiseKernel) -> Source:
    # Both families run on the CUDA cores: their SASS holds FFMA/HFMA2, not tensor-core MMA
    # (relax_cutlass.toolkit.sass_check's "simt" family)
    if kernel.direct:
        return Source(kernel.name, direct_kernel_text(kernel), "cuda", family="simt")
    return device_kernel_source(kernel, _kernel_parts(kernel), DWCONV2D_ARGS, ARGS_TYPE, family="simt")


# A kernel that computes one output tile per CTA gets every tile of the batch as its CTAs.
_ONE_TILE_PER_CTA = """\
  const int64_t tiles = n * {tiles_per_image};
  if (tiles > {max_grid}) {{
    return Raise("ValueError", "%s: batch %lld gives %lld output tiles per channel group; this depthwise kernel "
                 "computes one per threadblock, at most {max_grid}: split the batch", fn,
                 static_cast<long long>(n), static_cast<long long>(tiles));
  }}"""


def depthwise_glue_function(region: DepthwiseRegion) -> str:
    p, tile = region.kernel.problem, region.kernel.tile
    extra_checks = []
    values = {}
    if not region.kernel.direct and tile.one_tile_per_cta(p):
        extra_checks.append(_ONE_TILE_PER_CTA.format(tiles_per_image=tile.tiles(p, 1), max_grid=MAX_GRID_Z))
        values["split_k"] = "static_cast<int>(tiles)"
    return GLUE_FUNCTION.substitute(
        checks=role_aliases(region) + tensor_checks(region, ("data", "weight", "bias", "out")),
        **(conv_glue_values(region, k=p.c, weight_i=1, extra_checks=extra_checks) | values),
    )
