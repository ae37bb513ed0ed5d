"""Build the profiler: candidate kernels without epilogue, one shared library, run on a GPU host.

TVM's old integration generated every epilogue variant of every candidate just to time them. Here,
as in its later fix, the candidates of a problem class are instantiated once *without* epilogue
(their speed is the main loop's), timed, and the winner is then instantiated with the region's
epilogue. Kernels depend only on (dtypes, layout, alignment, tile), so one profiler library serves
every problem shape of a model. It exports TVM FFI functions and needs only the TVM runtime
(or tvm_ffi) to load: build it here, run `python -m relax_cutlass.profile_runner` on the GPU host.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from string import Template

from .compile import Source, compile_all, link_relocatable
from .emit import emit_kernel
from .kernel_spec import (
    SPLIT_K_MIN_ITERATIONS,
    AttentionProblem,
    Conv2dKernel,
    Conv2dProblem,
    Epilogue,
    GemmKernel,
    GemmProblem,
    TileConfig,
)
from .select import (
    SM90_HEURISTIC_TILES,
    SMEM_LIMIT,
    _fitting,
    _rank_sm80,
    _smem_bytes,
    candidate_conv2d_tiles,
    candidate_tiles,
    candidate_tiles_sm90,
    choose_conv2d_kernel,
    choose_kernel,
    choose_split_k,
    estimate_cost,
    sm90_fallback_reason,
    under_fills,
)
from .templates import CONV2D_ARGS, GEMM_ARGS
from .tuning import M_BUCKETS, TuningKey, conv2d_key, gemm_key

DEFAULT_MAX_CANDIDATES = 6  # per problem class (--max-candidates)


SPLIT_K_TILE = ((128, 128, 64), (1, 2, 1))  # the SM90 split-K candidate's CTA tile and cluster


def gemm_candidates(problem: GemmProblem, arch: int, family: int, limit: int) -> list[TileConfig]:
    """The heuristic's own choice, then the configurations the wave model ranks next, up to `limit`.

    Profiling thereby corrects the model's ranking among plausible kernels (and can only improve on
    the heuristic, whose kernel is always timed) instead of timing hopeless ones. SM90: the CTA
    tiles of the measured sweep (docs/kernel-selection.md; 256x256 spills) with both schedules,
    both cluster shapes and stream-K; SM80: every tile that fits shared memory.
    """
    if family == 90:
        pool = [
            t
            for t in candidate_tiles_sm90(problem.element_accumulator, problem.element_a)
            if t.threadblock in SM90_HEURISTIC_TILES
        ]
        chosen = choose_kernel(problem, Epilogue(), arch).tile
        rank = lambda t: (estimate_cost(problem, t, arch), t.scheduler != "default", t.describe())  # noqa: E731
    else:
        pool = [
            t
            for t in candidate_tiles(problem.element_accumulator, problem.element_a)
            if _smem_bytes(t) <= SMEM_LIMIT.get(arch, SMEM_LIMIT[80])
        ]
        chosen = choose_kernel(problem, Epilogue(), arch, family="sm80").tile
        rank = lambda t: _rank_sm80(problem, t, arch, problem.m or 1024)  # noqa: E731
    ranked = [chosen] + sorted((t for t in pool if t != chosen), key=rank)
    if family == 90 and _splits_usefully(problem, arch):
        # Split-K is never the heuristic's choice (measured slower on BERT-large's shapes), but an
        # under-filled problem with a long main loop is where it can win: always time it there.
        split = next(t for t in pool if t.scheduler == "splitk" and (t.threadblock, t.cluster) == SPLIT_K_TILE)
        ranked = [ranked[0], split] + [t for t in ranked[1:] if t != split]
    return ranked[:limit]


def _splits_usefully(problem: GemmProblem, arch: int) -> bool:
    """The split-K candidate's tiles under-fill the GPU and the main loop is long enough to cut."""
    threadblock = SPLIT_K_TILE[0]
    iterations = -(-problem.k // threadblock[2])
    return under_fills(problem.m or 1024, problem.n, threadblock, arch) and iterations >= 2 * SPLIT_K_MIN_ITERATIONS


def family_for(problem: GemmProblem, arch: int, family: str = "auto") -> int:
    return 90 if arch >= 90 and family == "auto" and not sm90_fallback_reason(problem) else 80


@dataclass(frozen=True)
class ProfileJob:
    """One problem (shapes fixed) and the candidates to time on it: (kernel, split-K slices)."""

    key: TuningKey
    problem: GemmProblem | Conv2dProblem
    candidates: tuple[tuple[GemmKernel | Conv2dKernel, int], ...]

    @property
    def kernels(self) -> tuple[GemmKernel | Conv2dKernel, ...]:
        return tuple(dict.fromkeys(k for k, _ in self.candidates))


def conv2d_candidates(problem: Conv2dProblem, arch: int, limit: int) -> list[tuple[TileConfig, int]]:
    """The heuristic's (tile, split-K), other split-K counts for it when its tiles under-fill the
    GPU, then the next-ranked tiles with their own split-K, up to `limit`."""
    gemm = problem.implicit_gemm()
    chosen, split = choose_conv2d_kernel(problem, Epilogue(), arch)
    candidates = [(chosen.tile, split)]
    if under_fills(gemm.m, gemm.n, chosen.tile.threadblock, arch):
        iterations = -(-gemm.k // chosen.tile.threadblock[2])
        candidates += [(chosen.tile, s) for s in (1, 2, 4, 8, 16) if s != split and iterations >= 4 * s]
    tiles = _fitting(candidate_conv2d_tiles(problem.element_accumulator, problem.element), arch, problem)
    for tile in sorted(tiles, key=lambda t: _rank_sm80(gemm, t, arch, gemm.m)):
        candidates.append((tile, choose_split_k(gemm, tile, arch, Epilogue())))
    return list(dict.fromkeys(candidates))[:limit]


def plan_jobs(problems: list, arch: int, family: str = "auto", limit: int = DEFAULT_MAX_CANDIDATES):
    """GEMM problems (symbolic M expanded to the M buckets) and static-batch conv2d problems ->
    ProfileJobs, deduplicated by key. Candidates carry no epilogue."""
    jobs: dict[TuningKey, ProfileJob] = {}
    for problem in problems:
        if isinstance(problem, AttentionProblem):
            continue  # one configuration per head dim: nothing to choose between (see select)
        if isinstance(problem, Conv2dProblem):
            if problem.n is None:
                continue  # symbolic batch: the heuristic (the report says so)
            key = conv2d_key(problem, arch)
            candidates = tuple(
                (Conv2dKernel(problem, Epilogue(), t, arch=80, target=arch, selected_by="profiling"), split)
                for t, split in conv2d_candidates(problem, arch, limit)
            )
            jobs.setdefault(key, ProfileJob(key, problem, candidates))
            continue
        fam = family_for(problem, arch, family)
        for m in [problem.m] if problem.m is not None else list(M_BUCKETS):
            concrete = dataclasses.replace(problem, m=m)
            key = gemm_key(concrete, arch, fam, m)
            candidates = tuple(
                (GemmKernel(concrete, Epilogue(), t, arch=fam, target=arch, selected_by="profiling"), 1)
                for t in gemm_candidates(concrete, arch, fam, limit)
            )
            jobs.setdefault(key, ProfileJob(key, concrete, candidates))
    return list(jobs.values())


# One timing function per candidate kernel: a first launch (surfacing any error), then
# `iterations` back-to-back launches between CUDA events on TVM's stream; returns ms per launch.
PROFILE_GEMM = Template("""\
double profile_${index}(TensorView a, TensorView b, TensorView d, int64_t m, int64_t n, int64_t k,
                        bool b_transposed, int64_t iterations) {
  RelaxCutlassGemmArgs args{m, n, k, Data(a), k, Data(b), b_transposed ? k : n,
                            nullptr, nullptr, n, const_cast<void*>(Data(d)), n};
  return TimeLaunches(d, iterations, [&](void* stream) { return ${kernel}_run(&args, stream); });
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(relax_cutlass_profile_${index}, profile_${index});
""")

PROFILE_CONV2D = Template("""\
double profile_${index}(TensorView x, TensorView w, TensorView d, tvm::ffi::Shape shape, int64_t split_k,
                        int64_t iterations) {
  // shape: n, h, w, c, k, r, s, p, q, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w
  int v[15];
  for (int i = 0; i < 15; ++i) v[i] = static_cast<int>(shape[i]);
  RelaxCutlassConv2dArgs args{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10],
                              v[11], v[12], v[13], v[14], static_cast<int>(split_k),
                              Data(x), Data(w), nullptr, nullptr, const_cast<void*>(Data(d))};
  return TimeLaunches(d, iterations, [&](void* stream) { return ${kernel}_run(&args, stream); });
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(relax_cutlass_profile_${index}, profile_${index});
""")

PROFILER_TU = Template("""\
// relax_cutlass profiler: one timing function per candidate kernel (no epilogue).
#include <cstdint>
#include <cuda_runtime.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

$args
$decls

namespace {
using tvm::ffi::TensorView;
const void* Data(const TensorView& t) { return static_cast<const char*>(t.data_ptr()) + t.byte_offset(); }

template <typename Launch>
double TimeLaunches(const TensorView& out, int64_t iterations, Launch launch) {
  void* stream = TVMFFIEnvGetStream(kDLCUDA, out.device().device_id);
  if (const char* err = launch(stream)) TVM_FFI_THROW(RuntimeError) << err;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, static_cast<cudaStream_t>(stream));
  for (int64_t i = 0; i < iterations; ++i) {
    if (const char* err = launch(stream)) TVM_FFI_THROW(RuntimeError) << err;
  }
  cudaEventRecord(stop, static_cast<cudaStream_t>(stream));
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / double(iterations);
}

$functions
}  // namespace
""")


def _job_entry(job: ProfileJob, index: dict[str, int]) -> dict:
    p = job.problem
    entry = {"key": job.key.to_json(), "op": job.key.op, "dtype": job.key.element, "out_dtype": job.key.element_out}
    if isinstance(p, Conv2dProblem):
        entry["conv"] = [p.n, p.h, p.w, p.c, p.k, p.r, p.s, p.p, p.q, *p.pad, *p.stride, *p.dilation]
    else:
        entry |= {"m": p.m, "n": p.n, "k": p.k, "b_transposed": p.b_transposed}
    labels = [k.tile.describe() + (f"_splitk{s}" if s > 1 else "") for k, s in job.candidates]
    entry["heuristic"] = labels[0]  # the candidate lists put the heuristic's choice first
    entry["candidates"] = [
        {"label": label, "tile": k.tile.describe(), "split_k": s, "kernel": k.name,
         "function": f"relax_cutlass_profile_{index[k.name]}"}
        for label, (k, s) in zip(labels, job.candidates, strict=True)
    ]  # fmt: skip
    return entry


def build_profiler(jobs: list[ProfileJob], arch: int, out: Path, jobs_parallel: int | None = None) -> Path:
    """Compile every distinct candidate kernel and write `<out>/profiler.so` + `<out>/profile.json`."""
    out.mkdir(parents=True, exist_ok=True)
    kernels = {k.name: k for job in jobs for k in job.kernels}
    names = sorted(kernels)
    index = {name: i for i, name in enumerate(names)}
    conv = {n for n in names if isinstance(kernels[n], Conv2dKernel)}
    arg_type = {n: "RelaxCutlassConv2dArgs" if n in conv else "RelaxCutlassGemmArgs" for n in names}
    glue = PROFILER_TU.substitute(
        args=GEMM_ARGS + CONV2D_ARGS,
        decls="\n".join(f'extern "C" const char* {n}_run(const {arg_type[n]}*, void*);' for n in names),
        functions="\n".join(
            (PROFILE_CONV2D if n in conv else PROFILE_GEMM).substitute(index=index[n], kernel=n) for n in names
        ),
    )
    sources = [emit_kernel(kernels[n]) for n in names] + [Source("relax_cutlass_profiler_glue", glue, "host")]
    objects = compile_all(sources, arch, jobs_parallel)
    merged = link_relocatable([objects[s.name][0] for s in sources], "relax_cutlass_profiler")
    library = out / "profiler.so"
    cmd = ["g++", "-shared", "-o", str(library), str(merged), "-lpthread", "-ldl", "-lrt"]
    subprocess.run(cmd, check=True, capture_output=True)
    manifest = {"arch": arch, "library": library.name, "jobs": [_job_entry(job, index) for job in jobs]}
    (out / "profile.json").write_text(json.dumps(manifest, indent=1))
    return library
