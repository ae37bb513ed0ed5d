"""GPU tests of the kernel profiler (relax_cutlass.toolkit.profile_runner) on a profiler library
built by `python -m relax_cutlass tune build` (build/tune): it must time only candidates that
compute the right result, epilogue included. Skipped without a GPU or without that build.

The GPU suite's correctness cases are tests/test_gpu_suite.py's.
"""

import json
from pathlib import Path

import pytest

from relax_cutlass.testing.harness import gpu_available

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.gpu

TUNE = ROOT / "build" / "tune"
tune_skip = (
    "no NVIDIA GPU visible"
    if not gpu_available()
    else None
    if (TUNE / "profile.json").exists()
    else "no profiler: run `python -m relax_cutlass tune build`"
)


@pytest.mark.skipif(tune_skip is not None, reason=tune_skip or "")
def test_profiler_times_only_correct_candidates(tmp_path):
    """A candidate fed the wrong B layout computes a wrong product: the correctness check must
    reject it, and the record must then name a correct candidate."""
    from relax_cutlass.toolkit.profile_runner import run_profiler
    from relax_cutlass.toolkit.tuning import TuningDatabase

    manifest = json.loads((TUNE / "profile.json").read_text())
    job = next(j for j in manifest["jobs"] if j["op"] == "gemm")  # a profiler may start with attention jobs
    # The kernels still read B as built: a wrong result. (A copy: the right run below needs the job.)
    wrong = dict(manifest, jobs=[dict(job, b_transposed=not job["b_transposed"])])
    (tmp_path / "profile.json").write_text(json.dumps(wrong))
    (tmp_path / manifest["library"]).symlink_to(TUNE / manifest["library"])
    messages = []
    records = run_profiler(tmp_path, tmp_path / "db.jsonl", repeat=1, log=messages.append)
    assert not records  # B read with the wrong stride: every candidate computes a wrong product
    assert any("rejected" in m or "no candidate passed" in m for m in messages), messages
    right = dict(manifest, jobs=[job])
    (tmp_path / "profile.json").write_text(json.dumps(right))
    records = run_profiler(tmp_path, tmp_path / "db.jsonl", repeat=3, log=messages.append)
    assert len(records) == 1 and records[0].ms > 0
    assert len(TuningDatabase(tmp_path / "db.jsonl")) == 1


@pytest.mark.skipif(tune_skip is not None, reason=tune_skip or "")
def test_profiler_checks_the_epilogue(tmp_path):
    """Stage 2's check covers the epilogue: a kernel checked against another activation than it
    computes is rejected; with the epilogue as built, the record is keyed by it."""
    from relax_cutlass.toolkit.profile_runner import run_profiler

    manifest = json.loads((TUNE / "profile.json").read_text())
    fused = [j for j in manifest["jobs"] if j["key"].get("epilogue")]
    if not fused:
        pytest.skip("the profiler has no epilogue-stage job: `tune build --db` after a first round builds them")
    job = dict(fused[0], candidates=fused[0]["candidates"][:2])
    other = "relu" if job["epilogue"]["activation"] == "identity" else "identity"
    wrong = dict(manifest, jobs=[dict(job, epilogue=dict(job["epilogue"], activation=other))])
    (tmp_path / "profile.json").write_text(json.dumps(wrong))
    (tmp_path / manifest["library"]).symlink_to(TUNE / manifest["library"])
    messages = []
    assert not run_profiler(tmp_path, tmp_path / "db.jsonl", repeat=1, log=messages.append), messages
    (tmp_path / "profile.json").write_text(json.dumps(dict(manifest, jobs=[job])))
    (record,) = run_profiler(tmp_path, tmp_path / "db.jsonl", repeat=3, log=messages.append)
    assert record.key.epilogue == job["key"]["epilogue"] and record.ms > 0
