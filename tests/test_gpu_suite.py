"""The GPU suite's correctness cases (relax_cutlass/testing/gpu_cases.py), built in-process as a user on a GPU
machine builds them (the GPU host with the whole TVM): each kernel family's library against TVM's
own CUDA build of the same model and a float64 torch reference, on two input seeds per shape and
at several sizes of a symbolic dimension; the glue's argument errors, the 16-bit GELU on every
finite fp16 value, and chains of SM90 kernels called back to back (relax_cutlass/testing/gpu_checks.py).

Every selected case's kernels are compiled up front, nvcc on all cores (the session fixture), then
each case builds from the object cache when its test first needs it. GPU_SUITE_TUNING_DB adds the
tuned symbolic-M case. Skipped without a GPU, torch or TVM's compiler.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


# isort: split
from relax_cutlass.testing import gpu_convs  # noqa: E402, F401  (skips this module without a GPU, torch or TVM's compiler)

# isort: split
from relax_cutlass.testing import gpu_checks  # noqa: E402
from relax_cutlass.testing.gpu_build import build_case, local_arch, prewarm  # noqa: E402
from relax_cutlass.testing.gpu_cases import SuiteCase, correctness_cases  # noqa: E402

TUNING_DB = os.environ.get("GPU_SUITE_TUNING_DB", "")
CASES = correctness_cases(TUNING_DB)
BY_NAME = {case.name: case for case in CASES}
CHAINS = [case.name for case in CASES if case.section in ("graphs", "frontends")]
# The cases each test of this module besides the per-case one reads.
NEEDS = {
    "test_glue_rejects_bad_arguments_with_clear_errors": [gpu_checks.GLUE_CASE],
    "test_conv_glue_rejects_bad_arguments_with_clear_errors": [gpu_checks.CONV_GLUE_CASE],
    "test_gelu_of_every_fp16_value_is_within_one_ulp": [gpu_checks.GELU_CASE],
    "test_chained_sm90_kernels_called_back_to_back_match_tvm": CHAINS,
}


class SuiteBuild:
    """The session's builds: each case built once, when a test first needs it, into one folder."""

    def __init__(self, out: Path, arch: str) -> None:
        self.out, self.arch = out, arch
        self._entries: dict[str, dict] = {}

    def entry(self, name: str) -> dict:
        if name not in self._entries:
            self._entries[name] = build_case(BY_NAME[name], self.out, self.arch, TUNING_DB)
        return self._entries[name]

    def manifest(self, names: list[str]) -> dict:
        """The manifest gpu_checks' module-wide checks read: the named cases under their sections."""
        manifest: dict = {"arch": self.arch}
        for name in names:
            manifest.setdefault(BY_NAME[name].section, []).append(self.entry(name))
        return manifest


def _selected_cases(items) -> set[str]:
    """The cases the session's selected tests of this module will build."""
    names = set()
    for item in items:
        case = getattr(item, "callspec", None) and item.callspec.params.get("case")
        if isinstance(case, SuiteCase):
            names.add(case.name)
        elif getattr(item, "module", None) is not None and item.module.__name__ == __name__:
            names.update(NEEDS.get(item.originalname, []))
    return names


@pytest.fixture(scope="session")
def suite(request, tmp_path_factory) -> SuiteBuild:
    arch = local_arch()
    prewarm([BY_NAME[name] for name in sorted(_selected_cases(request.session.items))], arch, TUNING_DB)
    return SuiteBuild(tmp_path_factory.mktemp("gpu_suite"), arch)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_case_matches_tvm_build_and_float64(suite, case):
    rows = gpu_checks.check_case(suite.entry(case.name), suite.out)
    assert len(rows) == 2 * len(case.runs) * len(case.families)  # every family, run and seed checked
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad


def test_glue_rejects_bad_arguments_with_clear_errors(suite):
    rows = gpu_checks.check_glue_errors(suite.manifest([gpu_checks.GLUE_CASE]), suite.out)
    assert rows and all(r["ok"] for r in rows), rows


def test_conv_glue_rejects_bad_arguments_with_clear_errors(suite):
    rows = gpu_checks.check_conv_glue_errors(suite.manifest([gpu_checks.CONV_GLUE_CASE]), suite.out)
    assert rows and all(r["ok"] for r in rows), rows


def test_gelu_of_every_fp16_value_is_within_one_ulp(suite):
    """The 16-bit GELU through real kernels (every family built): x @ I + 0 with each finite fp16
    value in x, against the correctly rounded gelu."""
    rows = gpu_checks.check_gelu_every_fp16(suite.manifest([gpu_checks.GELU_CASE]), suite.out)
    assert len(rows) == len(BY_NAME[gpu_checks.GELU_CASE].families) and all(r["ok"] for r in rows), rows


def test_chained_sm90_kernels_called_back_to_back_match_tvm(suite):
    """Programmatic dependent launch must never let a kernel read an input still being written."""
    if not suite.arch.startswith("sm_90"):
        pytest.skip(f"chains of SM90 kernels need an SM90 GPU, not {suite.arch}")
    rows = gpu_checks.check_back_to_back(suite.manifest(CHAINS), suite.out)
    assert rows, "no random graph or frontend model built a chain of two SM90 kernels"
    assert all(r["ok"] for r in rows), rows
