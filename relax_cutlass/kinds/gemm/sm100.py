"""SM100 (datacenter Blackwell: sm_100a, sm_103a, sm_110a) GEMMs: CUTLASS 3.x kernels with TMA
loads, tcgen05 UMMA into tensor memory, 1-SM or 2-SM MMAs and thread-block clusters, the epilogue
as the same epilogue visitor tree (EVT) the SM90 kernels use (Blackwell's TMA epilogue takes SM90
EVT nodes).

Candidates are exactly the static-cluster configurations cutlass_library's
`GenerateSM100_TensorOp_16b_UMMA_gemm` emits. A configuration is named by its MMA tile (what one
UMMA computes: M 64/128 on one SM, 128/256 across the two SMs of a pair), cluster, "1sm" / "2sm"
and tile scheduler.

Not yet run on Blackwell hardware: every kernel is compile-verified (its SASS holds UTCHMMA,
stages/sass_check.py), and the heuristic below is the wave model, not a measurement.

Heuristic: run time ~ waves * (per-SM tile work) / efficiency, with
  * waves = ceil(MMA tiles * SMs per MMA / #SMs);
  * the per-SM tile (M/2 of the MMA tile for 2-SM MMAs) and its operand reuse: a 2-SM MMA splits
    B between the pair, so reuse = cta_m * n / (cta_m + n / sms);
  * efficiency = min(1, reuse / 128): tcgen05 issues twice the tensor work per SM of wgmma, so a
    tile must reuse its operands more than on Hopper (85) to keep it fed;
ties to 2-SM MMAs, then the larger tile.
"""

from __future__ import annotations

import functools
import math

from ...arch import SM_COUNT
from ..epilogue import Epilogue
from .emit_sm90 import CollectiveFamily, sm90_kernel_parts
from .generators import generated_gemms, stable_order
from .records import GemmKernel, GemmProblem, TileConfig

SM100_SCHEDULES = {"TmaWarpSpecialized1SmSm100": "1sm", "TmaWarpSpecialized2SmSm100": "2sm"}
SMS_PER_MMA = {"1sm": 1, "2sm": 2}
# schedule -> (kernel schedule, epilogue schedule): the TMA epilogue of the same SM count
SCHEDULES = {
    "1sm": ("cutlass::gemm::KernelTmaWarpSpecialized1SmSm100", "cutlass::epilogue::TmaWarpSpecialized1Sm"),
    "2sm": ("cutlass::gemm::KernelTmaWarpSpecialized2SmSm100", "cutlass::epilogue::TmaWarpSpecialized2Sm"),
}
# The heuristic's pool: (MMA tile M, N, schedule) on the smallest cluster its schedule takes.
HEURISTIC_TILES = {(256, 256, "2sm"), (256, 128, "2sm"), (128, 256, "2sm"), (128, 128, "2sm"),
                   (128, 256, "1sm"), (64, 128, "1sm")}  # fmt: skip
REUSE_FOR_FULL_RATE = 128.0


@functools.cache
def candidate_tiles_sm100(accumulator: str, element: str = "float16") -> tuple[TileConfig, ...]:
    """Distinct static-cluster SM100 16-bit UMMA configurations cutlass_library generates (the
    dynamic-cluster ones, cluster 0x0, need a run-time cluster shape this glue does not pass)."""
    tiles = {}
    for op in generated_gemms("GenerateSM100_TensorOp_16b_UMMA_gemm", "Universal3x", element, accumulator):
        td = op.tile_description
        schedule = SM100_SCHEDULES.get(op.kernel_schedule.name)
        if schedule is None or 0 in td.cluster_shape or op.tile_scheduler.name not in ("Default", "StreamK"):
            continue
        scheduler = "streamk" if op.tile_scheduler.name == "StreamK" else "default"
        tiles[sm100_config(op, schedule, scheduler)] = None
    return stable_order(tiles)


def sm100_config(op, schedule: str, scheduler: str = "default") -> TileConfig:
    """The TileConfig of a cutlass_library SM100 operation (GEMM or conv): named by its MMA tile
    (the instruction's M x N, the tile's K), cluster and "1sm" / "2sm" schedule."""
    td = op.tile_description
    instruction = tuple(td.math_instruction.instruction_shape)
    return TileConfig(
        threadblock=(instruction[0], instruction[1], td.tile_shape[2]),
        instruction=instruction,
        cluster=tuple(td.cluster_shape),
        schedule=schedule,
        scheduler=scheduler,
    )


def cta_tile(tile: TileConfig) -> tuple[int, int, int]:
    """One CTA's share of the MMA tile: half its M for a 2-SM MMA."""
    bm, bn, bk = tile.threadblock
    return (bm // SMS_PER_MMA[tile.schedule], bn, bk)


def estimate_cost_sm100(problem: GemmProblem, tile: TileConfig, arch: int, m_hint: int) -> float:
    """Relative run time of `tile` on `problem` under the wave model in the module docstring."""
    bm, bn, _ = tile.threadblock
    sms = SMS_PER_MMA[tile.schedule]
    mma_tiles = math.ceil((problem.m or m_hint) / bm) * math.ceil(problem.n / bn)
    waves = math.ceil(mma_tiles * sms / SM_COUNT.get(arch, 148))
    cta_m = bm // sms
    reuse = cta_m * bn / (cta_m + bn / sms)
    return waves * cta_m * bn / min(1.0, reuse / REUSE_FOR_FULL_RATE)


def heuristic_pool(problem: GemmProblem) -> list[TileConfig]:
    """The data-parallel configurations the heuristic ranks, each on its smallest cluster."""
    return smallest_cluster_pool(candidate_tiles_sm100(problem.element_accumulator, problem.element_a))


def smallest_cluster_pool(tiles) -> list[TileConfig]:
    """Of `tiles`, the data-parallel HEURISTIC_TILES configurations, each on its smallest cluster
    (the SM100 GEMM and conv heuristics' pool)."""
    smallest: dict[tuple, TileConfig] = {}
    for t in tiles:
        key = (t.threadblock[0], t.threadblock[1], t.schedule)
        if t.scheduler != "default" or key not in HEURISTIC_TILES:
            continue
        if key not in smallest or math.prod(t.cluster) < math.prod(smallest[key].cluster):
            smallest[key] = t
    return list(smallest.values())


def rank_sm100(problem: GemmProblem, tile: TileConfig, arch: int, m_hint: int) -> tuple:
    return (
        estimate_cost_sm100(problem, tile, arch, m_hint),
        -SMS_PER_MMA[tile.schedule],
        -tile.threadblock[0] * tile.threadblock[1],
        tile.describe(),
    )


def choose_sm100(problem: GemmProblem, epilogue: Epilogue, arch: int, m_hint: int, note: str) -> GemmKernel:
    best = min(heuristic_pool(problem), key=lambda t: rank_sm100(problem, t, arch, m_hint))
    return GemmKernel(problem, epilogue, best, arch=100, target=arch, selected_by="heuristic", note=note)


def _sm100_tile_shapes(tile: TileConfig) -> tuple[str, str]:
    mma, cta = tile.threadblock, cta_tile(tile)
    return (
        "using MmaTileShape = cute::Shape<cute::_{}, cute::_{}, cute::_{}>;\n".format(*mma)
        + "// One CTA's share of the MMA tile (half its M for a 2-SM MMA): what the EVT's broadcasts tile by.\n"
        + "using TileShape = cute::Shape<cute::_{}, cute::_{}, cute::_{}>;\n".format(*cta),
        "MmaTileShape",
    )


# Programmatic dependent launch as for SM90 (emit_sm90.py), under SM100's switch; stream-K kernels
# launch plainly there too (emit_sm90.PDL_SCHEDULERS).
SM100 = CollectiveFamily(
    arch="Sm100",
    schedules=SCHEDULES,
    pdl_define="#define CUTLASS_ENABLE_GDC_FOR_SM100 1  // before any CUTLASS header: see emit_sm90.py\n",
    tile_shapes=_sm100_tile_shapes,
)


def sm100_kernel_parts(kernel: GemmKernel) -> dict[str, str]:
    """includes / instance / operation_type / arguments for templates.KERNEL_TU."""
    return sm90_kernel_parts(kernel, SM100)
