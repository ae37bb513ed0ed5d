"""Depthwise kernel choice: the output tile by filter size, fixed or run-time stride, and how many
CTAs share each channel group's output tiles."""

from __future__ import annotations

import math

from ...arch import SM_COUNT, resolve_family
from ..epilogue import Epilogue
from .records import MAX_GRID_Z, DepthwiseKernel, DepthwiseProblem, DirectConvTile

# Stride/dilation pairs compiled in (CUTLASS's kFixedStrideDilation, the faster iterator); any
# other runs the kOptimized iterator, which takes them at run time.
FIXED_GEOMETRIES = {((1, 1), (1, 1)), ((2, 2), (1, 1))}
# cutlass_library's depthwise generator: 8x8 output tiles of 64 channels for 3x3 and 5x5 filters;
# a 7x7 filter in an 8x8 tile spills registers (255 and 56-320 B of spills on sm_80), a 4x4 tile
# with 4 stages does not.
SMALL_FILTER_TILE = DirectConvTile(tile_p=8, tile_q=8, groups_per_cta=64, warps=4, stages=3)
LARGE_FILTER_TILE = DirectConvTile(tile_p=4, tile_q=4, groups_per_cta=64, warps=4, stages=4)
# Threadblocks per SM the grid aims for: the kernel is bound by memory, and more resident CTAs hide
# its latency.
CTAS_PER_SM = 4


def choose_depthwise_kernel(problem: DepthwiseProblem, epilogue: Epilogue, arch: int, family: str = "auto"):
    """-> (kernel, split_k): the tile for its filter size, fixed stride where compiled in, and
    enough CTAs per channel group (split_k, a grid dimension: no reduction) to fill the GPU."""
    resolve_family(family, arch)  # a wrong option still fails as for the other kinds
    tile = tile_for(problem)
    fixed = (problem.stride, problem.dilation) in FIXED_GEOMETRIES
    note = "CUTLASS 2.x SIMT direct convolution (depthwise has no tensor-core form)" + (
        "" if fixed else "; stride/dilation at run time (kOptimized iterator)"
    )
    kernel = DepthwiseKernel(problem, epilogue, tile, fixed_stride=fixed, arch=80, target=arch, note=note)
    return kernel, split_for(problem, tile, arch)


def split_for(problem: DepthwiseProblem, tile: DirectConvTile, arch: int) -> int:
    """CTAs per channel group: enough for CTAS_PER_SM on every SM, never more than there are output
    tiles (a symbolic batch counts as 1), at most MAX_GRID_Z; every tile where the kernel must
    compute one tile per CTA (the glue then counts them at run time)."""
    tiles = tile.tiles(problem, problem.n or 1)
    if tile.one_tile_per_cta(problem):
        return min(tiles, MAX_GRID_Z)
    groups = math.ceil(problem.c / tile.groups_per_cta)
    wanted = math.ceil(CTAS_PER_SM * SM_COUNT.get(arch, 108) / groups)
    return max(1, min(tiles, wanted, MAX_GRID_Z))


def tile_for(problem: DepthwiseProblem) -> DirectConvTile:
    """The output tile of `problem`'s filter size."""
    return LARGE_FILTER_TILE if max(problem.r, problem.s) > 5 else SMALL_FILTER_TILE
