"""Build the profiler: candidate kernels in one shared library, run on a GPU host.

TVM's old integration generated every epilogue variant of every candidate just to time them. Here,
as in its later fix, tuning starts from the main loop:

  stage 1  the candidates of a problem class are instantiated once *without* epilogue (kernels
           depend only on dtypes, layout, alignment and tile, so one library serves every shape of
           a model) and timed;
  stage 2  the `top_k` fastest main loops, and the heuristic's kernel, are instantiated with a
           region's epilogue and timed again. The main loop's ranking is not always the fused
           kernel's (an erf-GELU epilogue that one schedule hides and another does not), and stage 2
           costs `top_k + 1` kernels per distinct epilogue, not one per candidate.

The library exports TVM FFI functions and needs only the TVM runtime (or tvm_ffi) to load: build it
here, run `python -m relax_cutlass.stages.profile_runner` on the GPU host. Stage 2 is planned from stage
1's records, so tuning from scratch is two build/run rounds (`python -m relax_cutlass tune`).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from string import Template

from ..arch import native_family, resolve_family
from ..emit import emit_kernel
from ..kernel_spec import (
    ACTIVATIONS,
    SPLIT_K_MIN_ITERATIONS,
    AttentionKernel,
    AttentionProblem,
    Conv2dKernel,
    Conv2dProblem,
    Epilogue,
    GemmKernel,
    GemmProblem,
    TileConfig,
)
from ..select import (
    SM90_HEURISTIC_TILES,
    _fitting,
    _rank_sm80,
    _smem_bytes,
    attention_label,
    attention_tiles,
    candidate_conv2d_tiles,
    candidate_tiles,
    candidate_tiles_sm90,
    choose_attention_kernel,
    choose_conv2d_kernel,
    choose_kernel,
    choose_split_k,
    estimate_cost,
    sm90_fallback_reason,
    smem_limit,
    under_fills,
)
from ..templates import ATTENTION_ARGS, CONV2D_ARGS, FFI_HELPERS, GEMM_ARGS
from .compile import Source, compile_all, link_relocatable, toolchain
from .tuning import M_BUCKETS, TuningKey, attention_key, conv2d_key, epilogue_key, gemm_key, parse_label

DEFAULT_MAX_CANDIDATES = 6  # stage 1: per problem class (--max-candidates)
DEFAULT_TOP_K = 3  # stage 2: main loops re-timed with each epilogue, besides the heuristic's (--top-k)


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
        # Data-parallel tiles first: stream-K and split-K scheduling lost to them on every large
        # shape measured (H100), and where the grid under-fills the GPU split-K is added below.
        rank = lambda t: (t.scheduler != "default", estimate_cost(problem, t, arch), t.describe())  # noqa: E731
    else:
        pool = [
            t
            for t in candidate_tiles(problem.element_accumulator, problem.element_a)
            if _smem_bytes(t) <= smem_limit(arch)
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
    family = resolve_family(family, arch)
    return 90 if native_family(arch) == 90 and family == "auto" and not sm90_fallback_reason(problem) else 80


@dataclass(frozen=True)
class ProfileJob:
    """One problem (shapes fixed) and the candidates to time on it: (kernel, split-K slices), all
    with `epilogue` (stage 1: none)."""

    key: TuningKey
    problem: GemmProblem | Conv2dProblem
    candidates: tuple[tuple[GemmKernel | Conv2dKernel, int], ...]
    epilogue: Epilogue = Epilogue()

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
            job = _attention_job(problem, arch)
            if job is not None:
                jobs.setdefault(job.key, job)
            continue
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


def _attention_job(problem: AttentionProblem, arch: int) -> ProfileJob | None:
    """The rule's tile, then the other one, for a static problem with a choice (head dims <= 64)."""
    if None in (problem.batch, problem.seq_q, problem.seq_kv) or len(attention_tiles(problem)) < 2:
        return None  # symbolic sizes, or one tile: the rule (the report says so)
    chosen = dataclasses.replace(choose_attention_kernel(problem, arch), selected_by="profiling", note="")
    tiles = [(chosen.queries_per_block, chosen.keys_per_block)]
    tiles += [t for t in attention_tiles(problem) if t != tiles[0]]
    candidates = tuple((dataclasses.replace(chosen, queries_per_block=q, keys_per_block=k), 1) for q, k in tiles)
    return ProfileJob(attention_key(problem, arch), problem, candidates)


def kernel_label(kernel: GemmKernel | Conv2dKernel | AttentionKernel, split_k: int = 1) -> str:
    """A candidate kernel's name in profile manifests and tuning records."""
    if isinstance(kernel, AttentionKernel):
        return attention_label(kernel.queries_per_block, kernel.keys_per_block)
    return candidate_label(kernel.tile, split_k)


def candidate_label(tile: TileConfig, split_k: int = 1) -> str:
    """A candidate's name in profile manifests and tuning records."""
    return tile.describe() + (f"_splitk{split_k}" if split_k > 1 else "")


def _by_label(pool, record) -> list[tuple[TileConfig, int]]:
    """Stage 1's correct candidates, fastest first, as (tile, split-K) from `pool`'s tiles."""
    tiles = {t.describe(): t for t in pool}
    timed = sorted((ms, label) for label, ms in record.candidates.items() if ms is not None)
    ranked = []
    for _, label in timed:
        name, split = parse_label(label)
        if name in tiles:
            ranked.append((tiles[name], split))
    return ranked


def stage2_reason(epilogue: Epilogue) -> str | None:
    """Why a region's epilogue gets no stage-2 timing, if it gets none."""
    if epilogue == Epilogue():
        return "no epilogue: stage 1's timing is the kernel's"
    custom = [a for a in (epilogue.activation, epilogue.residual_activation) if ACTIVATIONS[a].definition]
    if custom:
        return f"custom activation {custom[0]!r}: no reference to check it against on the GPU host"
    return None


def plan_epilogue_jobs(
    regions: list[tuple[GemmProblem | Conv2dProblem, Epilogue]],
    arch: int,
    db,
    family: str = "auto",
    top_k: int = DEFAULT_TOP_K,
) -> list[ProfileJob]:
    """Stage 2: (problem, epilogue) pairs whose main loops stage 1 has timed (`db` holds their
    records) -> jobs timing the `top_k` fastest correct main loops and the heuristic's kernel, each
    with the epilogue, deduplicated by key. Pairs without a stage-1 record, without epilogue or with
    a custom activation are left out (see `stage2_reason`)."""
    jobs: dict[TuningKey, ProfileJob] = {}
    for problem, epilogue in regions:
        if isinstance(problem, AttentionProblem) or stage2_reason(epilogue):
            continue
        if isinstance(problem, Conv2dProblem):
            if problem.n is None:
                continue
            concrete = [(conv2d_key(problem, arch), problem)]
        else:
            fam = family_for(problem, arch, family)
            ms = [problem.m] if problem.m is not None else list(M_BUCKETS)
            concrete = [(gemm_key(dataclasses.replace(problem, m=m), arch, fam, m), dataclasses.replace(problem, m=m))
                        for m in ms]  # fmt: skip
        for key, p in concrete:
            record = db.lookup(key)
            stage2 = dataclasses.replace(key, epilogue=epilogue_key(epilogue, p.element_out))
            if record is None or stage2 in jobs:
                continue
            if isinstance(p, Conv2dProblem):
                heuristic, split = choose_conv2d_kernel(p, epilogue, arch)
                pool = candidate_conv2d_tiles(p.element_accumulator, p.element)
                # Serial split-K keeps partial sums where the residual block epilogue reads its
                # second operand: with a residual, a split tile is timed unsplit (choose_split_k).
                ranked = [(t, 1 if epilogue.residual else s) for t, s in _by_label(pool, record)]
            else:
                heuristic, split = choose_kernel(p, epilogue, arch, family="auto" if key.family == 90 else "sm80"), 1
                tiles_of = candidate_tiles_sm90 if key.family == 90 else candidate_tiles
                pool = tiles_of(p.element_accumulator, p.element_a)
                ranked = _by_label(pool, record)
            first = (heuristic.tile, split)
            picks = [first, *[c for c in dict.fromkeys(ranked) if c != first][:top_k]]
            candidates = tuple(
                (dataclasses.replace(heuristic, tile=t, selected_by="profiling", note=""), s) for t, s in picks
            )
            jobs[stage2] = ProfileJob(stage2, p, candidates, epilogue)
    return list(jobs.values())


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

PROFILE_CONV2D = Template("""\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_relax_cutlass_profile_${index}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny* result) {
  const char* fn = "relax_cutlass_profile_${index}";
  TRY(CheckArgCount(fn, num_args, 8, "x, w, bias, residual, d, shape, split_k, iterations"));
  const DLTensor *x, *w, *bias, *residual, *d;
  const int64_t* shape;
  int64_t split_k, iterations;
  TRY(TensorArg(fn, ffi_args, 0, "x", &x));
  TRY(TensorArg(fn, ffi_args, 1, "w", &w));
  TRY(TensorArg(fn, ffi_args, 2, "bias", &bias));
  TRY(TensorArg(fn, ffi_args, 3, "residual", &residual));
  TRY(TensorArg(fn, ffi_args, 4, "d", &d));
  // shape: n, h, w, c, k, r, s, p, q, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w
  TRY(ShapeArg(fn, ffi_args, 5, "shape", 15, &shape));
  TRY(IntArg(fn, ffi_args, 6, "split_k", &split_k));
  TRY(IntArg(fn, ffi_args, 7, "iterations", &iterations));
  int v[15];
  for (int i = 0; i < 15; ++i) v[i] = static_cast<int>(shape[i]);
  RelaxCutlassConv2dArgs args{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10],
                              v[11], v[12], v[13], v[14], static_cast<int>(split_k),
                              Data(x), Data(w), ${bias}, ${residual}, const_cast<void*>(Data(d))};
  return TimeLaunches(d, iterations, result, [&](void* stream) { return ${kernel}_run(&args, stream); });
}
""")

PROFILE_ATTENTION = Template("""\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_relax_cutlass_profile_${index}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny* result) {
  const char* fn = "relax_cutlass_profile_${index}";
  TRY(CheckArgCount(fn, num_args, 7, "q, k, v, out, shape, scale, iterations"));
  const DLTensor *q, *k, *v, *out;
  const int64_t* shape;
  double scale;
  int64_t iterations;
  TRY(TensorArg(fn, ffi_args, 0, "q", &q));
  TRY(TensorArg(fn, ffi_args, 1, "k", &k));
  TRY(TensorArg(fn, ffi_args, 2, "v", &v));
  TRY(TensorArg(fn, ffi_args, 3, "out", &out));
  // shape: batch, seq_q, seq_kv, heads, head_dim, head_dim_value; q, k, v, out packed BSNH
  TRY(ShapeArg(fn, ffi_args, 4, "shape", 6, &shape));
  TRY(FloatArg(fn, ffi_args, 5, "scale", &scale));
  TRY(IntArg(fn, ffi_args, 6, "iterations", &iterations));
  const int64_t b = shape[0], s = shape[1], t = shape[2], n = shape[3], h = shape[4], dv = shape[5];
  RelaxCutlassAttentionArgs args{b, n, s, t, h, dv,
                                 Data(q), s * n * h, n * h, h,
                                 Data(k), t * n * h, n * h, h,
                                 Data(v), t * n * dv, n * dv, dv,
                                 const_cast<void*>(Data(out)), static_cast<float>(scale)};
  return TimeLaunches(out, iterations, result, [&](void* stream) { return ${kernel}_run(&args, stream); });
}
""")

PROFILER_TU = Template(
    """\
// relax_cutlass profiler: one timing function per candidate kernel.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime_api.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

$args
$decls

"""
    + FFI_HELPERS
    + """
namespace {
int IntArg(const char* fn, const TVMFFIAny* args, int index, const char* name, int64_t* out) {
  const TVMFFIAny& arg = args[index];
  if (arg.type_index != kTVMFFIInt && arg.type_index != kTVMFFIBool) {
    return Raise("TypeError", "%s: argument #%d (%s) must be an int, got %s", fn, index, name,
                 TypeName(arg.type_index));
  }
  *out = arg.v_int64;
  return 0;
}

int FloatArg(const char* fn, const TVMFFIAny* args, int index, const char* name, double* out) {
  const TVMFFIAny& arg = args[index];
  if (arg.type_index == kTVMFFIFloat) {
    *out = arg.v_float64;
    return 0;
  }
  int64_t value = 0;
  TRY(IntArg(fn, args, index, name, &value));
  *out = static_cast<double>(value);
  return 0;
}

// A tvm-ffi Shape of `size` values.
int ShapeArg(const char* fn, const TVMFFIAny* args, int index, const char* name, size_t size, const int64_t** out) {
  const TVMFFIAny& arg = args[index];
  if (arg.type_index != kTVMFFIShape) {
    return Raise("TypeError", "%s: argument #%d (%s) must be a Shape, got %s", fn, index, name,
                 TypeName(arg.type_index));
  }
  const TVMFFIShapeCell* cell = TVMFFIShapeGetCellPtr(arg.v_obj);
  if (cell->size != size) {
    return Raise("ValueError", "%s: %s has %zu values, not %zu", fn, name, cell->size, size);
  }
  *out = cell->data;
  return 0;
}

// Times `launch` on TVM's stream for `out`'s device; the result is milliseconds per launch.
template <typename Launch>
int TimeLaunches(const DLTensor* out, int64_t iterations, TVMFFIAny* result, Launch launch) {
  void* stream = TVMFFIEnvGetStream(kDLCUDA, out->device.device_id);
  if (const char* err = launch(stream)) return Raise("RuntimeError", "%s", err);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, static_cast<cudaStream_t>(stream));
  for (int64_t i = 0; i < iterations; ++i) {
    if (const char* err = launch(stream)) return Raise("RuntimeError", "%s", err);
  }
  cudaEventRecord(stop, static_cast<cudaStream_t>(stream));
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  result->type_index = kTVMFFIFloat;
  result->zero_padding = 0;
  result->v_float64 = double(ms) / double(iterations);
  return 0;
}
}  // namespace

$functions
"""
)


def _job_entry(job: ProfileJob, index: dict[str, int]) -> dict:
    p = job.problem
    entry = {
        "key": job.key.to_json(),
        "op": job.key.op,
        "dtype": job.key.element,
        "out_dtype": job.key.element_out,
        "epilogue": dataclasses.asdict(job.epilogue),
    }
    if isinstance(p, Conv2dProblem):
        entry["conv"] = [p.n, p.h, p.w, p.c, p.k, p.r, p.s, p.p, p.q, *p.pad, *p.stride, *p.dilation]
    elif isinstance(p, AttentionProblem):
        entry |= {"attention": list(job.key.shape), "scale": p.scale}
    else:
        entry |= {"m": p.m, "n": p.n, "k": p.k, "b_transposed": p.b_transposed}
    labels = [kernel_label(k, s) for k, s in job.candidates]
    entry["heuristic"] = labels[0]  # the candidate lists put the heuristic's choice first
    entry["candidates"] = [
        {"label": label, "tile": parse_label(label)[0], "split_k": s, "kernel": k.name,
         "function": f"relax_cutlass_profile_{index[k.name]}"}
        for label, (k, s) in zip(labels, job.candidates, strict=True)
    ]  # fmt: skip
    return entry


def build_profiler(jobs: list[ProfileJob], arch: int, out: Path, jobs_parallel: int | None = None) -> Path:
    """Compile every distinct candidate kernel and write `<out>/profiler.so` + `<out>/profile.json`
    (either stage's jobs, or both)."""
    out.mkdir(parents=True, exist_ok=True)
    kernels = {k.name: k for job in jobs for k in job.kernels}
    names = sorted(kernels)
    index = {name: i for i, name in enumerate(names)}
    kinds = {  # per kernel class: its argument struct and timing function
        GemmKernel: ("RelaxCutlassGemmArgs", PROFILE_GEMM),
        Conv2dKernel: ("RelaxCutlassConv2dArgs", PROFILE_CONV2D),
        AttentionKernel: ("RelaxCutlassAttentionArgs", PROFILE_ATTENTION),
    }
    glue = PROFILER_TU.substitute(
        args=GEMM_ARGS + CONV2D_ARGS + ATTENTION_ARGS,
        decls="\n".join(f'extern "C" const char* {n}_run(const {kinds[type(kernels[n])][0]}*, void*);' for n in names),
        functions="\n".join(
            kinds[type(kernels[n])][1].substitute(
                index=index[n],
                kernel=n,
                bias="Data(bias)" if kernels[n].epilogue.bias else "nullptr",
                residual="Data(residual)" if kernels[n].epilogue.residual else "nullptr",
            )
            for n in names
        ),
    )
    sources = [emit_kernel(kernels[n]) for n in names] + [Source("relax_cutlass_profiler_glue", glue, "host")]
    objects = compile_all(sources, arch, jobs_parallel)
    merged = link_relocatable([objects[s.name][0] for s in sources], "relax_cutlass_profiler")
    library = out / "profiler.so"
    cmd = [toolchain().cxx, "-shared", "-o", str(library), str(merged), "-lpthread", "-ldl", "-lrt"]
    subprocess.run(cmd, check=True, capture_output=True)
    manifest = {"arch": arch, "library": library.name, "jobs": [_job_entry(job, index) for job in jobs]}
    (out / "profile.json").write_text(json.dumps(manifest, indent=1))
    return library
