"""conv2d kernel choice: SM80 implicit-GEMM candidates (grouped convs: those of the group mode each
tile width puts them in) and, on sm_90a, CUTLASS 3.x SM90 kernels (TMA im2col + wgmma) where the
problem fits TMA; the wave-model heuristic of the implicit GEMM, serial split-K for SM80 outputs
that cannot fill the GPU, tuned choices."""

from __future__ import annotations

import dataclasses
import functools
import math

from ...arch import SM_COUNT, family_note, native_family, resolve_family
from ...cutlass_lib import data_type
from ...stages.tuning import epilogue_key
from ..epilogue import Epilogue
from ..gemm.records import GemmProblem, TileConfig
from ..gemm.select import (
    SM90_MAX_ACCUMULATOR_REGISTERS,
    _fitting,
    _generated,
    _rank_sm80,
    _sm80_tile,
    _stable,
    _stage_record,
    accumulator_registers,
    estimate_cost,
    output_tiles,
    under_fills,
)
from .groups import group_mode
from .records import SM90_CONV_SCHEDULE, Conv2dKernel, Conv2dProblem, conv2d_key

# cutlass_library's (GroupMode, IteratorAlgorithm) member names of each group mode's generated kernels:
# kMultipleGroup has only analytic iterators.
_GENERATED_MODES = {
    "none": ("NoneGroup", "Optimized"),
    "single": ("SingleGroup", "Optimized"),
    "multiple": ("MultipleGroup", "Analytic"),
}


@functools.cache
def candidate_conv2d_tiles(accumulator: str, element: str = "float16", mode: str = "none") -> tuple[TileConfig, ...]:
    """Distinct tiles of the SM80 conv2d fprop kernels of group mode `mode` ("none": ungrouped,
    "single", "multiple") that `GenerateSM80_TensorOp_16816` emits for these input/accumulator types."""
    from cutlass_library.library import ConvKind, GroupMode, IteratorAlgorithm, OperationKind

    generated_mode, iterator = _GENERATED_MODES[mode]
    tiles = {
        _sm80_tile(op, swizzle=4): None  # the generator's conv swizzle (GemmIdentityThreadblockSwizzle<4>)
        for op in _generated("GenerateSM80_TensorOp_16816")
        if op.operation_kind == OperationKind.Conv2d
        and op.conv_kind == ConvKind.Fprop
        and op.iterator_algorithm == getattr(IteratorAlgorithm, iterator)
        and op.group_mode == getattr(GroupMode, generated_mode)
        and op.A.element == data_type(element)
        and op.accumulator_type() == data_type(accumulator)
    }
    return _stable(tiles)


def grouped_tile_widths(element: str) -> set[int]:
    """The CTA tile widths (N) of the grouped kernels cutlass_library generates for `element`."""
    modes = ("single", "multiple")
    return {t.threadblock[1] for mode in modes for t in candidate_conv2d_tiles("float32", element, mode)}


def conv2d_tiles(problem: Conv2dProblem, arch: int, family: str = "auto") -> list[TileConfig]:
    """The candidate tiles that can run `problem` on `arch`: its SM90 kernels' (sm_90a, where
    `sm90_conv_fallback_reason` finds nothing against them and `family` allows them), then the SM80
    ones that fit `arch`'s shared memory: the ungrouped kernels' tiles, or for a grouped conv those
    of each group mode whose width puts it in that mode (groups.group_mode)."""
    sm90 = list(candidate_conv2d_tiles_sm90()) if conv2d_family(problem, arch, family) == 90 else []
    return sm90 + _sm80_conv2d_tiles(problem, arch)


def _sm80_conv2d_tiles(problem: Conv2dProblem, arch: int) -> list[TileConfig]:
    acc, element = problem.element_accumulator, problem.element
    if problem.groups == 1:
        tiles = candidate_conv2d_tiles(acc, element)
    else:
        tiles = _stable(
            t
            for mode in ("single", "multiple")
            for t in candidate_conv2d_tiles(acc, element, mode)
            if group_mode(problem.groups, problem.k, t.threadblock[1]) == mode
        )
    return _fitting(tiles, arch, problem)


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
        for op in _generated("GenerateSM90_Conv3x")
        if op.operation_kind == OperationKind.Conv2d
        and op.conv_kind == ConvKind.Fprop
        and op.A.element in (DataType.f16, DataType.bf16)
    }
    shapes |= {(tile, (1, 1, 1)) for tile in SM90_CONV_EXTRA_TILES}
    tiles = (
        TileConfig(threadblock=tile, instruction=(64, tile[1], 16), cluster=cluster, schedule=SM90_CONV_SCHEDULE)
        for tile, cluster in shapes
    )
    return _stable(t for t in tiles if accumulator_registers(t, "float32") <= SM90_MAX_ACCUMULATOR_REGISTERS)


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


def sm90_conv_fallback_reason(problem: Conv2dProblem) -> str | None:
    """Why an sm_90a target cannot run `problem` on a CUTLASS 3.x SM90 conv kernel, if it cannot."""
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
    """The kernel family `problem` gets on `arch`: 90 on sm_90a unless `family="sm80"` or
    `sm90_conv_fallback_reason` rules it out, else 80 (the SM80 family also serves Blackwell: no
    tcgen05 conv yet)."""
    if native_family(arch) != 90 or resolve_family(family, arch) != "auto":
        return 80
    return 80 if sm90_conv_fallback_reason(problem) else 90


# SM90 tiles the heuristic chooses from (the rest are profiling candidates): 64-row K tiles, no cluster.
SM90_CONV_HEURISTIC_TILES = ((64, 128, 64), (128, 64, 64), (128, 128, 64), (64, 256, 64))


def rank_sm90_conv2d_tile(problem: Conv2dProblem, tile: TileConfig, arch: int, n_hint: int = 1):
    """SM90_CONV_HEURISTIC_TILES first, by the wave model of the implicit GEMM; ties to the larger
    tile, then the name."""
    gemm = problem.implicit_gemm(n_hint)
    bm, bn, _ = tile.threadblock
    heuristic = tile.threadblock in SM90_CONV_HEURISTIC_TILES and tile.cluster == (1, 1, 1)
    return (not heuristic, estimate_cost(gemm, tile, arch, gemm.m), -bm * bn, tile.describe())


def grouped_main_loop(problem: Conv2dProblem, tile: TileConfig) -> int:
    """Reduction elements one CTA of a grouped conv runs through: R*S filter positions of C/groups
    channels rounded up to the K tile, once per group the CTA spans (K/groups of its N columns hold
    each group's outputs: the rest of the MMA is spent on zeros)."""
    _, bn, bk = tile.threadblock
    groups_per_cta = max(1, bn // problem.k_per_group)
    return problem.r * problem.s * math.ceil(problem.channels_per_group / bk) * bk * groups_per_cta


def rank_conv2d_tile(problem: Conv2dProblem, tile: TileConfig, arch: int, n_hint: int = 1):
    """The heuristic's sort key of `tile` for `problem` (lower is better).

    Ungrouped: the SM80 wave model of the implicit GEMM (gemm.select), whose per-CTA main loop is
    the same for every tile. Grouped: that model times the main loop one CTA runs
    (`grouped_main_loop`), which depends on the tile: a kMultipleGroup CTA repeats its loop for every
    group it spans and a K tile wider than C/groups reads zeros, so narrow and shallow tiles win
    there (ResNeXt's 4 channels per group: a 64-wide tile spans 16 groups, a 128-wide one 32); ties
    go to more stages, then the taller tile."""
    gemm = problem.implicit_gemm(n_hint)
    if problem.groups == 1:
        return _rank_sm80(gemm, tile, arch, gemm.m)
    cost = estimate_cost(gemm, tile, arch, gemm.m) * grouped_main_loop(problem, tile)
    return (cost, -tile.stages, -tile.threadblock[0], tile.describe())


def ranked_conv2d_tiles(problem: Conv2dProblem, arch: int, n_hint: int = 1, family: str = "auto") -> list[TileConfig]:
    """`conv2d_tiles`, best first: the SM90 ones (when there are any) by `rank_sm90_conv2d_tile`,
    then the SM80 ones by `rank_conv2d_tile`."""
    tiles = conv2d_tiles(problem, arch, family)
    sm90 = [t for t in tiles if kernel_arch(t) == 90]
    sm80 = [t for t in tiles if kernel_arch(t) == 80]
    sm90.sort(key=lambda t: rank_sm90_conv2d_tile(problem, t, arch, n_hint))
    sm80.sort(key=lambda t: rank_conv2d_tile(problem, t, arch, n_hint))
    return sm90 + sm80


def kernel_arch(tile: TileConfig) -> int:
    """The family of a conv2d tile: 90 for the SM90 schedule, else 80."""
    return 90 if tile.schedule == SM90_CONV_SCHEDULE else 80


def splits_k(problem: Conv2dProblem, epilogue: Epilogue, tile: TileConfig | None = None) -> bool:
    """Whether the kernel may take serial split-K: not with a residual (the residual block epilogue
    reads its second operand where split-K keeps the partial sums), not grouped (CUTLASS's grouped
    kernels refuse split-K) and not an SM90 kernel (`tile`: CUTLASS 3.x convs have no split-K)."""
    return not epilogue.residual and problem.groups == 1 and (tile is None or kernel_arch(tile) == 80)


MAX_SPLIT_K = 16


MIN_K_ITERATIONS_PER_SLICE = 8


def choose_split_k(gemm: GemmProblem, tile: TileConfig, arch: int, epilogue: Epilogue) -> int:
    """Serial split-K slices for an implicit GEMM that cannot fill the GPU (small N*P*Q, deep C*R*S).

    Slices run the main loop in parallel and take turns in the epilogue (each adds its partial sum
    to the output). Used only when the tiles fill less than half of the SMs, each slice keeps at
    least MIN_K_ITERATIONS_PER_SLICE main-loop iterations, and there is no residual (the residual
    block epilogue reads its second operand where split-K keeps the partial sums).
    """
    if epilogue.residual:
        return 1
    if not under_fills(gemm.m, gemm.n, tile.threadblock, arch):
        return 1
    ctas = output_tiles(gemm.m, gemm.n, tile.threadblock)
    iterations = math.ceil(gemm.k / tile.threadblock[2])
    split = min(MAX_SPLIT_K, SM_COUNT.get(arch, 108) // ctas, iterations // MIN_K_ITERATIONS_PER_SLICE)
    return split if split >= 2 else 1


def conv2d_note(problem: Conv2dProblem, arch: int, family: str = "auto") -> str:
    """Why `problem` gets the family it gets on `arch`, for the offload report ("" for the native one)."""
    if native_family(arch) != 90:
        return family_note(arch, 80)
    if resolve_family(family, arch) != "auto":
        return "SM80 kernel requested (family='sm80')"
    return sm90_conv_fallback_reason(problem) or ""


def choose_conv2d_kernel(
    problem: Conv2dProblem,
    epilogue: Epilogue,
    arch: int,
    n_hint: int = 1,
    family: str = "auto",
    tile: str = "",
    db=None,
) -> tuple[Conv2dKernel, int]:
    """-> (kernel, split-K slices): the tuning database's measured choice when it has one for this
    (static-batch) problem, else the best-ranked of `ranked_conv2d_tiles`: on sm_90a the SM90
    kernel (CUTLASS 3.x, TMA im2col + wgmma) where the problem fits TMA (`conv2d_family`), else the
    SM80 implicit-GEMM fprop kernel (for a grouped conv, its group mode follows from the tile:
    groups.group_mode). Blackwell runs the SM80 kernels (no tcgen05 conv yet; the note says so).
    """
    note = conv2d_note(problem, arch, family)
    gemm = problem.implicit_gemm(n_hint)
    legal = ranked_conv2d_tiles(problem, arch, n_hint, family)
    if db is not None and not tile:
        key = conv2d_key(problem, arch, conv2d_family(problem, arch, family))
        record, choice, tuned_note = (
            _stage_record(db, dataclasses.replace(key, epilogue=epilogue_key(epilogue, problem.element_out)))
            if problem.n is not None
            else (None, None, "")
        )
        match = next((t for t in legal if choice is not None and t.describe() == choice[0]), None)
        if match is not None and (choice[1] == 1 or splits_k(problem, epilogue, match)):
            note = "; ".join(filter(None, [note, tuned_note]))
            kernel = Conv2dKernel(
                problem, epilogue, match, arch=kernel_arch(match), target=arch, selected_by="tuned", note=note
            )
            return kernel, choice[1]
        why = "symbolic batch" if problem.n is None else "no tuning record" if record is None else "stale record"
        note = "; ".join(filter(None, [note, f"{why}: heuristic"]))
    if tile:
        chosen = next((t for t in legal if t.describe() == tile), None)
        if chosen is None:
            names = sorted(t.describe() for t in legal)
            raise ValueError(f"tile={tile!r} is not a conv2d candidate for {problem} on sm_{arch}; candidates: {names}")
        selected_by = "pinned"
    else:
        chosen, selected_by = legal[0], "heuristic"
        sm80 = next((t for t in legal if kernel_arch(t) == 80), None)
        if (
            kernel_arch(chosen) == 90
            and sm80 is not None
            and problem.n is not None  # a symbolic batch takes no split-K (kind.plan)
            and splits_k(problem, epilogue)
            and choose_split_k(gemm, sm80, arch, epilogue) > 1
        ):
            # Tiles that under-fill the GPU: the SM80 kernel's split-K fills it, the SM90 kernel
            # (no split-K) cannot.
            chosen, note = sm80, "; ".join(filter(None, [note, "output under-fills the GPU: SM80 split-K kernel"]))
    kernel = Conv2dKernel(
        problem, epilogue, chosen, arch=kernel_arch(chosen), target=arch, selected_by=selected_by, note=note
    )
    return kernel, choose_split_k(gemm, chosen, arch, epilogue) if splits_k(problem, epilogue, chosen) else 1
