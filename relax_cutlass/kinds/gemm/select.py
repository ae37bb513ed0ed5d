"""Kernel choice: enumerate candidate configurations from cutlass_library, pick one by a documented heuristic.

Candidates are exactly the configurations cutlass_library's own generators emit for the input and
accumulator types (`GenerateSM80_TensorOp_16816` for CUTLASS 2.x kernels,
`GenerateSM90_TensorOp_16b_WGMMA_gemm` for SM90), so every kernel we build is one CUTLASS ships and
tests. The heuristic (until profiling lands, see docs/kernel-selection.md) models run time as

    waves(tile) * tile_work / efficiency(tile)

  * waves = ceil(#CTAs / #SMs): tiles on the busiest SM (wave quantization), the dominant effect
    for the medium-sized GEMMs of transformer layers (a 1024x4096 problem is 128 CTAs of 128x256:
    one wave on an H100's 132 SMs, but two on an A100's 108);
  * efficiency = min(1, reuse / 85) with reuse = bm*bn/(bm+bn), the arithmetic intensity of a
    CTA main loop in elements: 128x256 / 256x128 tiles feed the tensor cores at full rate,
    smaller tiles are bandwidth-bound in proportion;
  * SM80 ties go to the larger K tile for K >= 1024 (fewer main-loop iterations), then more
    stages, then the taller tile; SM90 uses the measured rule in `_choose_sm90`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from ...arch import SM_COUNT, family_note, native_family, resolve_family, smem_limit
from ...toolkit.dtypes import DTYPE_BITS
from ...toolkit.settings import DEFAULT_M_HINT
from ...toolkit.tuning import m_bucket, parse_label
from .. import PlanError
from ..epilogue import Epilogue, epilogue_key
from .generators import generated_gemms, stable_order
from .records import GemmKernel, GemmProblem, TileConfig, gemm_key
from .sm100 import candidate_tiles_sm100, choose_sm100


def sm80_tile(op, swizzle: int = 8) -> TileConfig:
    """A CUTLASS 2.x operation's TileDescription as a TileConfig."""
    td = op.tile_description
    return TileConfig(
        threadblock=tuple(td.threadblock_shape),
        warps=tuple(td.warp_count),
        stages=td.stages,
        instruction=tuple(td.math_instruction.instruction_shape),
        swizzle=swizzle,
    )


@functools.cache
def candidate_tiles(accumulator: str, element: str = "float16") -> tuple[TileConfig, ...]:
    """Distinct SM80 16x8x16 tensor-op tiles cutlass_library generates for these input/accumulator types."""
    operations = generated_gemms("GenerateSM80_TensorOp_16816", "Universal", element, accumulator)
    tiles = {sm80_tile(op): None for op in operations}
    return stable_order(tiles)


SM90_SCHEDULES = {"TmaWarpSpecializedCooperative": "cooperative", "TmaWarpSpecializedPingpong": "pingpong"}

# CTA tiles below 128x128, for problems whose 128x128 tiles under-fill the GPU (BERT-large at
# batch 8, M = N = 1024: 64 CTAs on the H200's 132 SMs; these tiles make 128): each with the
# schedules listed, persistent data-parallel scheduler only (no stream-K / split-K variants).
# cutlass_library emits them only above its default instantiation level: 1112 is no pruning (the
# default drops 16-bit tiles up to 64x128x64), 1x2 / 2x1 clusters, MMA multipliers 2x1x4 and
# 1x1x4, wgmma N shapes that are powers of 2. That level's narrower tiles (64x16 to 64x64, 128x16,
# 128x32) are not taken.
SM90_SMALL_TILES_LEVEL = 1112
SM90_SMALL_TILES = {(64, 128, 64): ("pingpong",), (128, 64, 64): ("cooperative", "pingpong")}


def _sm90_configs(accumulator: str, element: str, instantiation_level: int | None = None) -> dict:
    """The distinct SM90 configurations (as TileConfigs, insertion-ordered keys) of
    `GenerateSM90_TensorOp_16b_WGMMA_gemm` at `instantiation_level`."""
    return {
        TileConfig(
            threadblock=tuple(op.tile_description.tile_shape),
            instruction=tuple(op.tile_description.math_instruction.instruction_shape),
            cluster=tuple(op.tile_description.cluster_shape),
            schedule=SM90_SCHEDULES[op.kernel_schedule.name],
            scheduler="streamk" if op.tile_scheduler.name == "StreamK" else "default",
        ): None
        for op in generated_gemms(
            "GenerateSM90_TensorOp_16b_WGMMA_gemm", "Universal3x", element, accumulator, instantiation_level
        )
        if op.kernel_schedule.name in SM90_SCHEDULES
    }


@functools.cache
def candidate_tiles_sm90(accumulator: str, element: str = "float16") -> tuple[TileConfig, ...]:
    """Distinct SM90 16-bit wgmma configurations of `GenerateSM90_TensorOp_16b_WGMMA_gemm`:
    CTA tile, cluster, cooperative / ping-pong schedule, default / stream-K tile scheduler, and
    for every stream-K one its split-K variant (the same scheduler in another run-time mode);
    then, after them (so the default level's configurations keep their order), the
    `SM90_SMALL_TILES` configurations of its level `SM90_SMALL_TILES_LEVEL`."""
    tiles = _sm90_configs(accumulator, element)
    tiles.update({dataclasses.replace(t, scheduler="splitk"): None for t in tiles if t.scheduler == "streamk"})
    default = stable_order(t for t in tiles if accumulator_registers(t, accumulator) <= SM90_MAX_ACCUMULATOR_REGISTERS)
    small = stable_order(
        t
        for t in _sm90_configs(accumulator, element, SM90_SMALL_TILES_LEVEL)
        if t.scheduler == "default"
        and t.schedule in SM90_SMALL_TILES.get(t.threadblock, ())
        and accumulator_registers(t, accumulator) <= SM90_MAX_ACCUMULATOR_REGISTERS
        and t not in tiles
    )
    return default + small


# Accumulator registers per thread an SM90 configuration may need. A ping-pong warp group holds a
# whole CTA tile, a cooperative one half of it: 128x256 ping-pong (and 256x256 cooperative) need 256
# fp32 registers per thread, more than a consumer warp group gets (240), and spill. On the H100
# every such kernel cutlass_library lists ran 10-20x slower than the fastest candidate (tuning records
# of 2026-11-23), wasting tuning slots and compile time.
SM90_MAX_ACCUMULATOR_REGISTERS = 128


def accumulator_registers(tile: TileConfig, accumulator: str) -> int:
    """32-bit registers per consumer thread holding the accumulator tile: a cooperative CTA splits
    it over two consumer warp groups, the others (ping-pong, the conv kernels' plain warp-specialized
    schedule) hold it in one."""
    warp_groups = 2 if tile.schedule == "cooperative" else 1
    bm, bn, _ = tile.threadblock
    return bm * bn * DTYPE_BITS[accumulator] // 32 // (128 * warp_groups)


def tile_smem_bytes(tile: TileConfig) -> int:
    bm, bn, bk = tile.threadblock
    return tile.stages * (bm * bk + bk * bn) * 2


def output_tiles(m: int, n: int, threadblock) -> int:
    """CTA tiles covering an M x N output."""
    return math.ceil(m / threadblock[0]) * math.ceil(n / threadblock[1])


def under_fills(m: int, n: int, threadblock, arch: int) -> bool:
    """The CTA tiles of an M x N grid fill at most half of the SMs (where split-K, or smaller
    tiles, can pay)."""
    return 2 * output_tiles(m, n, threadblock) <= SM_COUNT.get(arch, 108)


def estimate_cost(problem: GemmProblem, tile: TileConfig, arch: int, m_hint: int = DEFAULT_M_HINT) -> float:
    """Relative run time of `tile` on `problem` under the heuristic in this module's docstring."""
    bm, bn, _ = tile.threadblock
    ctas = output_tiles(problem.m or m_hint, problem.n, tile.threadblock)
    # The busiest SM's share of tiles: CTAs co-resident on one SM share its tensor cores, so
    # quantization is per SM, not per CTA slot.
    tiles_on_busiest_sm = math.ceil(ctas / SM_COUNT.get(arch, 108))
    efficiency = min(1.0, bm * bn / (bm + bn) / 85.0)
    return tiles_on_busiest_sm * bm * bn / efficiency


def tma_fallback_reason(problem: GemmProblem, family: int = 90) -> str | None:
    """Why a target of CUTLASS 3.x `family` (90: wgmma, 100: tcgen05) cannot use a kernel of it
    for `problem` (TMA loads), if it cannot."""
    if problem.alignment < 8:
        return f"K={problem.k} / N={problem.n} not multiples of 8 (TMA needs 16-byte rows): SM80 kernel"
    if not tiles_of_family(family)(problem.element_accumulator, problem.element_a):
        return f"no SM{family} {problem.element_accumulator}-accumulator configuration in cutlass_library: SM80 kernel"
    return None


def native_3x(problem: GemmProblem, arch: int, family: str) -> int:
    """The kernel family `problem` gets on `arch`: the target's CUTLASS 3.x family (90, 100) when
    `family` allows it and the problem fits it, else 80."""
    native = native_family(arch)
    if native == 80 or resolve_family(family, arch) != "auto" or tma_fallback_reason(problem, native):
        return 80
    return native


def tiles_of_family(family: int):
    """The candidate function of a kernel family."""
    return {90: candidate_tiles_sm90, 100: candidate_tiles_sm100}.get(family, candidate_tiles)


def choose_kernel(
    problem: GemmProblem,
    epilogue: Epilogue,
    arch: int,
    m_hint: int = DEFAULT_M_HINT,
    family: str = "auto",
    tile: str = "",
    db=None,
) -> GemmKernel:
    """Pick the configuration for `problem`, instantiated with `epilogue`: the tuning database's
    measured choice when `db` has a record for it, else the heuristic.

    sm_90a targets get CUTLASS 3.x wgmma kernels and sm_100a / sm_103a / sm_110a CUTLASS 3.x
    tcgen05 kernels, unless `family="sm80"` or the problem rules them out (the reason is kept in the
    kernel's note, and shown by the offload report); every other target (Ampere, Ada, GeForce
    Blackwell) gets CUTLASS 2.x kernels (`arch.native_family`). `tile` pins a configuration by its
    `TileConfig.describe()` name (for sweeps and profiling).
    """
    family = resolve_family(family, arch)
    if db is not None and not tile:
        tuned = _tuned(problem, epilogue, arch, m_hint, family, db)
        if isinstance(tuned, GemmKernel):
            return tuned
        kernel = choose_kernel(problem, epilogue, arch, m_hint, family)
        return dataclasses.replace(kernel, note="; ".join(filter(None, [kernel.note, tuned])))
    native = native_family(arch)
    note = family_note(arch) if native == 80 else ""
    if native != 80 and family == "auto":
        note = tma_fallback_reason(problem, native) or ""
        if not note:
            why = family_note(arch)  # "" on sm_90a; SM100: not yet run on hardware
            if tile:
                candidates = tiles_of_family(native)(problem.element_accumulator, problem.element_a)
                return _pinned(problem, epilogue, arch, native, candidates, tile, why)
            if native == 100:
                return choose_sm100(problem, epilogue, arch, m_hint, why)
            return _choose_sm90(problem, epilogue, arch, m_hint)
    elif native != 80:
        note = "SM80 kernel requested (family='sm80')"
    legal = fitting_tiles(candidate_tiles(problem.element_accumulator, problem.element_a), arch, problem)
    if tile:
        return _pinned(problem, epilogue, arch, 80, legal, tile, note)
    best = min(legal, key=lambda t: rank_sm80(problem, t, arch, m_hint))
    return GemmKernel(problem, epilogue, best, arch=80, target=arch, selected_by="heuristic", note=note)


def fitting_tiles(tiles, arch: int, problem) -> list[TileConfig]:
    legal = [t for t in tiles if tile_smem_bytes(t) <= smem_limit(arch)]
    if not legal:
        raise RuntimeError(f"no CUTLASS tile fits sm_{arch}'s shared memory for {problem}")
    return legal


def rank_sm80(problem: GemmProblem, tile: TileConfig, arch: int, m_hint: int):
    prefer_deep_k = tile.threadblock[2] if problem.k >= 1024 else -tile.threadblock[2]
    # Remaining ties (e.g. 256x128 vs 128x256) go to the taller tile, as in cutlass_library's list.
    return (
        estimate_cost(problem, tile, arch, m_hint),
        -prefer_deep_k,
        -tile.stages,
        -tile.threadblock[0],
        tile.describe(),
    )


# Two timings closer than this are a tie: back-to-back launches in the profiler and the same
# kernel inside a model differ by a few percent (H100, 2026-11-23: conv stages whose stage-2 winner
# was 2% faster alone ran 4% slower in the model).
TIE_MARGIN = 0.03


def measured_choice(record) -> tuple[str, int, float]:
    """(tile name, split-K slices, ms) a build takes from a record: the fastest correct candidate,
    except that among the candidates within TIE_MARGIN of it the heuristic's kernel wins, then an
    unsplit one (split-K adds a workspace, a memset and a second pass over the output)."""
    ok = {label: ms for label, ms in record.candidates.items() if ms is not None}
    if not ok:  # a record written without its candidates' times: its choice as recorded
        return record.tile, record.split_k, record.ms
    best = min(ok.values())
    tied = {label: ms for label, ms in ok.items() if ms <= best * (1 + TIE_MARGIN)}
    unsplit = {label: ms for label, ms in tied.items() if "_splitk" not in label}  # either kind
    label = record.heuristic if record.heuristic in tied else min(unsplit or tied, key=(unsplit or tied).get)
    tile, split = parse_label(label)
    return tile, split, ok[label]


def stage_record(db, key):
    """The record of `key` with its epilogue (stage 2) if any, else of its main loop (stage 1),
    and its choice (tile, split-K, ms); the note says which kind of timing chose the kernel."""
    record = db.lookup(key) if key.epilogue else None
    timing = f"with its {key.epilogue} epilogue"
    if record is None:
        record, timing = db.lookup(dataclasses.replace(key, epilogue="")), "without epilogue"
    if record is None:
        return None, None, ""
    choice = measured_choice(record)
    return record, choice, f"measured {choice[2] * 1e3:.1f} us {timing} on {record.device}"


def _tuned(problem: GemmProblem, epilogue: Epilogue, arch: int, m_hint: int, family: str, db) -> GemmKernel | str:
    """The database's kernel for `problem`, or why there is none (a note for the report)."""
    native = native_3x(problem, arch, family)
    m = problem.m if problem.m is not None else m_bucket(m_hint)
    key = dataclasses.replace(gemm_key(problem, arch, native, m), epilogue=epilogue_key(epilogue, problem.element_out))
    record, choice, note = stage_record(db, key)
    if record is None:
        return f"no tuning record for M={m} N={problem.n} K={problem.k}: heuristic"
    # A record measured before the heuristic's current kernel was a candidate (an older candidate
    # set) cannot show that its winner beats it: the heuristic stands until the problem is re-tuned.
    heuristic = choose_kernel(dataclasses.replace(problem, m=m), epilogue, arch, m_hint, family).tile.describe()
    if record.candidates and heuristic not in record.candidates:
        return f"tuning record for M={m} N={problem.n} K={problem.k} never timed {heuristic}: heuristic (re-tune)"
    for candidate in tiles_of_family(native)(problem.element_accumulator, problem.element_a):
        if candidate.describe() == choice[0]:
            note = "; ".join(filter(None, [family_note(arch), note]))
            return GemmKernel(problem, epilogue, candidate, arch=native, target=arch, selected_by="tuned", note=note)
    return f"tuning record names {choice[0]!r}, not a candidate here: heuristic"


def _pinned(problem, epilogue, arch, family, candidates, tile: str, note: str = "") -> GemmKernel:
    for candidate in candidates:
        if candidate.describe() == tile:
            return GemmKernel(problem, epilogue, candidate, arch=family, target=arch, selected_by="pinned", note=note)
    names = sorted(c.describe() for c in candidates)
    spill = (
        f" (SM90 configurations needing more than {SM90_MAX_ACCUMULATOR_REGISTERS} accumulator registers per "
        "thread, such as 128x256 ping-pong or 256x256, are not candidates: they spill and run 10-20x slower)"
        if family == 90
        else ""
    )
    raise PlanError(f"tile={tile!r} is not an SM{family} candidate for sm_{arch}{spill}; candidates: {names}")


# Measured on an H100 (bench/results, sweep of 14 configurations x 9 shapes, dense + bias + gelu):
# 256x256 tiles (two consumer warpgroups each holding a 128x256 fp32 accumulator) ran ~20x slower
# than 128x256 (they are no longer candidates at all: SM90_MAX_ACCUMULATOR_REGISTERS), and stream-K
# ran below data-parallel tiles on the one under-filled shape, so the heuristic never picks it
# (it stays available to tile= and to profiling).
SM90_HEURISTIC_TILES = ((128, 128, 64), (128, 256, 64), (256, 128, 64))
SM90_PINGPONG = ((128, 128, 64), (2, 1, 1))  # short main loops: K <= 2048, >= 2 waves of tiles
SM90_COOPERATIVE_TIE = ((256, 128, 64), (1, 2, 1))
# Where 128x128 tiles fill at most half of the SMs: 64x128 ping-pong on a 2x1 cluster (twice the
# CTAs). Tuned on the H200 (2026-11-27, the profiler timing both small tiles, both schedules and
# the heuristic's 128x128), a small tile won every such problem of BERT-large and GPT-2: 64x128
# ping-pong at 1024x1024x4096 (15.8 vs 20.7 us) and 512x768x768 (5.3 vs 5.8), 128x64 cooperative
# at 512x768x3072 (9.8 vs 16.0) and 1024x1024x1024 (7.4 vs 7.9); a BERT-large tuning on the H200
# took 64x128 ping-pong for all of its 1024-wide projections.
SM90_UNDERFILLED = ((64, 128, 64), (2, 1, 1), "pingpong")
# ... unless the output is float32 (the residual stream ToMixedPrecision leaves: a Llama's o and
# down projections): then 128x64 cooperative on a 2x1 cluster. With one tile per SM nothing hides a
# ping-pong tile's epilogue, which one warp group does alone, and a 32-bit output doubles it; a
# cooperative tile splits it over two. Tuned on the H100 (2026-11-27, Llama-GQA at 1 x 512), it
# ran 21.5 vs 25.2 us at 512x2048x5632 and 9.3 vs 10.9 at 512x2048x2048 (17% each), while at
# 16-bit outputs the two were within 3% on BERT-large's 1024^3 and 64x128 ping-pong 5-6% ahead at
# 1024x1024x4096 (bench/results/2026-11-27-tuning-nvidia-h100.jsonl).
SM90_UNDERFILLED_WIDE_OUTPUT = ((128, 64, 64), (2, 1, 1), "cooperative")


def sm90_underfilled_tile(problem: GemmProblem) -> tuple:
    """(threadblock, cluster, schedule) of the small tile the heuristic takes where 128x128 tiles
    fill at most half of the SMs: by the output's width."""
    return SM90_UNDERFILLED_WIDE_OUTPUT if DTYPE_BITS[problem.element_out] > 16 else SM90_UNDERFILLED


def _choose_sm90(problem: GemmProblem, epilogue: Epilogue, arch: int, m_hint: int) -> GemmKernel:
    """SM90, from the sweep above: with a short main loop (K <= 2048) and at least two waves of
    128x128 tiles, the ping-pong schedule (one warpgroup's epilogue overlaps the other's main loop)
    on 128x128 tiles; otherwise cooperative kernels ranked by the wave model, ties to 256x128 with
    a 1x2 cluster (best or within 3% of the best on every swept shape). Where 128x128 tiles fill
    at most half of the SMs, a smaller tile (`sm90_underfilled_tile`, measured, see there).

    Never split-K, although under-filled problems look made for it: on the H100, BERT-large's
    split-K GEMMs (CUTLASS's stream-K scheduler in split-K mode, 128x128 tiles) ran slower than
    data-parallel tiles at batch 8 (1.55 vs 1.45 ms for its 120 1024-row projections) and much
    slower at batch 1 (2.25 vs 1.38 ms for M=128), workspace memsets included. Split-K stays a
    profiling candidate for under-filled problems (profile.gemm_candidates) and a `tile=` choice.
    """
    m = problem.m or m_hint
    pool = candidate_tiles_sm90(problem.element_accumulator, problem.element_a)
    if under_fills(m, problem.n, (128, 128), arch):
        wanted = sm90_underfilled_tile(problem)
        small = [t for t in pool if t.scheduler == "default" and (t.threadblock, t.cluster, t.schedule) == wanted]
        if small:
            return GemmKernel(problem, epilogue, small[0], arch=90, target=arch, selected_by="heuristic")
    return GemmKernel(
        problem, epilogue, sm90_large_tile(problem, arch, m_hint), arch=90, target=arch, selected_by="heuristic"
    )


def sm90_large_tile(problem: GemmProblem, arch: int, m_hint: int) -> TileConfig:
    """The data-parallel 128x128 / 256x128 / 128x256 tile of the sweep's rule (`_choose_sm90`
    without its under-filled case; profiling times it beside the small tiles there)."""
    m = problem.m or m_hint
    candidates = [
        t for t in candidate_tiles_sm90(problem.element_accumulator, problem.element_a)
        if t.scheduler == "default" and t.threadblock in SM90_HEURISTIC_TILES
    ]  # fmt: skip
    waves_128 = output_tiles(m, problem.n, (128, 128)) / SM_COUNT.get(arch, 132)
    if problem.k <= 2048 and waves_128 >= 2:
        pingpong = [t for t in candidates if t.schedule == "pingpong" and (t.threadblock, t.cluster) == SM90_PINGPONG]
        if pingpong:
            return pingpong[0]

    def rank(tile: TileConfig):
        return (
            estimate_cost(problem, tile, arch, m_hint),
            (tile.threadblock, tile.cluster) != SM90_COOPERATIVE_TIE,
            tile.cluster != (2, 1, 1),
            tile.describe(),
        )

    return min((t for t in candidates if t.schedule == "cooperative"), key=rank)


# ---------------------------------------------------------------------------------------------
# conv2d (implicit GEMM)
# ---------------------------------------------------------------------------------------------
