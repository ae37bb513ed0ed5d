"""conv2d kernel choice: SM80 implicit-GEMM candidates (grouped convs: those of the group mode each
tile width puts them in) and, on sm_90a and the tcgen05 SMs, CUTLASS 3.x kernels (select_3x.py)
where the problem fits TMA; the wave-model heuristic of the implicit GEMM, serial split-K for SM80
outputs that cannot fill the GPU, tuned choices."""

from __future__ import annotations

import dataclasses
import functools
import math

from ...arch import SM_COUNT, family_note, native_family, resolve_family
from ...cutlass_lib import data_type
from .. import PlanError
from ..epilogue import Epilogue, epilogue_key
from ..gemm.generators import generated_operations, stable_order
from ..gemm.records import GemmProblem, TileConfig
from ..gemm.select import (
    estimate_cost,
    fitting_tiles,
    output_tiles,
    rank_sm80,
    sm80_tile,
    stage_record,
    under_fills,
)
from .groups import group_mode
from .records import Conv2dKernel, Conv2dProblem, conv2d_key, conv_family
from .select_3x import candidate_conv2d_tiles_3x, conv2d_family, rank_3x_conv2d_tile, tma_conv_fallback_reason

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
        sm80_tile(op, swizzle=4): None  # the generator's conv swizzle (GemmIdentityThreadblockSwizzle<4>)
        for op in generated_operations("GenerateSM80_TensorOp_16816")
        if op.operation_kind == OperationKind.Conv2d
        and op.conv_kind == ConvKind.Fprop
        and op.iterator_algorithm == getattr(IteratorAlgorithm, iterator)
        and op.group_mode == getattr(GroupMode, generated_mode)
        and op.A.element == data_type(element)
        and op.accumulator_type() == data_type(accumulator)
    }
    return stable_order(tiles)


def grouped_tile_widths(element: str) -> set[int]:
    """The CTA tile widths (N) of the grouped kernels cutlass_library generates for `element`."""
    modes = ("single", "multiple")
    return {t.threadblock[1] for mode in modes for t in candidate_conv2d_tiles("float32", element, mode)}


def conv2d_tiles(problem: Conv2dProblem, arch: int, family: str = "auto") -> list[TileConfig]:
    """The candidate tiles that can run `problem` on `arch`: its CUTLASS 3.x kernels' (sm_90a:
    SM90, sm_100a / sm_103a / sm_110a: SM100; where `conv2d_family` takes them), then the SM80 ones
    that fit `arch`'s shared memory: the ungrouped kernels' tiles, or for a grouped conv those of
    each group mode whose width puts it in that mode (groups.group_mode)."""
    native = conv2d_family(problem, arch, family)
    tiles_3x = list(candidate_conv2d_tiles_3x(native)) if native != 80 else []
    return tiles_3x + _sm80_conv2d_tiles(problem, arch)


def _sm80_conv2d_tiles(problem: Conv2dProblem, arch: int) -> list[TileConfig]:
    acc, element = problem.element_accumulator, problem.element
    if problem.groups == 1:
        tiles = candidate_conv2d_tiles(acc, element)
    else:
        tiles = stable_order(
            t
            for mode in ("single", "multiple")
            for t in candidate_conv2d_tiles(acc, element, mode)
            if group_mode(problem.groups, problem.k, t.threadblock[1]) == mode
        )
    return fitting_tiles(tiles, arch, problem)


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
        return rank_sm80(gemm, tile, arch, gemm.m)
    cost = estimate_cost(gemm, tile, arch, gemm.m) * grouped_main_loop(problem, tile)
    return (cost, -tile.stages, -tile.threadblock[0], tile.describe())


def ranked_conv2d_tiles(problem: Conv2dProblem, arch: int, n_hint: int = 1, family: str = "auto") -> list[TileConfig]:
    """`conv2d_tiles`, best first: the CUTLASS 3.x ones (when there are any) by their family's
    rank (select_3x), then the SM80 ones by `rank_conv2d_tile`."""
    tiles = conv2d_tiles(problem, arch, family)
    tiles_3x = [t for t in tiles if conv_family(t) != 80]
    sm80 = [t for t in tiles if conv_family(t) == 80]
    tiles_3x.sort(key=lambda t: rank_3x_conv2d_tile(problem, t, arch, n_hint))
    sm80.sort(key=lambda t: rank_conv2d_tile(problem, t, arch, n_hint))
    return tiles_3x + sm80


def splits_k(problem: Conv2dProblem, epilogue: Epilogue, tile: TileConfig | None = None) -> bool:
    """Whether the kernel may take serial split-K: not with a residual (the residual block epilogue
    reads its second operand where split-K keeps the partial sums), not grouped (CUTLASS's grouped
    kernels refuse split-K) and not a CUTLASS 3.x kernel (`tile`: they have no split-K)."""
    return not epilogue.residual and problem.groups == 1 and (tile is None or conv_family(tile) == 80)


MAX_SPLIT_K = 16


# Each slice keeps at least this many main-loop iterations. Profiled on the H200 (DenseNet-121's
# convs at batch 32, bench/results/2026-12-02-densenet-convs-nvidia-h200.json), every split of 8 or
# 9 iterations a slice ran 1.5-2x slower than the same problem unsplit, on the SM80 tile or on the
# SM90 kernel the split replaced: a (1568 x 128, K=512) 1x1 conv 10.9 us split in 2, 5.8 us on
# SM90; a (1568 x 32, K=1152) 3x3 one 13.5 us split in 2, 9.0 us unsplit. Deeper problems (ResNet
# at batch 1, K up to 4608) still split.
MIN_K_ITERATIONS_PER_SLICE = 16


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
    """Why `problem` gets the family it gets on `arch`, for the offload report ("" for sm_90a's
    own; SM100's says it has not run on hardware)."""
    if native_family(arch) == 80:
        return family_note(arch, 80)
    if resolve_family(family, arch) != "auto":
        return "SM80 kernel requested (family='sm80')"
    return tma_conv_fallback_reason(problem) or family_note(arch)


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
    kernel (CUTLASS 3.x, TMA im2col + wgmma) and on sm_100a / sm_103a / sm_110a the SM100 one
    (+ tcgen05) where the problem fits TMA (`conv2d_family`), else the SM80 implicit-GEMM fprop
    kernel (for a grouped conv, its group mode follows from the tile: groups.group_mode).
    """
    note = conv2d_note(problem, arch, family)
    gemm = problem.implicit_gemm(n_hint)
    legal = ranked_conv2d_tiles(problem, arch, n_hint, family)
    if db is not None and not tile:
        key = conv2d_key(problem, arch, conv2d_family(problem, arch, family))
        record, choice, tuned_note = (
            stage_record(db, dataclasses.replace(key, epilogue=epilogue_key(epilogue, problem.element_out)))
            if problem.n is not None
            else (None, None, "")
        )
        match = next((t for t in legal if choice is not None and t.describe() == choice[0]), None)
        if match is not None and (choice[1] == 1 or splits_k(problem, epilogue, match)):
            note = "; ".join(filter(None, [note, tuned_note]))
            kernel = Conv2dKernel(problem, epilogue, match, target=arch, selected_by="tuned", note=note)
            return kernel, choice[1]
        why = "symbolic batch" if problem.n is None else "no tuning record" if record is None else "stale record"
        untuned = f"{why}: heuristic"
    else:
        untuned = ""
    if tile:
        chosen = next((t for t in legal if t.describe() == tile), None)
        if chosen is None:
            names = sorted(t.describe() for t in legal)
            raise PlanError(f"tile={tile!r} is not a conv2d candidate for {problem} on sm_{arch}; candidates: {names}")
        selected_by = "pinned"
    else:
        chosen, selected_by = legal[0], "heuristic"
        sm80 = next((t for t in legal if conv_family(t) == 80), None)
        if (
            conv_family(chosen) != 80
            and sm80 is not None
            and problem.n is not None  # a symbolic batch takes no split-K (kind.plan)
            and splits_k(problem, epilogue)
            and choose_split_k(gemm, sm80, arch, epilogue) > 1
        ):
            # Tiles that under-fill the GPU: the SM80 kernel's split-K fills it, the CUTLASS 3.x
            # kernel (no split-K) cannot.
            chosen, note = sm80, "output under-fills the GPU: SM80 split-K kernel"
    note = "; ".join(filter(None, [note, untuned]))
    kernel = Conv2dKernel(problem, epilogue, chosen, target=arch, selected_by=selected_by, note=note)
    return kernel, choose_split_k(gemm, chosen, arch, epilogue) if splits_k(problem, epilogue, chosen) else 1
