"""Depthwise kernel choice: the output tile by filter size, fixed or run-time stride, and how many
CTAs share each channel group's output tiles."""

from __future__ import annotations

import math
import re
from dataclasses import replace

from ...arch import SM_COUNT, resolve_family
from ..epilogue import Epilogue
from .records import MAX_GRID_Z, DepthwiseKernel, DepthwiseProblem, DirectConvTile

# Stride/dilation pairs compiled in (CUTLASS's kFixedStrideDilation, the faster iterator); any
# other runs the kOptimized iterator, which takes them at run time.
FIXED_GEOMETRIES = {((1, 1), (1, 1)), ((2, 2), (1, 1))}
# Output tiles, from cutlass_library's depthwise generator (8x8 / 4x4 tiles of 16-64 channels),
# chosen by bench/depthwise_tiles.py on an H200 (ConvNeXt-tiny's and EfficientNet-B0's depthwise
# convs at batch 32; bench/results/2026-11-26-session16-depthwise-tiles-*.json): 8x8 tiles of 32
# channels were fastest wherever C is not a multiple of 64 (a 64-channel tile then computes padding
# channels: C = 96 is 2 tiles of 64, half of the second idle) and for 3x3 / 5x5 filters on small
# (< 14x14) outputs; 64-channel tiles where C is a multiple of 64 on larger ones. A 7x7 filter in
# an 8x8 tile of 64 channels spills registers and does not build; 4x4 tiles of 64 channels it is.
WIDE_TILE = DirectConvTile(tile_p=8, tile_q=8, groups_per_cta=64, warps=4, stages=3)
NARROW_TILE = DirectConvTile(tile_p=8, tile_q=8, groups_per_cta=32, warps=4, stages=3)
LARGE_FILTER_TILE = DirectConvTile(tile_p=4, tile_q=4, groups_per_cta=64, warps=4, stages=4)
# Outputs (P * Q) below this run 3x3 / 5x5 filters on 32-channel tiles (more CTAs per image).
SMALL_OUTPUT = 14 * 14
# Threadblocks per SM the grid aims for: the kernel is bound by memory, and more resident CTAs hide
# its latency.
CTAS_PER_SM = 4


def choose_depthwise_kernel(
    problem: DepthwiseProblem, epilogue: Epilogue, arch: int, family: str = "auto", tile: str = ""
):
    """-> (kernel, split_k): the tile for its filter size (or the pinned `tile`, as
    DirectConvTile.describe() spells it: for sweeps), fixed stride where compiled in, and enough
    CTAs per channel group (split_k, a grid dimension: no reduction) to fill the GPU."""
    resolve_family(family, arch)  # a wrong option still fails as for the other kinds
    chosen = parse_tile(tile) if tile else tile_for(problem)
    fixed = (problem.stride, problem.dilation) in FIXED_GEOMETRIES
    note = "CUTLASS 2.x SIMT direct convolution (depthwise has no tensor-core form)" + (
        "" if fixed else "; stride/dilation at run time (kOptimized iterator)"
    )
    kernel = DepthwiseKernel(problem, epilogue, chosen, fixed_stride=fixed, arch=80, target=arch, note=note)
    if tile:
        kernel = replace(kernel, selected_by="pinned")
    return kernel, split_for(problem, chosen, arch)


def parse_tile(tile: str) -> DirectConvTile:
    """'p8q8g32w4s3' -> DirectConvTile(8, 8, 32, 4, 3)."""
    match = re.fullmatch(r"p(\d+)q(\d+)g(\d+)w(\d+)s(\d+)", tile)
    if match is None:
        raise ValueError(
            f"tile={tile!r} is not a depthwise tile; spell one as p<P>q<Q>g<groups>w<warps>s<stages>, e.g. p4q4g64w4s4"
        )
    p, q, groups, warps, stages = map(int, match.groups())
    if groups % 8 or (p * q) % warps:
        raise ValueError(f"tile={tile!r}: groups must be a multiple of 8 and warps must divide P*Q")
    return DirectConvTile(p, q, groups, warps, stages)


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
    """The output tile for `problem`'s filter size, channels and output size (see WIDE_TILE)."""
    wide_channels = problem.c % 64 == 0
    if max(problem.r, problem.s) > 5:
        return LARGE_FILTER_TILE if wide_channels or problem.c % 32 else NARROW_TILE
    return WIDE_TILE if wide_channels and problem.p * problem.q >= SMALL_OUTPUT else NARROW_TILE
