"""conv2d kernel choice: SM80 implicit-GEMM candidates, the wave-model heuristic of the implicit GEMM,
serial split-K for outputs that cannot fill the GPU, tuned choices."""

from __future__ import annotations

import dataclasses
import functools
import math

from ...arch import SM_COUNT, family_note, resolve_family
from ...cutlass_lib import data_type
from ...stages.tuning import epilogue_key
from ..epilogue import Epilogue
from ..gemm.records import GemmProblem, TileConfig
from ..gemm.select import (
    _fitting,
    _generated,
    _pinned,
    _rank_sm80,
    _sm80_tile,
    _stable,
    _stage_record,
    output_tiles,
    under_fills,
)
from .records import Conv2dKernel, Conv2dProblem, conv2d_key


@functools.cache
def candidate_conv2d_tiles(accumulator: str, element: str = "float16") -> tuple[TileConfig, ...]:
    """Distinct tiles of the SM80 conv2d fprop kernels (optimized iterators, no groups) that
    `GenerateSM80_TensorOp_16816` emits for these input/accumulator types."""
    from cutlass_library.library import ConvKind, GroupMode, IteratorAlgorithm, OperationKind

    tiles = {
        _sm80_tile(op, swizzle=4): None  # the generator's conv swizzle (GemmIdentityThreadblockSwizzle<4>)
        for op in _generated("GenerateSM80_TensorOp_16816")
        if op.operation_kind == OperationKind.Conv2d
        and op.conv_kind == ConvKind.Fprop
        and op.iterator_algorithm == IteratorAlgorithm.Optimized
        and op.group_mode == GroupMode.NoneGroup
        and op.A.element == data_type(element)
        and op.accumulator_type() == data_type(accumulator)
    }
    return _stable(tiles)


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
    (static-batch) problem, else the SM80 implicit-GEMM fprop kernel the wave model ranks best.

    SM90 targets run these CUTLASS 2.x kernels too (the kernel's note says so): relax_cutlass does
    not instantiate CUTLASS 3.x convolutions yet.
    """
    resolve_family(family, arch)  # conv2d has one kernel family so far; a wrong option still fails
    note = "SM80 implicit-GEMM conv kernel (no CUTLASS 3.x conv yet)" if arch == 90 else family_note(arch, 80)
    gemm = problem.implicit_gemm(n_hint)
    legal = _fitting(candidate_conv2d_tiles(problem.element_accumulator, problem.element), arch, problem)
    if db is not None and not tile:
        record, choice, tuned_note = (
            _stage_record(
                db, dataclasses.replace(conv2d_key(problem, arch), epilogue=epilogue_key(epilogue, problem.element_out))
            )
            if problem.n is not None
            else (None, None, "")
        )
        match = next((t for t in legal if choice is not None and t.describe() == choice[0]), None)
        if match is not None and not (epilogue.residual and choice[1] > 1):
            note = "; ".join(filter(None, [note, tuned_note]))
            kernel = Conv2dKernel(problem, epilogue, match, arch=80, target=arch, selected_by="tuned", note=note)
            return kernel, choice[1]
        why = "symbolic batch" if problem.n is None else "no tuning record" if record is None else "stale record"
        note = "; ".join(filter(None, [note, f"{why}: heuristic"]))
    if tile:
        pinned = _pinned(gemm, epilogue, arch, 80, legal, tile, note)
        chosen, selected_by = pinned.tile, "pinned"
    else:
        chosen, selected_by = min(legal, key=lambda t: _rank_sm80(gemm, t, arch, gemm.m)), "heuristic"
    kernel = Conv2dKernel(problem, epilogue, chosen, arch=80, target=arch, selected_by=selected_by, note=note)
    return kernel, choose_split_k(gemm, chosen, arch, epilogue)
