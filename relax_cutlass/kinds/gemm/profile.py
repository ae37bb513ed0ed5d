"""Profiling GEMMs: the candidate tiles timed per problem (the heuristic's first) and the timing
function of a candidate kernel."""

from __future__ import annotations

from string import Template

from ...arch import smem_limit
from ..epilogue import Epilogue
from .records import SPLIT_K_MIN_ITERATIONS, GemmProblem, TileConfig
from .select import (
    SM90_HEURISTIC_TILES,
    SM90_SMALL_TILES,
    candidate_tiles,
    candidate_tiles_sm90,
    choose_kernel,
    estimate_cost,
    rank_sm80,
    sm90_large_tile,
    tile_smem_bytes,
    under_fills,
)
from .sm100 import candidate_tiles_sm100, rank_sm100

SPLIT_K_TILE = ((128, 128, 64), (1, 2, 1))  # the SM90 split-K candidate's CTA tile and cluster

# The cluster each small SM90 tile (select.SM90_SMALL_TILES) is timed on first, so that the default
# limit times every tile and schedule once: the one whose two CTAs share (TMA-multicast) the larger
# operand tile, B's 128 columns for 64x128 (2x1), A's 128 rows for 128x64 (1x2), as 256x128 does
# with its 1x2 cluster (the heuristic's measured tie-break). Not measured for these tiles: the
# other clusters follow them in the ranking, within a larger limit.
SMALL_TILE_CLUSTERS = {(64, 128, 64): (2, 1, 1), (128, 64, 64): (1, 2, 1)}


def gemm_candidates(problem: GemmProblem, arch: int, family: int, limit: int) -> list[TileConfig]:
    """The heuristic's own choice, then the configurations the wave model ranks next, up to `limit`.

    Profiling thereby corrects the model's ranking among plausible kernels (and can only improve on
    the heuristic, whose kernel is always timed) instead of timing hopeless ones. SM90: the CTA
    tiles of the measured sweep (docs/kernel-selection.md; 256x256 spills) with both schedules,
    both cluster shapes and stream-K, and where 128x128 tiles fill at most half of the SMs the
    64x128 / 128x64 tiles (select.SM90_SMALL_TILES) right after the heuristic's choice (and
    split-K, `_splits_usefully`); SM100: every static-cluster configuration, data-parallel
    first, ranked by its wave model; SM80: every tile that fits shared memory.
    """
    if family == 100:
        pool = list(candidate_tiles_sm100(problem.element_accumulator, problem.element_a))
        chosen = choose_kernel(problem, Epilogue(), arch).tile
        rank = lambda t: (t.scheduler != "default", rank_sm100(problem, t, arch, problem.m or 1024))  # noqa: E731
    elif family == 90:
        small = _small_tiles_useful(problem, arch)
        pool = [
            t
            for t in candidate_tiles_sm90(problem.element_accumulator, problem.element_a)
            if t.threadblock in SM90_HEURISTIC_TILES or (small and t.threadblock in SM90_SMALL_TILES)
        ]
        chosen = choose_kernel(problem, Epilogue(), arch).tile
        # Data-parallel tiles first: stream-K and split-K scheduling lost to them on every large
        # shape measured (H100), and where the grid under-fills the GPU split-K is added below.
        rank = lambda t: (t.scheduler != "default", estimate_cost(problem, t, arch), t.describe())  # noqa: E731
    else:
        pool = [
            t
            for t in candidate_tiles(problem.element_accumulator, problem.element_a)
            if tile_smem_bytes(t) <= smem_limit(arch)
        ]
        chosen = choose_kernel(problem, Epilogue(), arch, family="sm80").tile
        rank = lambda t: rank_sm80(problem, t, arch, problem.m or 1024)  # noqa: E731
    ranked = [chosen] + sorted((t for t in pool if t != chosen), key=rank)
    front = []
    if family == 90 and _splits_usefully(problem, arch):
        # Split-K is never the heuristic's choice (measured slower on BERT-large's shapes), but an
        # under-filled problem with a long main loop is where it can win: always time it there.
        front.append(next(t for t in pool if t.scheduler == "splitk" and (t.threadblock, t.cluster) == SPLIT_K_TILE))
    if family == 90 and small:
        # Where 128x128 tiles leave half the SMs idle, the heuristic takes one small tile
        # (select.sm90_underfilled_tile): time each small tile and schedule on its first cluster within
        # the default limit, then the sweep's data-parallel large tile, then the other clusters.
        smalls = sorted(
            (t for t in pool if t.threadblock in SM90_SMALL_TILES and t != chosen),
            key=lambda t: (t.cluster != SMALL_TILE_CLUSTERS[t.threadblock], rank(t)),
        )
        first = [t for t in smalls if t.cluster == SMALL_TILE_CLUSTERS[t.threadblock]]
        large = sm90_large_tile(problem, arch, problem.m or 1024)
        front += [*first, *([large] if large != chosen else []), *(t for t in smalls if t not in first)]
    ranked = [ranked[0]] + front + [t for t in ranked[1:] if t not in front]
    return ranked[:limit]


def _small_tiles_useful(problem: GemmProblem, arch: int) -> bool:
    """128x128 tiles fill at most half of the SMs, so the small tiles' twice as many CTAs still
    fit in one wave."""
    return under_fills(problem.m or 1024, problem.n, (128, 128), arch)


def _splits_usefully(problem: GemmProblem, arch: int) -> bool:
    """The split-K candidate's tiles under-fill the GPU and the main loop is long enough to cut."""
    threadblock = SPLIT_K_TILE[0]
    iterations = -(-problem.k // threadblock[2])
    return under_fills(problem.m or 1024, problem.n, threadblock, arch) and iterations >= 2 * SPLIT_K_MIN_ITERATIONS


def candidate_label(tile: TileConfig, split_k: int = 1) -> str:
    """A candidate's name in profile manifests and tuning records."""
    return tile.describe() + (f"_splitk{split_k}" if split_k > 1 else "")


# One timing function per candidate kernel: a first launch (surfacing any error), then
# `iterations` back-to-back launches between CUDA events on TVM's stream; returns ms per launch.
# bias / residual are read only by kernels whose epilogue has them (the runner passes stand-ins).
# Each is a TVM FFI function written against tvm-ffi's C ABI, as the model glue is
# (templates.FFI_HELPERS).
PROFILE_GEMM = Template("""\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_relax_cutlass_profile_${index}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny* result) {
  const char* fn = "relax_cutlass_profile_${index}";
  TRY(CheckArgCount(fn, num_args, 10, "a, b, bias, residual, d, m, n, k, b_transposed, iterations"));
  const DLTensor *a, *b, *bias, *residual, *d;
  int64_t m, n, k, b_transposed, iterations;
  TRY(TensorArg(fn, ffi_args, 0, "a", &a));
  TRY(TensorArg(fn, ffi_args, 1, "b", &b));
  TRY(TensorArg(fn, ffi_args, 2, "bias", &bias));
  TRY(TensorArg(fn, ffi_args, 3, "residual", &residual));
  TRY(TensorArg(fn, ffi_args, 4, "d", &d));
  TRY(IntArg(fn, ffi_args, 5, "m", &m));
  TRY(IntArg(fn, ffi_args, 6, "n", &n));
  TRY(IntArg(fn, ffi_args, 7, "k", &k));
  TRY(IntArg(fn, ffi_args, 8, "b_transposed", &b_transposed));
  TRY(IntArg(fn, ffi_args, 9, "iterations", &iterations));
  RelaxCutlassGemmArgs args{m, n, k, Data(a), k, Data(b), b_transposed ? k : n,
                            ${bias}, ${residual}, n, const_cast<void*>(Data(d)), n};
  return TimeLaunches(d, iterations, result, [&](void* stream) { return ${kernel}_run(&args, stream); });
}
""")
