"""A region that passed partitioning but cannot be planned or compiled goes back to TVM at codegen:
the pipeline never crashes on it, the model still computes the same values, the offload report
says why, and a warning asks for a bug report."""

import dataclasses

import pytest
import tvm
from harness import build_cpu, offload_pipeline_on_cpu, random_inputs, rel_error, run_vm
from tvm.script import relax as R

import relax_cutlass
from relax_cutlass.kinds import kind_of
from relax_cutlass.kinds.gemm.records import GemmProblem
from relax_cutlass.stages import codegen
from relax_cutlass.stages.compile import CompileError


@tvm.script.ir_module
class TwoLayers:
    @R.function
    def main(
        x: R.Tensor((16, 32), "float16"),
        w1: R.Tensor((64, 32), "float16"),
        b1: R.Tensor((64,), "float16"),
        w2: R.Tensor((48, 64), "float16"),
    ):
        with R.dataflow():
            h = R.nn.relu(R.add(R.matmul(x, R.permute_dims(w1)), b1))
            y = R.matmul(h, R.permute_dims(w2))
            R.output(y)
        return y


def _refuse_n(monkeypatch, n: int) -> None:
    """Make the GEMM kind fail to plan the problem with N == n, as a relax_cutlass bug would."""
    gemm = kind_of(GemmProblem(m=16, n=64, k=32, b_transposed=True))

    def plan(problem, spec, options, db):
        if problem.n == n:
            raise KeyError("no kernel record for this test")
        return gemm.plan(problem, spec, options, db)

    refusing = dataclasses.replace(gemm, plan=plan)
    monkeypatch.setattr(codegen, "kind_of", lambda x: refusing if kind_of(x) is gemm else kind_of(x))


def test_a_region_that_fails_to_plan_runs_in_tvm(monkeypatch):
    _refuse_n(monkeypatch, 64)
    inputs = random_inputs(TwoLayers)
    expected = run_vm(build_cpu(TwoLayers), inputs)
    with pytest.warns(UserWarning, match="could not offload .*, so it runs in TVM: KeyError.*relax_cutlass bug"):
        rewritten = offload_pipeline_on_cpu(TwoLayers)
    got = run_vm(build_cpu(rewritten), inputs)
    assert rel_error(got, expected) <= 1e-2

    report = relax_cutlass.offload_report(rewritten)
    assert [r["mnk"] for r in report.offloaded] == [[16, 48, 64]]
    (left,) = report.left_in_tvm
    assert "returned to TVM at codegen: KeyError" in left["reasons"][0], left
    assert "[in TVM]" in str(report) and "no kernel record for this test" in str(report)


def test_the_preview_report_says_the_same(monkeypatch):
    _refuse_n(monkeypatch, 64)
    with pytest.warns(UserWarning, match="could not offload"):
        report = relax_cutlass.offload_report(TwoLayers, "sm_90a")
    assert len(report.offloaded) == 1 and "returned to TVM" in report.left_in_tvm[0]["reasons"][0]


def test_without_failures_nothing_is_returned():
    rewritten = relax_cutlass.offload_pipeline("sm_90a", compile=False)(TwoLayers)
    assert codegen.RETURNED_ATTR not in (rewritten.attrs or {})
    assert len(relax_cutlass.offload_report(rewritten).offloaded) == 2


def test_a_kernel_that_does_not_compile_returns_its_regions(monkeypatch, tmp_path):
    from relax_cutlass.pipeline import partition_as_offloaded

    options = codegen.CodegenOptions.create("sm_90a", profile="never")
    part = partition_as_offloaded(TwoLayers, "sm_90a")
    from relax_cutlass.stages.constants import offloaded_functions

    regions = codegen.plan_regions([f for _, f in offloaded_functions(part)], options)
    bad = regions[0].kernels[0].name

    def compile_all(sources, arch, jobs=None, failures=None):
        assert len(sources) == len({k.name for r in regions for k in r.kernels})  # one parallel call
        for source in sources:
            if source.name == bad:
                failures[source.name] = CompileError(tmp_path / "k.cu", ["nvcc"], "error: a test's compile failure")
        return {s.name: (tmp_path / "k.o", True) for s in sources if s.name != bad}

    monkeypatch.setattr(codegen, "compile_all", compile_all)
    failed = codegen.compile_kernels(regions, options)
    assert list(failed) == [regions[0].symbol]
    assert "did not compile" in failed[regions[0].symbol] and "test's compile failure" in failed[regions[0].symbol]
