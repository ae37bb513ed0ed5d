"""Depthwise kernel choice: relax_cutlass's own blocked direct kernel (direct_templates.py) where it
applies (dilation 1, stride 1 or 2), else CUTLASS's direct convolution; each family's output tile
by problem, and for CUTLASS's, fixed or run-time stride (and one output tile per CTA)."""

from __future__ import annotations

import re
from dataclasses import replace

from ...arch import SM_COUNT, resolve_family
from .. import PlanError
from ..epilogue import Epilogue
from .records import MAX_GRID_Z, MAX_HALO_BYTES, BlockedTile, DepthwiseKernel, DepthwiseProblem, DirectConvTile

# Stride/dilation pairs compiled in (CUTLASS's kFixedStrideDilation, the faster iterator); any
# other runs the kOptimized iterator, which takes them at run time.
FIXED_GEOMETRIES = {((1, 1), (1, 1)), ((2, 2), (1, 1))}
# Output tiles, from cutlass_library's depthwise generator (8x8 / 4x4 tiles of 16-64 channels),
# chosen by bench/depthwise_tiles.py on an H200 (ConvNeXt-tiny's and EfficientNet-B0's depthwise
# convs at batch 32; bench/results/2026-11-26-depthwise-tiles-nvidia-h200.json): 8x8 tiles of 32
# channels were fastest wherever C is not a multiple of 64 (a 64-channel tile then computes padding
# channels: C = 96 is 2 tiles of 64, half of the second idle) and for 3x3 / 5x5 filters on small
# (< 14x14) outputs; 64-channel tiles where C is a multiple of 64 on larger ones. A 7x7 filter in
# an 8x8 tile of 64 channels spills registers and does not build; 4x4 tiles of 64 channels it is.
WIDE_TILE = DirectConvTile(tile_p=8, tile_q=8, groups_per_cta=64, warps=4, stages=3)
NARROW_TILE = DirectConvTile(tile_p=8, tile_q=8, groups_per_cta=32, warps=4, stages=3)
LARGE_FILTER_TILE = DirectConvTile(tile_p=4, tile_q=4, groups_per_cta=64, warps=4, stages=4)
# Outputs (P * Q) below this run 3x3 / 5x5 filters on 32-channel tiles (more CTAs per image).
SMALL_OUTPUT = 14 * 14


DIRECT_NOTE = (
    "relax_cutlass's blocked direct depthwise kernel (the default where it applies: CUTLASS's SIMT direct "
    "convolution ran 1.5-1.9x slower than cuDNN on ConvNeXt's 7x7 convs on an H200, and reorders the "
    "filter into a fresh allocation on every call)"
)
CUTLASS_NOTE = "CUTLASS 2.x SIMT direct convolution (depthwise has no tensor-core form)"


def direct_problems(problem: DepthwiseProblem) -> list[str]:
    """Why relax_cutlass's blocked direct kernel does not cover `problem` (empty when it does)."""
    problems = []
    if problem.dilation != (1, 1):
        problems.append(f"dilation {problem.dilation}: the blocked direct kernel is built for dilation 1")
    if any(s not in (1, 2) for s in problem.stride):
        problems.append(f"stride {problem.stride}: the blocked direct kernel is built for strides 1 and 2")
    return problems


def choose_depthwise_kernel(
    problem: DepthwiseProblem, epilogue: Epilogue, arch: int, family: str = "auto", tile: str = ""
):
    """-> (kernel, split_k): the blocked direct kernel where it covers the problem, else CUTLASS's
    (the reason in its note); a pinned `tile` picks the family by its spelling (BlockedTile's
    "direct_p8q16g32[t4x4]" or DirectConvTile's "p4q4g64w4s4": for sweeps). For CUTLASS's, fixed
    stride where compiled in, and a CTA per output tile of each channel group (split_k, a grid
    dimension: no reduction); the direct kernel's grid holds every tile (split_k 1)."""
    resolve_family(family, arch)  # a wrong option still fails as for the other kinds
    uncovered = direct_problems(problem)
    if tile.startswith("direct_") or (not tile and not uncovered):
        if uncovered:
            raise PlanError(f"tile={tile!r}: " + "; ".join(uncovered))
        chosen = parse_direct_tile(tile, problem) if tile else direct_tile_for(problem, arch)
        kernel = DepthwiseKernel(problem, epilogue, chosen, fixed_stride=True, arch=80, target=arch, note=DIRECT_NOTE)
        return (replace(kernel, selected_by="pinned") if tile else kernel), 1
    if problem.element != "float16":
        raise ValueError(
            f"{problem.element} depthwise convs run only on the blocked direct kernel, which does not take this one"
            + (f" ({'; '.join(uncovered)})" if uncovered else f" (tile={tile!r} pins CUTLASS's kernel)")
        )
    chosen = parse_tile(tile) if tile else tile_for(problem)
    fixed = (problem.stride, problem.dilation) in FIXED_GEOMETRIES
    note = CUTLASS_NOTE + ("" if fixed else "; stride/dilation at run time (kOptimized iterator)")
    if not tile:
        note += "; not the blocked direct kernel: " + "; ".join(uncovered)
    kernel = DepthwiseKernel(problem, epilogue, chosen, fixed_stride=fixed, arch=80, target=arch, note=note)
    if tile:
        kernel = replace(kernel, selected_by="pinned")
    return kernel, split_for(problem, chosen)


# The blocked direct kernel's tiles: channels per CTA (multiples of 8, the 128-bit loads) chosen
# to leave the fewest idle channels in the last group (ties: the wider); 8 x 16 output pixels per
# CTA, 4 x 4 per thread, smaller where the halo would not fit or the grid would not fill the GPU.
# No 24-channel groups: bench/depthwise_tiles.py measured them slower than 16 on the H200 (56x56
# x 144, 3x3: 0.048 ms against 0.035; 2026-11-26-depthwise-tiles-direct-nvidia-h200.json).
DIRECT_GROUPS = (32, 16, 8)
# CTAs the grid aims for per SM at least (a symbolic batch counts as 16 images: no tile is shrunk
# for a batch of 1 that may never come).
DIRECT_CTAS_PER_SM = 2


def direct_tile_for(problem: DepthwiseProblem, arch: int) -> BlockedTile:
    groups = min(DIRECT_GROUPS, key=lambda g: (-(-problem.c // g) * g, -g))
    tile = BlockedTile(tile_p=8, tile_q=16 if problem.q > 8 else 8, groups_per_cta=groups)
    wanted = DIRECT_CTAS_PER_SM * SM_COUNT.get(arch, 108)
    while tile.halo_bytes(problem) > MAX_HALO_BYTES or (
        tile.ctas(problem, problem.n or 16) < wanted and tile.tile_p * tile.tile_q > 16
    ):
        if tile.tile_q >= tile.tile_p:
            tile = replace(tile, tile_q=tile.tile_q // 2, cols_per_thread=min(4, tile.tile_q // 2))
        else:
            tile = replace(tile, tile_p=tile.tile_p // 2, rows_per_thread=min(4, tile.tile_p // 2))
    return tile


# The `tile=` option's spellings: CUTLASS's direct convolution (parse_tile), the blocked one (parse_direct_tile)
TILE_SPELLING = (r"p\d+q\d+g\d+w\d+s\d+|direct_p\d+q\d+g\d+(t\d+x\d+)?", "p4q4g64w4s4, direct_p8q16g32")


def parse_direct_tile(tile: str, problem: DepthwiseProblem | None = None) -> BlockedTile:
    """'direct_p8q16g32' (4 x 4 pixels per thread) or 'direct_p8q16g32t2x4' -> BlockedTile."""
    match = re.fullmatch(r"direct_p(\d+)q(\d+)g(\d+)(?:t(\d+)x(\d+))?", tile)
    if match is None:
        raise ValueError(
            f"tile={tile!r} is not a blocked direct tile; spell one as direct_p<P>q<Q>g<channels>[t<rows>x<cols>], "
            "e.g. direct_p8q16g32 or direct_p8q16g32t4x4"
        )
    p, q, groups = (int(v) for v in match.groups()[:3])
    rows, cols = (int(v) for v in match.groups()[3:]) if match.group(4) else (min(4, p), min(4, q))
    chosen = BlockedTile(p, q, groups, rows, cols)
    if groups % 8 or not groups or p % rows or q % cols or not rows or not cols:
        raise PlanError(
            f"tile={tile!r}: channels must be a multiple of 8, and the per-thread block must divide the CTA's"
        )
    if chosen.threads > 1024:
        raise PlanError(f"tile={tile!r}: {chosen.threads} threads per CTA, more than CUDA's 1024")
    if problem is not None and chosen.halo_bytes(problem) > MAX_HALO_BYTES:
        raise PlanError(
            f"tile={tile!r}: its input halo takes {chosen.halo_bytes(problem)} bytes of shared memory for a "
            f"{problem.r}x{problem.s} stride-{problem.stride[0]} filter, more than {MAX_HALO_BYTES}"
        )
    return chosen


def parse_tile(tile: str) -> DirectConvTile:
    """'p8q8g32w4s3' -> DirectConvTile(8, 8, 32, 4, 3)."""
    match = re.fullmatch(r"p(\d+)q(\d+)g(\d+)w(\d+)s(\d+)", tile)
    if match is None:
        raise ValueError(
            f"tile={tile!r} is not a depthwise tile; spell one as p<P>q<Q>g<groups>w<warps>s<stages>, e.g. "
            "p4q4g64w4s4 (CUTLASS's direct convolution), or direct_p<P>q<Q>g<channels>[t<rows>x<cols>], e.g. "
            "direct_p8q16g32 (relax_cutlass's blocked direct kernel)"
        )
    p, q, groups, warps, stages = map(int, match.groups())
    if groups % 8 or (p * q) % warps:
        raise PlanError(f"tile={tile!r}: groups must be a multiple of 8 and warps must divide P*Q")
    return DirectConvTile(p, q, groups, warps, stages)


def split_for(problem: DepthwiseProblem, tile: DirectConvTile) -> int:
    """CTAs per channel group: one per output tile (DirectConvTile.one_tile_per_cta), at most
    MAX_GRID_Z (a symbolic batch counts as 1: the glue counts the tiles at run time)."""
    return min(tile.tiles(problem, problem.n or 1), MAX_GRID_Z)


def tile_for(problem: DepthwiseProblem) -> DirectConvTile:
    """The output tile for `problem`'s filter size, channels and output size (see WIDE_TILE)."""
    wide_channels = problem.c % 64 == 0
    if max(problem.r, problem.s) > 5:
        return LARGE_FILTER_TILE if wide_channels or problem.c % 32 else NARROW_TILE
    return WIDE_TILE if wide_channels and problem.p * problem.q >= SMALL_OUTPUT else NARROW_TILE
