"""conv2d's CUTLASS 3.x kernel families, TMA im2col loads both: SM90 (sm_90a: wgmma,
`KernelImplicitTmaWarpSpecializedSm90`) and SM100 (sm_100a / sm_103a / sm_110a: tcgen05 UMMA, 1-SM
and 2-SM MMAs; compile-verified, not yet run on Blackwell hardware). Their candidates (from
cutlass_library's generators), what TMA im2col cannot run or runs slower (the SM80 kernels then
take the conv, with the reason), the bottom/right padding CUTLASS 3.x needs, and the heuristics'
ranks."""

from __future__ import annotations

import functools

from ...arch import native_family, resolve_family
from ..gemm.generators import generated_operations, stable_order
from ..gemm.records import TileConfig
from ..gemm.select import SM90_MAX_ACCUMULATOR_REGISTERS, accumulator_registers, estimate_cost
from ..gemm.sm100 import SMS_PER_MMA, estimate_cost_sm100, sm100_config, smallest_cluster_pool
from .records import SM90_CONV_SCHEDULE, Conv2dProblem, conv_family

# One consumer warp group of `KernelImplicitTmaWarpSpecializedSm90` holds the whole CTA tile's
# accumulator: the tiles whose fp32 accumulator spills (past SM90_MAX_ACCUMULATOR_REGISTERS) are left out.
# 128x64 is added to the generator's shapes: the tile of the 64-channel convs (N = K = 64) that
# fills its MMA without a half-empty 128-wide N.
SM90_CONV_EXTRA_TILES = ((128, 64, 64),)


@functools.cache
def candidate_conv2d_tiles_sm90() -> tuple[TileConfig, ...]:
    """CTA tiles and clusters of the 16-bit 2-D fprop kernels `GenerateSM90_Conv3x` emits (fp16
    and bf16 share their wgmma shapes), those whose fp32 accumulator fits one warp group's
    registers, plus SM90_CONV_EXTRA_TILES."""
    from cutlass_library.library import ConvKind, DataType, OperationKind

    shapes = {
        (tuple(op.tile_description.tile_shape), tuple(op.tile_description.cluster_shape))
        for op in generated_operations("GenerateSM90_Conv3x")
        if op.operation_kind == OperationKind.Conv2d
        and op.conv_kind == ConvKind.Fprop
        and op.A.element in (DataType.f16, DataType.bf16)
    }
    shapes |= {(tile, (1, 1, 1)) for tile in SM90_CONV_EXTRA_TILES}
    tiles = (
        TileConfig(threadblock=tile, instruction=(64, tile[1], 16), cluster=cluster, schedule=SM90_CONV_SCHEDULE)
        for tile, cluster in shapes
    )
    return stable_order(t for t in tiles if accumulator_registers(t, "float32") <= SM90_MAX_ACCUMULATOR_REGISTERS)


# On the H200 (bench/conv_families.py, ResNet-50's convs, batch 32) the SM90 kernels ran 1.1-1.7x
# faster than the SM80 ones for C >= 128, about 2-10% slower for C = 64 and 3.6x slower for the
# padded RGB stem (C = 8, 7x7): their TMA im2col loads are one filter tap's C channels.
SM90_CONV_MIN_CHANNELS = 128

# TMA im2col's limits for 2-D convs (CUTLASS's can_implement): corner offsets in [-128, 127], filter
# extents (R-1)*dilation below 255, element (traversal) strides up to 8.
TMA_CORNER_LIMIT = 128
TMA_FILTER_OFFSET_LIMIT = 255
TMA_MAX_TRAVERSAL_STRIDE = 8


def upper_padding(problem: Conv2dProblem) -> tuple[int, int]:
    """The bottom/right padding that makes CUTLASS 3.x's output size (computed from both paddings)
    P x Q: whatever the last output row/column reads past the input, at least 0 (a negative need
    is the rows the floor division already drops)."""
    p = problem
    dims = zip((p.p, p.q), p.stride, (p.r, p.s), p.dilation, (p.h, p.w), p.pad, strict=True)
    return tuple(max(0, (out - 1) * stride + (f - 1) * dil + 1 - size - pad) for out, stride, f, dil, size, pad in dims)


def tma_conv_fallback_reason(problem: Conv2dProblem) -> str | None:
    """Why a CUTLASS 3.x target (sm_90a, SM100) cannot run `problem` on its conv kernels, or should
    not (C < SM90_CONV_MIN_CHANNELS: measured on Hopper, applied to SM100 unmeasured), if so."""
    p = problem
    if p.groups > 1:
        return f"groups={p.groups}: CUTLASS 3.x conv kernels are ungrouped: SM80 kernel"
    if p.alignment < 8:
        return f"C={p.c} / K={p.k} not multiples of 8 (TMA needs 16-byte rows): SM80 kernel"
    if p.c < SM90_CONV_MIN_CHANNELS:
        return f"C={p.c} < {SM90_CONV_MIN_CHANNELS} (narrow TMA im2col rows measured slower): SM80 kernel"
    if max(p.stride) > TMA_MAX_TRAVERSAL_STRIDE:
        return f"stride {p.stride} beyond TMA im2col's {TMA_MAX_TRAVERSAL_STRIDE}: SM80 kernel"
    upper = upper_padding(p)
    for size, out, stride, f, dil, pad, up in zip(
        (p.h, p.w), (p.p, p.q), p.stride, (p.r, p.s), p.dilation, p.pad, upper, strict=True
    ):
        extent = (f - 1) * dil
        corners_fit = pad <= TMA_CORNER_LIMIT and -TMA_CORNER_LIMIT <= up - extent < TMA_CORNER_LIMIT
        if extent >= TMA_FILTER_OFFSET_LIMIT or not corners_fit:
            return f"padding {p.pad} / filter extent beyond TMA im2col's limits: SM80 kernel"
        if (size + pad + up - extent - 1) // stride + 1 != out:
            return f"output size {p.p}x{p.q} not reachable by TMA im2col's padding: SM80 kernel"
    return None


def conv2d_family(problem: Conv2dProblem, arch: int, family: str = "auto") -> int:
    """The kernel family `problem` gets on `arch`: the target's CUTLASS 3.x family (90 on sm_90a,
    100 on sm_100a / sm_103a / sm_110a) unless `family="sm80"` or `tma_conv_fallback_reason` rules
    it out, else 80 (also every other target's: GeForce Blackwell has no tcgen05)."""
    native = native_family(arch)
    if native == 80 or resolve_family(family, arch) != "auto":
        return 80
    return 80 if tma_conv_fallback_reason(problem) else native


# SM90 tiles the heuristic chooses from (the rest are profiling candidates): 64-row K tiles, no cluster.
SM90_CONV_HEURISTIC_TILES = ((64, 128, 64), (128, 64, 64), (128, 128, 64), (64, 256, 64))


def rank_sm90_conv2d_tile(problem: Conv2dProblem, tile: TileConfig, arch: int, n_hint: int = 1):
    """SM90_CONV_HEURISTIC_TILES first, by the wave model of the implicit GEMM; ties to the larger
    tile, then the name."""
    gemm = problem.implicit_gemm(n_hint)
    bm, bn, _ = tile.threadblock
    heuristic = tile.threadblock in SM90_CONV_HEURISTIC_TILES and tile.cluster == (1, 1, 1)
    return (not heuristic, estimate_cost(gemm, tile, arch, gemm.m), -bm * bn, tile.describe())


@functools.cache
def candidate_conv2d_tiles_sm100() -> tuple[TileConfig, ...]:
    """The static-cluster 16-bit 2-D fprop configurations `GenerateSM100_TensorOp_16b_UMMA_conv3x`
    emits (fp16 and bf16 share them), named as the SM100 GEMMs' are: MMA tile (what one UMMA
    computes), cluster, "1sm" / "2sm"."""
    from cutlass_library.library import ConvKind, DataType, OperationKind

    schedules = {"ImplicitTmaWarpSpecialized1SmSm100": "1sm", "ImplicitTmaWarpSpecialized2SmSm100": "2sm"}
    tiles = {
        sm100_config(op, schedules[op.kernel_schedule.name]): None
        for op in generated_operations("GenerateSM100_TensorOp_16b_UMMA_conv3x")
        if op.operation_kind == OperationKind.Conv2d
        and op.conv_kind == ConvKind.Fprop
        and op.A.element in (DataType.f16, DataType.bf16)
        and op.kernel_schedule.name in schedules
        and 0 not in op.tile_description.cluster_shape
    }
    return stable_order(tiles)


@functools.cache
def sm100_conv2d_heuristic_pool() -> frozenset[TileConfig]:
    return frozenset(smallest_cluster_pool(candidate_conv2d_tiles_sm100()))


def rank_sm100_conv2d_tile(problem: Conv2dProblem, tile: TileConfig, arch: int, n_hint: int = 1):
    """The SM100 GEMMs' heuristic (gemm/sm100.py) on the implicit GEMM: its pool of MMA tiles on
    their smallest cluster first, by its wave model; ties to 2-SM MMAs, the larger tile."""
    gemm = problem.implicit_gemm(n_hint)
    bm, bn, _ = tile.threadblock
    cost = estimate_cost_sm100(gemm, tile, arch, gemm.m)
    return (tile not in sm100_conv2d_heuristic_pool(), cost, -SMS_PER_MMA[tile.schedule], -bm * bn, tile.describe())


def candidate_conv2d_tiles_3x(family: int) -> tuple[TileConfig, ...]:
    return {90: candidate_conv2d_tiles_sm90, 100: candidate_conv2d_tiles_sm100}[family]()


def rank_3x_conv2d_tile(problem: Conv2dProblem, tile: TileConfig, arch: int, n_hint: int = 1):
    rank = rank_sm90_conv2d_tile if conv_family(tile) == 90 else rank_sm100_conv2d_tile
    return rank(problem, tile, arch, n_hint)
