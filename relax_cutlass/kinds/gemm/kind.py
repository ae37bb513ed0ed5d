"""The GEMM kind: dense / matmul (+ bias, activation, residual add(+relu), cast), CUTLASS 2.x
kernels on SM80+, 3.x (TMA, wgmma, clusters) on SM90 and 3.x (TMA, tcgen05) on SM100."""

from __future__ import annotations

import dataclasses

from ...toolkit.tuning import M_BUCKETS
from .. import Profiling, RegionKind
from ..epilogue import Epilogue
from ..epilogue_patterns import epilogue_problems, residual_input
from ..profiling import ProfileJob, by_label
from ..region import mnk_report_line
from .emit import emit_gemm_kernel, gemm_glue_function
from .patterns import GemmPatternSpec, all_gemm_specs, gemm_pattern, left_in_tvm_row, matmul_problems, read_problem
from .profile import PROFILE_GEMM, candidate_label, gemm_candidates
from .records import TILE_SPELLING, GemmKernel, GemmProblem, GemmRegion, gemm_key
from .scales import fold_output_scales
from .select import choose_kernel, native_3x, tiles_of_family
from .templates import ARGS_TYPE, GEMM_ARGS


def _rules(spec, ann, out, _var2val) -> list[str]:
    return matmul_problems(ann["root"], ann["rhs"], ann.get("transpose")) or epilogue_problems(spec, ann, out)


def plan(problem: GemmProblem, spec, options, db) -> tuple[GemmKernel, dict]:
    kernel = choose_kernel(problem, spec.epilogue, options.arch, options.m_hint, options.family, options.tile, db)
    return kernel, {"dispatch": _m_dispatch(problem, spec.epilogue, options, db)}


def _m_dispatch(problem, epilogue, options, db) -> tuple:
    """Symbolic M with tuning records: the tuned kernel of each M bucket, for run-time dispatch
    (consecutive buckets with the same kernel merged). Empty when nothing was tuned."""
    if problem.m is not None or db is None or options.tile:
        return ()
    chosen = [(b, choose_kernel(problem, epilogue, options.arch, b, options.family, "", db)) for b in M_BUCKETS]
    if not any(k.selected_by == "tuned" for _, k in chosen):
        return ()
    merged: list[tuple[int, object]] = []
    for bucket, kernel in chosen:
        if merged and merged[-1][1].name == kernel.name:
            merged[-1] = (bucket, kernel)
        else:
            merged.append((bucket, kernel))
    return tuple(merged)


def _concrete(problem: GemmProblem, arch: int, family: str) -> list[tuple]:
    """(key, problem) per tuned M: the problem's own, or every M bucket when M is symbolic."""
    fam = native_3x(problem, arch, family)
    ms = [problem.m] if problem.m is not None else list(M_BUCKETS)
    return [(gemm_key(dataclasses.replace(problem, m=m), arch, fam, m), dataclasses.replace(problem, m=m)) for m in ms]


def _jobs(problem: GemmProblem, arch: int, family: str, limit: int) -> list[ProfileJob]:
    jobs = []
    for key, concrete in _concrete(problem, arch, family):
        candidates = tuple(
            (GemmKernel(concrete, Epilogue(), t, arch=key.family, target=arch, selected_by="profiling"), 1)
            for t in gemm_candidates(concrete, arch, key.family, limit)
        )
        jobs.append(ProfileJob(key, concrete, candidates))
    return jobs


def _stage2_candidates(p: GemmProblem, epilogue: Epilogue, arch: int, key, record) -> tuple:
    heuristic = choose_kernel(p, epilogue, arch, family="sm80" if key.family == 80 else "auto")
    return heuristic, 1, by_label(tiles_of_family(key.family)(p.element_accumulator, p.element_a), record)


def _job_fields(job: ProfileJob) -> dict:
    p = job.problem
    return {"m": p.m, "n": p.n, "k": p.k, "b_transposed": p.b_transposed}


KIND = RegionKind(
    name="gemm",
    specs=all_gemm_specs,
    spec_type=GemmPatternSpec,
    pattern=gemm_pattern,
    rules=_rules,
    roles=("lhs", "rhs", "bias", "residual"),
    independent_inputs=residual_input,
    read_problem=read_problem,
    problem_type=GemmProblem,
    kernel_type=GemmKernel,
    region_type=GemmRegion,
    plan=plan,
    emit_kernel=emit_gemm_kernel,
    glue_function=gemm_glue_function,
    args_type=ARGS_TYPE,
    args=GEMM_ARGS,
    profiling=Profiling(
        jobs=_jobs,
        label=lambda kernel, split_k: candidate_label(kernel.tile, split_k),
        timing_function=PROFILE_GEMM,
        job_fields=_job_fields,
        stage2_keys=_concrete,
        stage2_candidates=_stage2_candidates,
    ),
    report_line=mnk_report_line,
    flops_name="GEMM",
    left_in_tvm={"relax.matmul": left_in_tvm_row},
    prepare=(fold_output_scales,),
    tile_spelling=TILE_SPELLING,
)
