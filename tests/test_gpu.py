"""GPU tests: every supported epilogue against the reference Relax (TVM CUDA) build.

Needs an NVIDIA GPU and the artifacts of `scripts/build_gpu_suite.py` (build/gpu); skipped
otherwise. Imports only the TVM runtime, so it runs on a GPU host without the TVM compiler:
`bash scripts/gpu_suite.sh` runs it, then the benchmarks.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "gpu"
MANIFEST = BUILD / "manifest.json"

pytestmark = pytest.mark.gpu


def _gpu_available() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def _cases():
    if not MANIFEST.exists():
        return []
    manifest = json.loads(MANIFEST.read_text())
    return [case for key in ("tests", "conv", "graphs", "frontends") for case in manifest.get(key, [])]


gpu_skip = None if _gpu_available() else "no NVIDIA GPU visible"
skip_reason = gpu_skip or (None if MANIFEST.exists() else "no GPU artifacts: run scripts/build_gpu_suite.py first")


@pytest.mark.skipif(skip_reason is not None, reason=skip_reason or "")
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_case_matches_tvm_build_and_float64(case):
    sys.path.insert(0, str(ROOT / "scripts"))
    from run_gpu_suite import check_case

    rows = check_case(case, BUILD)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad


@pytest.mark.skipif(skip_reason is not None, reason=skip_reason or "")
def test_manifest_covers_every_epilogue():
    names = {c["name"] for c in _cases()}
    epilogues = (
        "relu",
        "gelu",
        "gelu_tanh",
        "gelu_decomposed",
        "silu",
        "sigmoid",
        "hardswish",
        "residual",
        "residual_relu",
    )
    for epilogue in epilogues:
        assert any(n.startswith("dense") and epilogue in n for n in names), epilogue
    for epilogue in ("relu", "gelu", "silu", "sigmoid", "hardswish", "residual", "residual_relu"):
        assert any(n.startswith("conv2d") and epilogue in n for n in names), epilogue
    assert any(n.startswith("dense") and "custom" in n for n in names)  # relax_cutlass.extend
    assert any(n.startswith("graph_") for n in names)  # the property tests' GPU sample


@pytest.mark.skipif(skip_reason is not None, reason=skip_reason or "")
def test_glue_rejects_bad_arguments_with_clear_errors():
    sys.path.insert(0, str(ROOT / "scripts"))
    from run_gpu_suite import GLUE_CASE, check_glue_errors

    manifest = json.loads(MANIFEST.read_text())
    if not any(c["name"] == GLUE_CASE for c in manifest.get("tests", [])):
        pytest.skip(f"no {GLUE_CASE} case in this build (scripts/build_gpu_suite.py --only tests)")
    rows = check_glue_errors(manifest, BUILD)
    assert rows and all(r["ok"] for r in rows), rows


@pytest.mark.skipif(skip_reason is not None, reason=skip_reason or "")
def test_conv_glue_rejects_bad_arguments_with_clear_errors():
    sys.path.insert(0, str(ROOT / "scripts"))
    from run_gpu_suite import check_conv_glue_errors

    manifest = json.loads(MANIFEST.read_text())
    if not manifest.get("conv"):
        pytest.skip("no conv2d cases in this build (scripts/build_gpu_suite.py --only conv)")
    rows = check_conv_glue_errors(manifest, BUILD)
    assert rows and all(r["ok"] for r in rows), rows


@pytest.mark.skipif(skip_reason is not None, reason=skip_reason or "")
def test_gelu_of_every_fp16_value_is_within_one_ulp():
    """The 16-bit GELU through real kernels (every family built): x @ I + 0 with each finite fp16
    value in x, against the correctly rounded gelu."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from run_gpu_suite import check_gelu_every_fp16

    rows = check_gelu_every_fp16(json.loads(MANIFEST.read_text()), BUILD)
    if not rows:
        pytest.skip("no dense_bias_gelu_every_fp16 case in this build (scripts/build_gpu_suite.py --only tests)")
    assert all(r["ok"] for r in rows), rows
    print(rows)


@pytest.mark.skipif(skip_reason is not None, reason=skip_reason or "")
def test_chained_sm90_kernels_called_back_to_back_match_tvm():
    """Programmatic dependent launch must never let a kernel read an input still being written."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from run_gpu_suite import check_back_to_back

    rows = check_back_to_back(json.loads(MANIFEST.read_text()), BUILD)
    if not rows:
        pytest.skip("no chain of SM90 kernels in this build (scripts/build_gpu_suite.py --only graphs)")
    assert all(r["ok"] for r in rows), rows


TUNE = ROOT / "build" / "tune"
tune_skip = skip_reason or (
    None if (TUNE / "profile.json").exists() else "no profiler: run `python -m relax_cutlass tune build`"
)


@pytest.mark.skipif(tune_skip is not None, reason=tune_skip or "")
def test_profiler_times_only_correct_candidates(tmp_path):
    """A candidate fed the wrong B layout computes a wrong product: the correctness check must
    reject it, and the record must then name a correct candidate."""
    from relax_cutlass.stages.profile_runner import run_profiler
    from relax_cutlass.stages.tuning import TuningDatabase

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
    from relax_cutlass.stages.profile_runner import run_profiler

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
