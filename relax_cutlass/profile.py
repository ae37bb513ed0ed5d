"""Build the profiler: candidate kernels without epilogue, one shared library, run on a GPU host.

TVM's old integration generated every epilogue variant of every candidate just to time them. Here,
as in its later fix, the candidates of a problem class are instantiated once *without* epilogue
(their speed is the main loop's), timed, and the winner is then instantiated with the region's
epilogue. Kernels depend only on (dtypes, layout, alignment, tile), so one profiler library serves
every problem shape of a model. It exports TVM FFI functions and needs only the TVM runtime
(or tvm_ffi) to load: build it here, run `python -m relax_cutlass.profile_runner` on the GPU host.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from string import Template

from .compile import Source, compile_all, link_relocatable
from .emit import emit_kernel
from .kernel_spec import Epilogue, GemmKernel, GemmProblem, TileConfig
from .select import (
    SM90_HEURISTIC_TILES,
    SMEM_LIMIT,
    _rank_sm80,
    _smem_bytes,
    candidate_tiles,
    candidate_tiles_sm90,
    choose_kernel,
    estimate_cost,
    sm90_fallback_reason,
)
from .templates import GEMM_ARGS
from .tuning import M_BUCKETS, TuningKey, gemm_key

DEFAULT_MAX_CANDIDATES = 6  # per problem class (--max-candidates)


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
    return ranked[:limit]


def family_for(problem: GemmProblem, arch: int, family: str = "auto") -> int:
    return 90 if arch >= 90 and family == "auto" and not sm90_fallback_reason(problem) else 80


@dataclass(frozen=True)
class ProfileJob:
    """One problem (M fixed) and the candidate kernels to time on it."""

    key: TuningKey
    problem: GemmProblem
    kernels: tuple[GemmKernel, ...]


def plan_jobs(problems: list[GemmProblem], arch: int, family: str = "auto", limit: int = DEFAULT_MAX_CANDIDATES):
    """Problems (symbolic M expanded to the M buckets) -> ProfileJobs, deduplicated by key."""
    jobs: dict[TuningKey, ProfileJob] = {}
    for problem in problems:
        fam = family_for(problem, arch, family)
        for m in [problem.m] if problem.m is not None else list(M_BUCKETS):
            concrete = GemmProblem(**(problem.__dict__ | {"m": m}))
            key = gemm_key(concrete, arch, fam, m)
            tiles = gemm_candidates(concrete, arch, fam, limit)
            kernels = tuple(
                GemmKernel(concrete, Epilogue(), t, arch=fam, target=arch, selected_by="profiling") for t in tiles
            )
            jobs.setdefault(key, ProfileJob(key, concrete, kernels))
    return list(jobs.values())


PROFILE_FUNCTION = Template("""\
namespace {
// Times `iterations` back-to-back launches of $kernel between CUDA events on TVM's stream.
double profile_${index}(TensorView a, TensorView b, TensorView d, int64_t m, int64_t n, int64_t k,
                        bool b_transposed, int64_t iterations) {
  RelaxCutlassGemmArgs args{m, n, k, Data(a), k, Data(b), b_transposed ? k : n,
                            nullptr, nullptr, n, const_cast<void*>(Data(d)), n};
  cudaStream_t stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, d.device().device_id));
  if (const char* err = ${kernel}_run(&args, stream)) TVM_FFI_THROW(RuntimeError) << err;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  for (int64_t i = 0; i < iterations; ++i) {
    if (const char* err = ${kernel}_run(&args, stream)) TVM_FFI_THROW(RuntimeError) << err;
  }
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / double(iterations);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(relax_cutlass_profile_${index}, profile_${index});
""")

PROFILER_TU = Template("""\
// relax_cutlass profiler: one timing function per candidate kernel (no epilogue).
#include <cstdint>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

$gemm_args
$decls

namespace {
using tvm::ffi::TensorView;
const void* Data(const TensorView& t) { return static_cast<const char*>(t.data_ptr()) + t.byte_offset(); }
}  // namespace

$functions
""")


def build_profiler(jobs: list[ProfileJob], arch: int, out: Path, jobs_parallel: int | None = None) -> Path:
    """Compile every distinct candidate kernel and write `<out>/profiler.so` + `<out>/profile.json`."""
    out.mkdir(parents=True, exist_ok=True)
    kernels = {k.name: k for job in jobs for k in job.kernels}
    names = sorted(kernels)
    index = {name: i for i, name in enumerate(names)}
    glue = PROFILER_TU.substitute(
        gemm_args=GEMM_ARGS,
        decls="\n".join(f'extern "C" const char* {n}_run(const RelaxCutlassGemmArgs*, void*);' for n in names),
        functions="\n".join(PROFILE_FUNCTION.substitute(index=index[n], kernel=n) for n in names),
    )
    sources = [emit_kernel(kernels[n]) for n in names] + [Source("relax_cutlass_profiler_glue", glue, "host")]
    objects = compile_all(sources, arch, jobs_parallel)
    merged = link_relocatable([objects[s.name][0] for s in sources], "relax_cutlass_profiler")
    library = out / "profiler.so"
    cmd = ["g++", "-shared", "-o", str(library), str(merged), "-lpthread", "-ldl", "-lrt"]
    subprocess.run(cmd, check=True, capture_output=True)
    manifest = {
        "arch": arch,
        "library": library.name,
        "jobs": [
            {
                "key": job.key.to_json(),
                "m": job.problem.m,
                "n": job.problem.n,
                "k": job.problem.k,
                "b_transposed": job.problem.b_transposed,
                "dtype": job.problem.element_a,
                "out_dtype": job.problem.element_out,
                "heuristic_tile": job.kernels[0].tile.describe(),  # gemm_candidates puts it first
                "candidates": [
                    {"tile": k.tile.describe(), "kernel": k.name, "function": f"relax_cutlass_profile_{index[k.name]}"}
                    for k in job.kernels
                ],
            }
            for job in jobs
        ],
    }
    (out / "profile.json").write_text(json.dumps(manifest, indent=1))
    return library
