"""Tuning database (keys, corruption, foreign versions, concurrency) and build-time selection with
and without records, plus the profiler's plan; all CPU."""

import dataclasses
import json
import multiprocessing
import warnings

import numpy as np
import pytest

import relax_cutlass
from relax_cutlass.kinds.epilogue import Epilogue, epilogue_key
from relax_cutlass.kinds.gemm.profile import candidate_label, gemm_candidates
from relax_cutlass.kinds.gemm.records import GemmProblem, gemm_key
from relax_cutlass.kinds.gemm.select import choose_kernel
from relax_cutlass.stages import codegen
from relax_cutlass.stages.profile import kernel_label, plan_epilogue_jobs, plan_jobs, retime_reason, stage2_reason
from relax_cutlass.testing.models import conv2d_epilogue_model, dense_epilogue_model
from relax_cutlass.toolkit.tuning import (
    M_BUCKETS,
    TuningDatabase,
    TuningDatabaseWarning,
    TuningKey,
    TuningRecord,
    m_bucket,
)

PROBLEM = GemmProblem(m=4096, n=4096, k=1024, b_transposed=True)


def _record(problem=PROBLEM, tile="tb128x256x64_c1x2x1_cooperative", arch=90, ms=0.05):
    """A record as the profiler writes it: the heuristic's kernel is always among the timed."""
    key = gemm_key(problem, arch, 90, problem.m)
    heuristic = choose_kernel(problem, Epilogue(), arch).tile.describe()
    return TuningRecord(key, tile, ms, candidates={heuristic: ms * 1.2, tile: ms}, device="test GPU")


def test_a_record_that_never_timed_the_heuristics_kernel_is_not_trusted(tmp_path):
    """Records from an older candidate set cannot show that their winner beats today's
    heuristic choice: the heuristic stands, and says why."""
    heuristic = choose_kernel(PROBLEM, Epilogue(), 90)
    db = TuningDatabase(tmp_path / "t.jsonl")
    old = TuningRecord(gemm_key(PROBLEM, 90, 90, PROBLEM.m), "tb128x256x64_c1x2x1_cooperative", 0.02,
                       candidates={"tb128x256x64_c1x2x1_cooperative": 0.02}, device="test GPU")  # fmt: skip
    db.add([old])
    kernel = choose_kernel(PROBLEM, Epilogue(bias=True), 90, db=db)
    assert kernel.selected_by == "heuristic" and kernel.tile == heuristic.tile
    assert f"never timed {heuristic.tile.describe()}" in kernel.note and "re-tune" in kernel.note


def test_key_covers_what_the_choice_depends_on():
    base = gemm_key(PROBLEM, 90, 90, 4096)
    variants = [
        gemm_key(PROBLEM, 80, 80, 4096),
        gemm_key(PROBLEM, 90, 90, 1024),
        gemm_key(GemmProblem(m=4096, n=4096, k=1024, b_transposed=False), 90, 90, 4096),
        gemm_key(GemmProblem(m=4096, n=4096, k=1024, b_transposed=True, element_a="bfloat16"), 90, 90, 4096),
        gemm_key(GemmProblem(m=4096, n=4096, k=1024, b_transposed=True, element_out="float32"), 90, 90, 4096),
        gemm_key(GemmProblem(m=4096, n=4100, k=1024, b_transposed=True), 90, 90, 4096),  # alignment 4
    ]
    assert len({base, *variants}) == 1 + len(variants)
    assert TuningKey.from_json(json.loads(json.dumps(base.to_json()))) == base


def test_records_round_trip_and_later_lines_win(tmp_path):
    db = TuningDatabase(tmp_path / "t.jsonl")
    db.add([_record(ms=0.09, tile="tb128x128x64_c2x1x1_pingpong")])
    db.add([_record(ms=0.05)])
    again = TuningDatabase(tmp_path / "t.jsonl")
    assert len(again) == 1 and again.lookup(_record().key).tile == "tb128x256x64_c1x2x1_cooperative"
    again.compact()
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 1


def test_corrupt_and_foreign_lines_are_reported_and_ignored(tmp_path):
    path = tmp_path / "t.jsonl"
    good = _record()
    foreign = json.loads(good.to_line())
    foreign["key"]["cutlass_version"] = "3.5.0"
    path.write_text(
        "\n".join(["{not json", json.dumps({"hello": 1}), json.dumps(foreign), good.to_line(), "\x00\x01"]) + "\n"
    )
    with pytest.warns(TuningDatabaseWarning, match="ignored 4 line"):
        db = TuningDatabase(path)
    assert len(db) == 1 and db.lookup(good.key) == good
    assert any("re-tune" in p for p in db.problems)


def _append(path, index):
    problem = GemmProblem(m=64 * (index + 1), n=256, k=256, b_transposed=True)
    TuningDatabase(path).add([_record(problem=problem)])


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "t.jsonl"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.starmap(_append, [(path, i) for i in range(32)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        db = TuningDatabase(path)
    assert len(db) == 32


def test_missing_database_is_empty(tmp_path):
    assert len(TuningDatabase(tmp_path / "none.jsonl")) == 0


def test_selection_uses_a_record_else_the_heuristic(tmp_path):
    db = TuningDatabase(tmp_path / "t.jsonl")
    epilogue = Epilogue(bias=True, activation="gelu")
    heuristic = choose_kernel(PROBLEM, epilogue, 90)
    miss = choose_kernel(PROBLEM, epilogue, 90, db=db)
    assert miss.tile == heuristic.tile and miss.selected_by == "heuristic" and "no tuning record" in miss.note
    db.add([_record(tile="tb256x128x64_c2x1x1_cooperative")])
    hit = choose_kernel(PROBLEM, epilogue, 90, db=db)
    assert hit.selected_by == "tuned" and hit.tile.describe() == "tb256x128x64_c2x1x1_cooperative"
    assert hit.epilogue == epilogue  # profiled without epilogue, instantiated with it
    db.add([_record(tile="tb999x1x1_bogus")])
    stale = choose_kernel(PROBLEM, epilogue, 90, db=db)
    assert stale.selected_by == "heuristic" and "not a candidate" in stale.note


def test_symbolic_m_uses_its_bucket(tmp_path):
    db = TuningDatabase(tmp_path / "t.jsonl")
    symbolic = GemmProblem(m=None, n=4096, k=1024, b_transposed=True)
    db.add(
        [_record(problem=GemmProblem(m=1024, n=4096, k=1024, b_transposed=True), tile="tb128x128x64_c1x2x1_pingpong")]
    )
    kernel = choose_kernel(symbolic, Epilogue(), 90, m_hint=1000, db=db)
    assert kernel.selected_by == "tuned" and m_bucket(1000) == 1024
    assert m_bucket(10**6) == M_BUCKETS[-1] and m_bucket(1) == M_BUCKETS[0]


def test_report_says_which_regions_used_the_heuristic(tmp_path):
    db_path = tmp_path / "t.jsonl"
    mod = dense_epilogue_model(4096, 4096, 1024, activation="gelu")
    problem = GemmProblem(m=4096, n=4096, k=1024, b_transposed=True)
    TuningDatabase(db_path).add([_record(problem=problem, tile="tb128x128x64_c2x1x1_pingpong")])
    tuned = relax_cutlass.offload_report(mod, "sm_90a", tuning_db=str(db_path))
    assert [r["selected_by"] for r in tuned.offloaded] == ["tuned"]
    other = relax_cutlass.offload_report(dense_epilogue_model(1024, 4096, 1024), "sm_90a", tuning_db=str(db_path))
    assert [r["selected_by"] for r in other.offloaded] == ["heuristic"]
    assert "no tuning record" in str(other)


def test_profiler_plan_times_kernels_without_epilogue_shared_across_shapes():
    problems = [GemmProblem(m=m, n=4096, k=1024, b_transposed=True) for m in (1024, 4096)]
    problems.append(GemmProblem(m=None, n=1024, k=4096, b_transposed=True))
    jobs = plan_jobs(problems, 90, limit=4)
    assert len(jobs) == 2 + len(M_BUCKETS)  # symbolic M: one job per bucket
    assert all(k.epilogue == Epilogue() for job in jobs for k in job.kernels)
    assert all(1 <= len(job.kernels) <= 4 for job in jobs)
    kernels = {k.name for job in jobs for k in job.kernels}
    assert len(kernels) < sum(len(job.kernels) for job in jobs)  # shape-agnostic kernels are shared


@pytest.mark.parametrize("arch", [80, 90])
def test_candidates_always_include_the_heuristic_choice(arch):
    family = 90 if arch == 90 else 80
    for m in (64, 1024, 8192):
        problem = GemmProblem(m=m, n=4096, k=1024, b_transposed=True)
        kwargs = {} if family == 90 else {"family": "sm80"}
        chosen = choose_kernel(problem, Epilogue(), arch, **kwargs).tile
        assert gemm_candidates(problem, arch, family, 3)[0] == chosen


def test_symbolic_m_dispatches_among_tuned_buckets_at_run_time(tmp_path):
    """Records for two M buckets of a symbolic-M region: the glue picks the kernel by the run-time
    M, and the report lists the dispatch."""
    from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
    from relax_cutlass.stages.constants import offloaded_functions
    from relax_cutlass.stages.emit import emit_glue
    from relax_cutlass.transform import LiftConstants, PartitionForCutlass

    db_path = tmp_path / "t.jsonl"
    small = GemmProblem(m=64, n=4096, k=1024, b_transposed=True)
    large = GemmProblem(m=16384, n=4096, k=1024, b_transposed=True)
    TuningDatabase(db_path).add(
        [
            _record(problem=small, tile="tb128x128x64_c1x2x1_pingpong"),
            _record(problem=large, tile="tb256x128x64_c1x2x1_cooperative"),
        ]
    )
    mod = LiftConstants()(PartitionForCutlass("sm_90a")(dense_epilogue_model("m", 4096, 1024, activation="gelu")))
    options = CodegenOptions(arch=90, tuning_db=str(db_path))
    (region,) = plan_regions([f for _, f in offloaded_functions(mod)], options)
    assert region.dispatch[0][0] == 64 and region.dispatch[0][1].selected_by == "tuned"
    assert region.dispatch[-1][1].tile.describe() == "tb256x128x64_c1x2x1_cooperative"
    assert len(region.kernels) == len(region.dispatch) >= 2
    glue = emit_glue([region], "m").text
    assert "(m <= 64 ? " in glue and all(f"{k.name}_run" in glue for k in region.kernels)
    assert [d["max_m"] for d in region.report_row()["dispatch"]] == [m for m, _ in region.dispatch]


STAGE4 = dict(h=7, w=7, c=512, k=512, r=3, s=3, p=7, q=7, pad=(1, 1))


def test_conv2d_records_carry_tile_and_split_k(tmp_path):
    from relax_cutlass.kinds.conv2d.records import Conv2dProblem, conv2d_key
    from relax_cutlass.kinds.conv2d.select import choose_conv2d_kernel

    problem = Conv2dProblem(n=1, **STAGE4)
    other = Conv2dProblem(n=1, **(STAGE4 | {"stride": (2, 2), "p": 4, "q": 4}))
    assert conv2d_key(problem, 90) != conv2d_key(other, 90)
    db = TuningDatabase(tmp_path / "t.jsonl")
    relu = Epilogue(bias=True, activation="relu")
    heuristic, _ = choose_conv2d_kernel(problem, relu, 90, db=db)
    assert heuristic.selected_by == "heuristic" and "no tuning record" in heuristic.note
    db.add([TuningRecord(conv2d_key(problem, 90, 90), "tb128x64x64_w2x2x1_s3_swz4", 0.02, split_k=4)])
    kernel, split = choose_conv2d_kernel(problem, relu, 90, db=db)
    assert kernel.selected_by == "tuned" and kernel.tile.describe() == "tb128x64x64_w2x2x1_s3_swz4" and split == 4
    # A residual epilogue cannot split K: the record's split-K choice does not apply to it.
    residual = Epilogue(bias=True, residual=True, residual_activation="relu")
    kernel, split = choose_conv2d_kernel(problem, residual, 90, db=db)
    assert kernel.selected_by == "heuristic" and split == 1


def test_conv2d_profiling_candidates_try_split_k_where_tiles_underfill():
    from relax_cutlass.kinds.conv2d.profile import conv2d_candidates
    from relax_cutlass.kinds.conv2d.records import Conv2dProblem

    batch1 = conv2d_candidates(Conv2dProblem(n=1, **STAGE4), 90, 8)
    assert len({split for _, split in batch1}) >= 3  # several split-K counts of the heuristic's tile
    batch32 = conv2d_candidates(Conv2dProblem(n=32, **STAGE4), 90, 8)
    assert all(split == 1 for _, split in batch32[:1])
    jobs = plan_jobs([Conv2dProblem(n=1, **STAGE4), Conv2dProblem(n=None, **STAGE4)], 90, limit=4)
    assert len(jobs) == 1 and jobs[0].key.op == "conv2d"  # symbolic batch: not tuned
    assert all(k.epilogue == Epilogue() for k in jobs[0].kernels)


class _FakeGpu:
    """Stands in for the local GPU: the profiler build and run, recording the second-ranked
    candidate of every job (so a tuned choice differs from the heuristic's)."""

    def __init__(self, monkeypatch, arch: int):
        self.built: list = []
        # where the build calls them
        monkeypatch.setattr(codegen, "local_gpu_arch", lambda: arch)
        monkeypatch.setattr(codegen, "build_profiler", self.build)
        monkeypatch.setattr(codegen, "run_profiler", self.run)

    def build(self, jobs, arch, out, jobs_parallel=None):
        self.built.append(jobs)
        self.jobs = jobs

    def run(self, directory, db_path, repeat=7, log=print):
        records = []
        for number, job in enumerate(self.jobs, 1):
            tile, heuristic = job.candidates[1][0].tile.describe(), job.candidates[0][0].tile.describe()
            # every candidate in the record, as the real runner writes them (a record missing one is
            # re-timed); the others as failed, so that stage 2 takes only these two
            timed = {kernel_label(k, split): None for k, split in job.candidates} | {heuristic: 0.02, tile: 0.01}
            device = codegen.device_name() or "fake GPU"  # the name the build asks for, as the runner's
            records.append(TuningRecord(job.key, tile, 0.01, candidates=timed, device=device))
            log(f"[{number}/{len(self.jobs)}] {tile}")
        TuningDatabase(db_path).add(records)
        return records


def _regions(mod, **options):
    from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
    from relax_cutlass.stages.constants import offloaded_functions
    from relax_cutlass.transform import LiftConstants, PartitionForCutlass

    part = LiftConstants()(PartitionForCutlass("sm_80")(mod))
    options = {"profile": "auto"} | options  # conftest sets RELAX_CUTLASS_PROFILE=never for the others
    return plan_regions([f for _, f in offloaded_functions(part)], CodegenOptions.create("sm_80", **options))


def test_a_build_on_the_target_gpu_profiles_database_misses_once(monkeypatch, tmp_path, capsys):
    gpu = _FakeGpu(monkeypatch, arch=80)
    db = tmp_path / "tuning.jsonl"
    mod = dense_epilogue_model(512, 1024, 256, activation="gelu")
    (region,) = _regions(mod, tuning_db=str(db))
    main_loops, fused = gpu.built  # stage 1, then stage 2 from stage 1's records
    assert len(main_loops) == 1 and all(k.epilogue == Epilogue() for k, _ in main_loops[0].candidates)
    (job,) = fused
    assert job.key.epilogue == "bias+gelu16" and all(k.epilogue == region.kernel.epilogue for k, _ in job.candidates)
    # stage 2 times the heuristic's kernel and stage 1's fastest main loop, each with the epilogue
    tiles = [k.tile for k, _ in job.candidates]
    assert tiles == [main_loops[0].candidates[0][0].tile, main_loops[0].candidates[1][0].tile]
    assert region.kernel.selected_by == "tuned" and region.kernel.tile == tiles[1]
    assert "with its bias+gelu16 epilogue" in region.kernel.note
    err = capsys.readouterr().err
    assert "main loops of 1 problem(s)" in err and "epilogues of 1 problem(s)" in err
    _regions(mod, tuning_db=str(db))  # a rebuild hits the records: nothing is profiled again
    assert len(gpu.built) == 2


def test_profiling_re_times_records_of_an_older_candidate_set_or_another_gpu(monkeypatch, tmp_path, capsys):
    """A record that never timed one of today's candidates, or was measured on another GPU model,
    is timed again by a build that profiles (otherwise H100 builds would keep an H200's records, and
    an attention record from before its new candidates, forever)."""
    gpu = _FakeGpu(monkeypatch, arch=80)
    db = tmp_path / "tuning.jsonl"
    mod = dense_epilogue_model(512, 1024, 256, activation="gelu")
    monkeypatch.setattr(codegen, "device_name", lambda: "fake GPU")
    _regions(mod, tuning_db=str(db))
    assert len(gpu.built) == 2
    (job,) = gpu.built[0]
    record = TuningDatabase(db).lookup(job.key)
    assert retime_reason(job, record, "fake GPU") is None and retime_reason(job, record) is None
    # another GPU model: both stages again (stage 2 follows stage 1's new record)
    assert "measured on fake GPU" in retime_reason(job, record, "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(codegen, "device_name", lambda: "other GPU")
    _regions(mod, tuning_db=str(db))
    assert len(gpu.built) == 4 and TuningDatabase(db).lookup(job.key).device == "other GPU"
    assert "1 re-timed: record measured on fake GPU, not on this other GPU" in capsys.readouterr().err
    record = TuningDatabase(db).lookup(job.key)
    # a record from before a candidate existed: re-timed, also without a GPU name (tune build)
    older = dataclasses.replace(record, candidates=dict(list(record.candidates.items())[:-1]))
    assert "before 1 of its candidates existed" in retime_reason(job, older)
    TuningDatabase(db).add([older])
    monkeypatch.setattr(codegen, "device_name", lambda: "")
    _regions(mod, tuning_db=str(db))
    assert len(gpu.built) == 5 and retime_reason(job, TuningDatabase(db).lookup(job.key)) is None  # stage 1 only
    assert retime_reason(job, None) == "no record"


def _stage1(problem, timings: dict, arch=90):
    """A stage-1 record with these main-loop timings (None: failed the check); the fastest wins."""
    ok = {t: ms for t, ms in timings.items() if ms is not None}
    best = min(ok, key=ok.get)
    return TuningRecord(gemm_key(problem, arch, 90, problem.m), best, ok[best], candidates=timings, device="test GPU")


def test_stage_two_times_the_fastest_correct_main_loops_and_the_heuristic_with_the_epilogue(tmp_path):
    heuristic = choose_kernel(PROBLEM, Epilogue(), 90).tile.describe()
    others = [t.describe() for t in gemm_candidates(PROBLEM, 90, 90, 6)[1:]]
    db = TuningDatabase(tmp_path / "t.jsonl")
    # the fastest main loop failed its check; then others[1] < others[2] < heuristic < others[3]
    timings = {others[0]: None, others[1]: 0.040, others[2]: 0.041, heuristic: 0.045, others[3]: 0.050}
    db.add([_stage1(PROBLEM, timings)])
    gelu, residual = Epilogue(bias=True, activation="gelu"), Epilogue(bias=True, residual=True)
    jobs = plan_epilogue_jobs([(PROBLEM, gelu), (PROBLEM, gelu), (PROBLEM, residual)], 90, db, top_k=2)
    assert [j.key.epilogue for j in jobs] == ["bias+gelu16", "bias+residual_add"]  # one job per kind
    for job in jobs:
        assert [k.tile.describe() for k, _ in job.candidates] == [heuristic, others[1], others[2]]
        assert all(k.epilogue == job.epilogue and k.selected_by == "profiling" for k, _ in job.candidates)
    # no stage-1 record, no epilogue, or a custom activation: no stage-2 job
    other = GemmProblem(m=1024, n=4096, k=1024, b_transposed=True)
    assert plan_epilogue_jobs([(other, gelu), (PROBLEM, Epilogue())], 90, db) == []
    assert stage2_reason(Epilogue()) and stage2_reason(gelu) is None


def test_selection_prefers_the_timing_with_the_epilogue(tmp_path):
    """A main loop that ranks first alone can lose once its epilogue runs: the stage-2 record
    decides; without one (another epilogue), stage 1's choice stands."""
    heuristic = choose_kernel(PROBLEM, Epilogue(), 90).tile.describe()
    alone, fused = [t.describe() for t in gemm_candidates(PROBLEM, 90, 90, 3)[1:]]
    db = TuningDatabase(tmp_path / "t.jsonl")
    db.add([_stage1(PROBLEM, {heuristic: 0.050, alone: 0.045, fused: 0.048})])
    gelu = Epilogue(bias=True, activation="gelu")
    key = dataclasses.replace(gemm_key(PROBLEM, 90, 90, PROBLEM.m), epilogue="bias+gelu16")
    db.add([TuningRecord(key, fused, 0.060, candidates={heuristic: 0.066, alone: 0.064, fused: 0.060}, device="g")])
    kernel = choose_kernel(PROBLEM, gelu, 90, db=db)
    assert kernel.selected_by == "tuned" and kernel.tile.describe() == fused
    assert "60.0 us with its bias+gelu16 epilogue" in kernel.note
    relu = choose_kernel(PROBLEM, Epilogue(bias=True, activation="relu"), 90, db=db)
    assert relu.tile.describe() == alone and "without epilogue" in relu.note


def test_records_of_another_form_of_an_epilogue_are_not_reused(tmp_path):
    """fp16 kernels compute gelu in its 16-bit form, float32 ones with erff: a timing of one form
    (or of the erff form before relax_cutlass had the other) says nothing about the other."""
    heuristic = choose_kernel(PROBLEM, Epilogue(), 90).tile.describe()
    alone, fused = [t.describe() for t in gemm_candidates(PROBLEM, 90, 90, 3)[1:]]
    db = TuningDatabase(tmp_path / "t.jsonl")
    db.add([_stage1(PROBLEM, {heuristic: 0.050, alone: 0.045, fused: 0.048})])
    key = dataclasses.replace(gemm_key(PROBLEM, 90, 90, PROBLEM.m), epilogue="bias+gelu")
    db.add([TuningRecord(key, fused, 0.060, candidates={heuristic: 0.066, alone: 0.064, fused: 0.060}, device="g")])
    gelu = Epilogue(bias=True, activation="gelu")
    assert epilogue_key(gelu, "float16") == "bias+gelu16" and epilogue_key(gelu, "float32") == "bias+gelu"
    kernel = choose_kernel(PROBLEM, gelu, 90, db=db)
    assert kernel.tile.describe() == alone and "without epilogue" in kernel.note
    assert plan_epilogue_jobs([(PROBLEM, gelu)], 90, db)[0].key.epilogue == "bias+gelu16"


def test_stage_two_never_splits_a_conv_with_a_residual(tmp_path):
    from relax_cutlass.kinds.conv2d.profile import conv2d_candidates
    from relax_cutlass.kinds.conv2d.records import Conv2dProblem, conv2d_key

    conv = Conv2dProblem(n=1, h=7, w=7, c=512, k=512, r=3, s=3, p=7, q=7, pad=(1, 1))
    labels = [candidate_label(t, s) for t, s in conv2d_candidates(conv, 90, 12)]
    assert any("_splitk" in label for label in labels)
    timings = {label: 0.01 + 0.001 * i for i, label in enumerate(reversed(labels))}  # split-K ones fastest
    db = TuningDatabase(tmp_path / "t.jsonl")
    db.add([TuningRecord(conv2d_key(conv, 90, 90), labels[-1], 0.01, candidates=timings, device="g")])
    block = Epilogue(bias=True, residual=True, residual_activation="relu")
    (residual,) = plan_epilogue_jobs([(conv, block)], 90, db, top_k=3)
    # split tiles are timed unsplit with a residual: still the heuristic's and three more tiles
    assert all(split == 1 for _, split in residual.candidates)
    assert len({k.tile for k, _ in residual.candidates}) == 4
    (relu,) = plan_epilogue_jobs([(conv, Epilogue(bias=True, activation="relu"))], 90, db, top_k=3)
    assert any(split > 1 for _, split in relu.candidates)


def test_without_a_database_the_records_go_to_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAX_CUTLASS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RELAX_CUTLASS_TUNING_DB", raising=False)
    _FakeGpu(monkeypatch, arch=80)
    (region,) = _regions(dense_epilogue_model(512, 1024, 256))
    assert region.kernel.selected_by == "tuned" and (tmp_path / "tuning.jsonl").exists()


@pytest.mark.parametrize(
    "gpu_arch,options",
    [
        (90, {}),  # an H100 would measure an sm_80 library wrongly
        (None, {}),  # no GPU: the heuristic, and the report says so
        (80, {"profile": "never"}),
        (80, {"compile": False}),  # a dry run touches no GPU
        (80, {"tile": "tb128x128x32_w2x2x1_s5_swz8"}),
    ],
)
def test_no_profiling_unless_a_free_choice_is_built_on_the_target_gpu(monkeypatch, tmp_path, gpu_arch, options):
    gpu = _FakeGpu(monkeypatch, arch=gpu_arch)
    (region,) = _regions(dense_epilogue_model(512, 1024, 256), tuning_db=str(tmp_path / "db.jsonl"), **options)
    assert not gpu.built and region.kernel.selected_by in ("heuristic", "pinned")


def test_by_default_a_build_profiles_only_where_the_heuristic_is_unsure(monkeypatch, tmp_path, capsys):
    """profile="uncertain" (the default): a batch-1 conv the heuristic splits along K is timed; a
    GEMM and a batch-32 conv are not (there profiling gained a median 1.00-1.06x: docs/tuning.md)."""
    monkeypatch.delenv("RELAX_CUTLASS_PROFILE")
    assert codegen.CodegenOptions.create("sm_80").profile == "uncertain"
    gpu = _FakeGpu(monkeypatch, arch=80)
    db = str(tmp_path / "db.jsonl")
    for mod in (dense_epilogue_model(512, 1024, 256), conv2d_epilogue_model(32, 7, 7, 512, 512, layout="NHWC")):
        (region,) = _regions(mod, tuning_db=db, profile="uncertain")
        assert region.kernel.selected_by == "heuristic", region.kernel
    assert not gpu.built
    (region,) = _regions(conv2d_epilogue_model(1, 7, 7, 512, 512, layout="NHWC"), tuning_db=db, profile="uncertain")
    assert gpu.built and all(job.key.op == "conv2d" for jobs in gpu.built for job in jobs)
    assert region.kernel.selected_by == "tuned"
    err = capsys.readouterr().err
    assert "profile='uncertain': where the heuristic is unsure, e.g. the heuristic splits K" in err, err


def test_the_report_never_profiles(monkeypatch):
    gpu = _FakeGpu(monkeypatch, arch=80)
    report = relax_cutlass.offload_report(dense_epilogue_model(512, 1024, 256), arch="sm_80")
    assert not gpu.built and report.offloaded[0]["selected_by"] == "heuristic"


def test_bad_profile_option_is_named():
    with pytest.raises(ValueError, match="profile='sometimes'"):
        relax_cutlass.offload_pipeline("sm_80", profile="sometimes")


def test_ties_go_to_the_heuristic_then_to_unsplit_kernels():
    """Within TIE_MARGIN of the fastest, a measured choice keeps the heuristic's kernel, else
    prefers one without split-K: a 2% win alone ran 4% slower in the model on the H100."""
    from relax_cutlass.kinds.gemm.select import TIE_MARGIN, measured_choice
    from relax_cutlass.toolkit.tuning import parse_label

    key = gemm_key(PROBLEM, 90, 90, PROBLEM.m)

    def choice(timings, heuristic="h"):
        best = min(ms for ms in timings.values() if ms is not None)
        return measured_choice(TuningRecord(key, "x", best, candidates=timings, heuristic=heuristic))[:2]

    assert choice({"h": 0.0102, "a": 0.0100}) == ("h", 1)  # 2% apart: a tie, the heuristic stays
    assert choice({"h": 0.0110, "a": 0.0100}) == ("a", 1)  # 10%: the measured winner
    assert choice({"h": 0.0110, "t_splitk2": 0.0100, "u": 0.0102}) == ("u", 1)
    assert choice({"h": 0.0110, "t_splitk2": 0.0100, "u": 0.0120}) == ("t", 2)
    assert choice({"h": None, "a": 0.0100, "b": 0.0101}) == ("a", 1)  # a failed heuristic never wins
    assert 0 < TIE_MARGIN < 0.05
    # SM90's split-K scheduler is part of a tile's name, not a slice count
    assert parse_label("tb128x128x64_c1x2x1_cooperative_splitk") == ("tb128x128x64_c1x2x1_cooperative_splitk", 1)
    assert parse_label("tb64x64x64_w2x2x1_s5_swz4_splitk4") == ("tb64x64x64_w2x2x1_s5_swz4", 4)


BERT_ATTENTION = dict(heads=16, head_dim=64, head_dim_value=64, scale=0.125)


def test_attention_is_profiled_over_its_two_tiles_where_it_has_a_choice():
    from relax_cutlass.kinds.attention.records import AttentionProblem
    from relax_cutlass.kinds.attention.select import choose_attention_kernel

    b8 = AttentionProblem(batch=8, seq_q=128, seq_kv=128, **BERT_ATTENTION)
    b1 = AttentionProblem(batch=1, seq_q=128, seq_kv=128, **BERT_ATTENTION)
    wide = AttentionProblem(batch=8, seq_q=128, seq_kv=128, heads=8, head_dim=128, head_dim_value=128, scale=0.1)
    symbolic = AttentionProblem(batch=None, seq_q=128, seq_kv=128, **BERT_ATTENTION)
    # The SM80 family on the H100 (sm_90a's own, examples/88, is tests/test_attention_sm90.py's)
    jobs = plan_jobs([b8, b1, b8, wide, symbolic], 90, family="sm80")
    assert [j.key.op for j in jobs] == ["attention", "attention"]  # deduplicated; wide/symbolic: no choice
    for job, problem in zip(jobs, (b8, b1), strict=True):
        rule = choose_attention_kernel(problem, 90, family="sm80")
        tiles = [(k.queries_per_block, k.keys_per_block) for k, _ in job.candidates]
        assert tiles[0] == (rule.queries_per_block, rule.keys_per_block) and sorted(tiles) == [(32, 128), (64, 64)]
        assert job.key.shape == (problem.batch, 128, 128, 16, 64, 64)


def test_attention_takes_a_measured_tile_beyond_the_tie_margin(tmp_path):
    from relax_cutlass.kinds.attention.profile import attention_key
    from relax_cutlass.kinds.attention.records import AttentionProblem
    from relax_cutlass.kinds.attention.select import choose_attention_kernel

    b8 = AttentionProblem(batch=8, seq_q=128, seq_kv=128, **BERT_ATTENTION)
    rule = choose_attention_kernel(b8, 90, family="sm80")  # the SM80 family's tiles, on the H100
    assert (rule.queries_per_block, rule.selected_by) == (64, "heuristic")
    db = TuningDatabase(tmp_path / "t.jsonl")

    def record(q64: float, q32: float):
        times = {"q64_k64": q64, "q32_k128": q32}
        best = min(times, key=times.get)
        return TuningRecord(attention_key(b8, 90), best, times[best], candidates=times, device="g", heuristic="q64_k64")

    db.add([record(0.0164, 0.0160)])  # 2.5% apart: a tie, the rule stands
    assert choose_attention_kernel(b8, 90, db, family="sm80").queries_per_block == 64
    db.add([record(0.0164, 0.0140)])
    tuned = choose_attention_kernel(b8, 90, db, family="sm80")
    assert (tuned.queries_per_block, tuned.keys_per_block, tuned.selected_by) == (32, 128, "tuned")
    assert "14.0 us" in tuned.note and tuned.name != rule.name
    other = AttentionProblem(batch=4, seq_q=128, seq_kv=128, **BERT_ATTENTION)
    assert "no tuning record" in choose_attention_kernel(other, 90, db, family="sm80").note


def test_an_attention_record_that_never_timed_the_heuristics_kernel_is_not_trusted(tmp_path):
    """As for GEMMs: the H200's BERT attention record timed two SM90 candidates; the heuristic's
    pingpong 128 x 128 came later, so the record cannot show its winner is faster."""
    from relax_cutlass.kinds.attention.profile import attention_key
    from relax_cutlass.kinds.attention.records import AttentionProblem
    from relax_cutlass.kinds.attention.select import choose_attention_kernel

    b8 = AttentionProblem(batch=8, seq_q=128, seq_kv=128, **BERT_ATTENTION)
    rule = choose_attention_kernel(b8, 90)
    assert (rule.schedule, rule.keys_per_block, rule.selected_by) == ("pingpong", 128, "heuristic")
    db = TuningDatabase(tmp_path / "t.jsonl")
    old = {"cooperative_q128_k64": 0.0081, "pingpong_q128_k64": 0.0061}
    db.add([TuningRecord(attention_key(b8, 90, 90), "pingpong_q128_k64", 0.0061, candidates=old, device="g")])
    kept = choose_attention_kernel(b8, 90, db)
    assert kept.name == rule.name and "never timed pingpong_q128_k128 (re-tune)" in kept.note
    db.add(
        [
            TuningRecord(
                attention_key(b8, 90, 90), "pingpong_q128_k64", 0.0050, candidates=old | {"pingpong_q128_k128": 0.0061}
            )
        ]
    )
    tuned = choose_attention_kernel(b8, 90, db)
    assert (tuned.keys_per_block, tuned.selected_by) == (64, "tuned")


@pytest.mark.parametrize("s, t, causal", [(300, 300, 0), (300, 300, 1), (120, 333, 2), (333, 120, 2), (20, 20, 1)])
def test_attention_profiling_reference_at_sampled_rows(s, t, causal):
    """The profiler checks an attention candidate at a sample of query rows (the full reference of a
    long sequence took the CPU minutes per problem): at those rows it is the full softmax(q k^T) v,
    under TVM's TopLeft / BottomRight causal masks, and the runner compares just them."""
    from relax_cutlass.kinds.attention.reference import attention_reference, checked_rows
    from relax_cutlass.toolkit.profile_runner import reference_error

    rng = np.random.default_rng(0)
    q, k, v = (rng.uniform(-1, 1, (2, n, 3, 16)).astype("float16") for n in (s, t, t))
    scores = np.einsum("bsnh,btnh->bnst", q.astype("float32"), k.astype("float32")) * 0.25
    if causal:
        offset = abs(s - t) if causal == 2 else 0
        scores = np.where(np.arange(t)[None, :] <= np.arange(s)[:, None] + offset, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    full = np.einsum("bnst,btnv->bsnv", probs / probs.sum(-1, keepdims=True), v.astype("float32"))
    rows = checked_rows(s, rng)
    assert rows[0] == 0 and rows[-1] == s - 1 and len(rows) == len(set(rows)) and (s <= 37 or len(rows) < s)
    sampled = attention_reference(q, k, v, 0.25, causal, rows)
    np.testing.assert_allclose(sampled, full[:, rows], rtol=1e-5, atol=1e-6)
    assert reference_error(full, ((slice(None), rows), sampled)) < 1e-6
    wrong = full.copy()
    wrong[:, rows[-1]] += 1.0
    assert reference_error(wrong, ((slice(None), rows), sampled)) > 1e-2
