"""Kernel choice: enumerate candidate tiles from cutlass_library, pick one by a documented heuristic.

Candidates are exactly the SM80 fp16 tensor-op tile descriptions that cutlass_library's own
generator (`GenerateSM80_TensorOp_16816`) emits, so every kernel we build is one CUTLASS ships and
tests. The heuristic (until profiling lands, see docs/kernel-selection.md) models run time as

    waves(tile) * tile_work / efficiency(tile)

  * waves = ceil(#CTAs / #SMs): tiles on the busiest SM (wave quantization), the dominant effect
    for the medium-sized GEMMs of transformer layers (a 1024x4096 problem is 128 CTAs of 128x256:
    one wave on an H100's 132 SMs, but two on an A100's 108);
  * efficiency = min(1, reuse / 85) with reuse = bm*bn/(bm+bn), the arithmetic intensity of a
    CTA main loop in elements: 128x256 / 256x128 tiles feed the tensor cores at full rate,
    smaller tiles are bandwidth-bound in proportion;
  * ties go to the larger K tile for K >= 1024 (fewer main-loop iterations), then more stages.
"""

from __future__ import annotations

import functools
import math

from .arch import SM_COUNT
from .cutlass_lib import load as load_cutlass_library
from .kernel_spec import Epilogue, GemmKernel, GemmProblem, TileConfig

# Shared memory a CTA may use, per SM generation (bytes).
SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
DEFAULT_M_HINT = 1024


class _Collector:
    """Stands in for cutlass_library's Manifest: keeps every operation the generator appends."""

    kernel_filter = "all"  # non-empty: the generator emits every tile, not only the first

    def __init__(self):
        self.operations = []

    def append(self, operation):
        self.operations.append(operation)

    def __getattr__(self, name):  # other Manifest knobs the generator reads: treat as unset
        return None


@functools.cache
def candidate_tiles(accumulator: str) -> tuple[TileConfig, ...]:
    """Distinct SM80 16x8x16 fp16 tensor-op tiles cutlass_library generates for this accumulator."""
    load_cutlass_library()
    from cutlass_library import generator
    from cutlass_library.gemm_operation import GemmOperation
    from cutlass_library.library import DataType, GemmKind

    collector = _Collector()
    generator.GenerateSM80_TensorOp_16816(collector, "13.0")
    acc = {"float32": DataType.f32, "float16": DataType.f16}[accumulator]
    tiles = {}
    for op in collector.operations:
        td = op.tile_description
        mi = td.math_instruction
        if (
            not isinstance(op, GemmOperation)
            or op.gemm_kind != GemmKind.Universal
            or mi.element_a != DataType.f16
            or mi.element_accumulator != acc
        ):
            continue
        tile = TileConfig(
            threadblock=tuple(td.threadblock_shape),
            warps=tuple(td.warp_count),
            stages=td.stages,
            instruction=tuple(mi.instruction_shape),
        )
        tiles[tile] = None
    return tuple(tiles)


def _smem_bytes(tile: TileConfig) -> int:
    bm, bn, bk = tile.threadblock
    return tile.stages * (bm * bk + bk * bn) * 2


def estimate_cost(problem: GemmProblem, tile: TileConfig, arch: int, m_hint: int = DEFAULT_M_HINT) -> float:
    """Relative run time of `tile` on `problem` under the heuristic in this module's docstring."""
    bm, bn, _ = tile.threadblock
    m = problem.m or m_hint
    ctas = math.ceil(m / bm) * math.ceil(problem.n / bn)
    # The busiest SM's share of tiles: CTAs co-resident on one SM share its tensor cores, so
    # quantization is per SM, not per CTA slot.
    tiles_on_busiest_sm = math.ceil(ctas / SM_COUNT.get(arch, 108))
    efficiency = min(1.0, bm * bn / (bm + bn) / 85.0)
    return tiles_on_busiest_sm * bm * bn / efficiency


def choose_kernel(problem: GemmProblem, epilogue: Epilogue, arch: int, m_hint: int = DEFAULT_M_HINT) -> GemmKernel:
    """Pick the heuristic-best legal tile for `problem`, instantiated with `epilogue`."""
    smem_limit = SMEM_LIMIT.get(arch, SMEM_LIMIT[80])
    legal = [t for t in candidate_tiles(problem.element_accumulator) if _smem_bytes(t) <= smem_limit]
    if not legal:
        raise RuntimeError(f"no CUTLASS tile fits sm_{arch}'s shared memory for {problem}")

    def rank(tile: TileConfig):
        prefer_deep_k = tile.threadblock[2] if problem.k >= 1024 else -tile.threadblock[2]
        return (estimate_cost(problem, tile, arch, m_hint), -prefer_deep_k, -tile.stages)

    best = min(legal, key=rank)
    return GemmKernel(problem=problem, epilogue=epilogue, tile=best, arch=80, selected_by="heuristic")
