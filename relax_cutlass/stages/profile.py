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
here, run `python -m relax_cutlass.toolkit.profile_runner` on the GPU host. Stage 2 is planned from stage
1's records, so tuning from scratch is two build/run rounds (`python -m relax_cutlass tune`).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

from ..kinds import kind_of, kinds
from ..kinds.epilogue import ACTIVATIONS, Epilogue, epilogue_key
from ..kinds.profiling import ProfileJob
from ..toolkit.compile import Source, compile_all, link_relocatable, toolchain
from ..toolkit.profile_templates import PROFILER_TU
from ..toolkit.tuning import TuningKey, parse_label
from .emit import emit_kernel

DEFAULT_MAX_CANDIDATES = 6  # stage 1: per problem class (--max-candidates)
DEFAULT_TOP_K = 3  # stage 2: main loops re-timed with each epilogue, besides the heuristic's (--top-k)


def plan_jobs(problems: list, arch: int, family: str = "auto", limit: int = DEFAULT_MAX_CANDIDATES):
    """Problems -> stage-1 ProfileJobs of their kinds (symbolic sizes expanded to the tuned buckets
    where a kind tunes them, left out where it does not), deduplicated by key. Candidates carry no
    epilogue."""
    jobs: dict[TuningKey, ProfileJob] = {}
    for problem in problems:
        profiling = kind_of(problem).profiling
        for job in profiling.jobs(problem, arch, family, limit) if profiling else ():
            jobs.setdefault(job.key, job)
    return list(jobs.values())


def kernel_label(kernel, split_k: int = 1) -> str:
    """A candidate kernel's name in profile manifests and tuning records."""
    return kind_of(kernel).profiling.label(kernel, split_k)


def retime_reason(job: ProfileJob, record, device: str | None = None) -> str | None:
    """Why `job` is to be timed although the database may hold `record` for its key, or None: no
    record; a record that did not time every candidate the job now has (measured before those
    candidates existed: it cannot show that its winner beats them, and the build takes the
    heuristic over it); or, when profiling on a GPU named `device`, a record measured on another
    GPU model (an H200's choice is not the H100's). Without the last two, a build with
    profile="auto" kept an old record forever although it ignored it or it came from another GPU."""
    if record is None:
        return "no record"
    if record.candidates:
        new = [label for label in (kernel_label(k, s) for k, s in job.candidates) if label not in record.candidates]
        if new:
            return f"record measured before {len(new)} of its candidates existed ({new[0]}, ...)"
    if device and record.device and record.device != device:
        return f"record measured on {record.device}, not on this {device}"
    return None


def stage2_reason(epilogue: Epilogue) -> str | None:
    """Why a region's epilogue gets no stage-2 timing, if it gets none."""
    if epilogue == Epilogue():
        return "no epilogue: stage 1's timing is the kernel's"
    custom = [a for a in (epilogue.activation, epilogue.residual_activation) if ACTIVATIONS[a].definition]
    if custom:
        return f"custom activation {custom[0]!r}: no reference to check it against on the GPU host"
    return None


def plan_epilogue_jobs(
    regions: list[tuple[object, Epilogue]],
    arch: int,
    db,
    family: str = "auto",
    top_k: int = DEFAULT_TOP_K,
) -> list[ProfileJob]:
    """Stage 2: (problem, epilogue) pairs whose main loops stage 1 has timed (`db` holds their
    records) -> jobs timing the `top_k` fastest correct main loops and the heuristic's kernel, each
    with the epilogue, deduplicated by key. Pairs without a stage-1 record, without epilogue or with
    a custom activation are left out (see `stage2_reason`), and so are kinds without this stage."""
    jobs: dict[TuningKey, ProfileJob] = {}
    for problem, epilogue in regions:
        profiling = kind_of(problem).profiling
        if profiling is None or profiling.stage2_keys is None or stage2_reason(epilogue):
            continue
        for key, p in profiling.stage2_keys(problem, arch, family):
            record = db.lookup(key)
            stage2 = dataclasses.replace(key, epilogue=epilogue_key(epilogue, p.element_out))
            if record is None or stage2 in jobs:
                continue
            heuristic, split, ranked = profiling.stage2_candidates(p, epilogue, arch, key, record)
            first = (heuristic.tile, split)
            picks = [first, *[c for c in dict.fromkeys(ranked) if c != first][:top_k]]
            candidates = tuple(
                (dataclasses.replace(heuristic, tile=t, selected_by="profiling", note=""), s) for t, s in picks
            )
            jobs[stage2] = ProfileJob(stage2, p, candidates, epilogue)
    return list(jobs.values())


def _job_entry(job: ProfileJob, index: dict[str, int]) -> dict:
    entry = {
        "key": job.key.to_json(),
        "op": job.key.op,
        "reference": kind_of(job.problem).reference_module,
        "dtype": job.key.element,
        "out_dtype": job.key.element_out,
        "epilogue": dataclasses.asdict(job.epilogue),
    }
    entry |= kind_of(job.problem).profiling.job_fields(job)
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
    glue = PROFILER_TU.substitute(
        args="".join(kind.args for kind in kinds()),
        decls="\n".join(f'extern "C" const char* {n}_run(const {_args_type(kernels[n])}*, void*);' for n in names),
        functions="\n".join(
            kind_of(kernels[n]).profiling.timing_function.substitute(
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


def _args_type(kernel) -> str:
    return kind_of(kernel).args_type
