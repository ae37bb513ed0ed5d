"""The GPU suite's case tables on the CPU (relax_cutlass.testing's gpu_cases and suite_cases): a gap
or a clash there would make the GPU run check less than it says, or overwrite one case's library with
another's."""

from __future__ import annotations

import pytest

from relax_cutlass.testing import suite_cases
from relax_cutlass.testing.gpu_cases import CONV_SYMBOLIC_RUNS, FAMILIES, SYMBOLIC_RUNS, correctness_cases

CASES = correctness_cases()
BENCHMARKS = {"bench", "conv_bench", "sweep", "model", "resnet", "bert"}
NAMES = [case.name for case in CASES]


def test_cases_cover_every_epilogue():
    for epilogue in ("relu", "gelu", "gelu_tanh", "gelu_decomposed", "silu", "sigmoid", "hardswish", "residual",
                     "residual_relu"):  # fmt: skip
        assert any(n.startswith("dense") and epilogue in n for n in NAMES), epilogue
    for epilogue in ("relu", "gelu", "silu", "sigmoid", "hardswish", "residual", "residual_relu"):
        assert any(n.startswith("conv2d") and epilogue in n for n in NAMES), epilogue
    assert any(n.startswith("dense") and "custom" in n for n in NAMES)  # relax_cutlass.extend
    assert sum(case.section == "graphs" for case in CASES) == 15  # the property tests' GPU sample
    assert {case.section for case in CASES} == {"tests", "conv", "graphs", "frontends", "attention"}


def test_every_library_name_is_unique():
    """A case's name names its libraries: two cases of one name would check one build twice."""
    benchmarks = [case.name for case in suite_cases.benchmark_cases(BENCHMARKS, "db.jsonl")]
    names = [case.name for case in correctness_cases("db.jsonl")] + benchmarks
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_symbolic_cases_run_at_several_sizes_and_both_families():
    dense = {case.name: case for case in CASES if case.section == "tests"}
    for case in dense.values():
        symbolic = case.spec.get("m") == "m"
        assert case.runs == (tuple(SYMBOLIC_RUNS) if symbolic else ({},)), case.name
        assert case.families == (("auto",) if "tile" in case.options else FAMILIES), case.name
        assert "bind" not in case.spec and case.spec["options"] == case.options
    assert dense["dense_bias_gelu_symbolic_m"].runs == ({"m": 1}, {"m": 777}, {"m": 4096})
    conv = next(case for case in CASES if case.name == "conv2d_symbolic_n_bias_relu")
    assert conv.runs == tuple(CONV_SYMBOLIC_RUNS) and conv.spec["n"] == "n"
    symbolic_graphs = [case for case in CASES if case.section == "graphs" and case.runs != ({},)]
    assert symbolic_graphs and all(len(case.runs) == 2 for case in symbolic_graphs)


def test_the_module_wide_checks_find_their_cases():
    """The glue checks call a region's function with its weights as arguments: their cases must
    leave the weights unbound; the GELU check reads x @ I + 0 from an unbound 8x8 dense."""
    gpu_checks = pytest.importorskip("relax_cutlass.testing.gpu_checks")  # torch
    by_name = {case.name: case for case in CASES}
    for name, section in ((gpu_checks.GLUE_CASE, "tests"), (gpu_checks.CONV_GLUE_CASE, "conv"),
                          (gpu_checks.GELU_CASE, "tests")):  # fmt: skip
        case = by_name[name]
        mod, bind = case.model()
        assert case.section == section and not bind, name
        assert [p.name for p in mod["main"].params][:1] == ["x"]


def test_a_tuning_database_adds_tuned_builds():
    assert "dense_nk_bias_gelu_symbolic_m_tuned" not in NAMES
    (tuned,) = [case for case in correctness_cases("db.jsonl") if case.name not in NAMES]
    assert tuned.name == "dense_nk_bias_gelu_symbolic_m_tuned" and tuned.options == {"tuning_db": "db.jsonl"}
    assert tuned.runs == tuple(SYMBOLIC_RUNS) and tuned.families == FAMILIES
    plain = suite_cases.benchmark_cases({"bench", "model"})
    with_db = suite_cases.benchmark_cases({"bench", "model"}, "db.jsonl")
    assert {case.section for case in plain} == {"bench", "model"}
    assert all(case.families[-1] != "tuned" for case in plain)
    assert all(case.families[-1] == "tuned" for case in with_db)
    assert all(case.fields["flops"] == 2 * case.fields["m"] * case.fields["n"] * case.fields["k"]
               for case in plain if case.section == "bench")  # fmt: skip


def test_the_gpu_run_runs_every_gpu_test_file():
    """scripts/gpu_run.sh's check stage runs every test file marked gpu (test_gpu_attention_sm90.py
    was once left out, and a wrong result of the SM90 attention kernel went unseen there)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = (root / "scripts" / "gpu_run.sh").read_text()
    marked = [
        p
        for p in sorted((root / "tests").glob("test_*.py"))
        if re.search(r"^pytestmark = pytest.mark.gpu", p.read_text(), re.M)
    ]
    assert len(marked) >= 10
    assert [p.name for p in marked if f"tests/{p.name}" not in script] == []
