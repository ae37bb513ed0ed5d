"""A region that passed partitioning but cannot be planned or compiled goes back to TVM at codegen:
the pipeline never crashes on it, the model still computes the same values, the offload report
says why, and a warning asks for a bug report."""

import dataclasses
from pathlib import Path

import pytest
import tvm
from tvm.script import relax as R

import relax_cutlass
from relax_cutlass.kinds import kind_of
from relax_cutlass.kinds.gemm.records import GemmProblem
from relax_cutlass.stages import codegen
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import (
    build_cpu,
    offload_pipeline_on_cpu,
    partition_for_cpu,
    random_inputs,
    run_vm,
    serve_regions_on_cpu,
)
from relax_cutlass.toolkit.compile import CompileError


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
    with pytest.warns(UserWarning, match="could not offload a region, so it runs in TVM: .*KeyError.*bug"):
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


# Failures injected into a real build (nvcc for sm_80, the host compiler, the linker): the region
# that breaks goes back to TVM alone, the other is still offloaded, one warning names it, the
# report gives the compiler's first error line, and the model computes what TVM's build computes.


def _injected_build(monkeypatch, inject) -> tuple[tvm.IRModule, list]:
    """offload_pipeline("sm_80") of TwoLayers with `inject(bad_region)` applied; -> (module, regions)."""
    from relax_cutlass.pipeline import partition_as_offloaded
    from relax_cutlass.stages.constants import offloaded_functions

    options = codegen.CodegenOptions.create("sm_80", profile="never")
    part = partition_as_offloaded(TwoLayers, "sm_80")
    regions = codegen.plan_regions([f for _, f in offloaded_functions(part)], options)
    assert len({k.name for r in regions for k in r.kernels}) == 2  # one kernel each: one can fail alone
    inject(regions[0])
    with pytest.warns(UserWarning) as caught:
        rewritten = relax_cutlass.offload_pipeline("sm_80", profile="never")(TwoLayers)
    offload_warnings = [str(w.message) for w in caught if "could not offload" in str(w.message)]
    assert len(offload_warnings) == 1 and regions[0].symbol in offload_warnings[0], offload_warnings
    return rewritten, regions


def _check_runs_like_tvm(rewritten: tvm.IRModule, regions: list, why: str) -> None:
    report = relax_cutlass.offload_report(rewritten)
    assert [r["symbol"] for r in report.offloaded] == [regions[1].symbol], report
    (left,) = report.left_in_tvm
    assert why in left["reasons"][0] and "injected" in left["reasons"][0], left
    assert len(left["reasons"][0]) < 1000  # the first error line, not the whole log
    # the kept region's extern is served by its composite here; the returned one is TVM's own
    serve_regions_on_cpu(partition_for_cpu(TwoLayers, "sm_80"))
    inputs = random_inputs(TwoLayers)
    expected = run_vm(build_cpu(TwoLayers), inputs)
    got = run_vm(build_cpu(rewritten.without_attr("external_mods")), inputs)
    assert rel_error(got, expected) <= 1e-2


def _break_emitter(monkeypatch, name: str, concerns) -> None:
    """codegen's emitter `name`, its source given a compile error where `concerns(*args)`."""
    emit = getattr(codegen, name)

    def broken(*args):
        source = emit(*args)
        if concerns(*args):
            source = dataclasses.replace(source, text=source.text + f"\n#error injected {name} failure\n")
        return source

    monkeypatch.setattr(codegen, name, broken)


def _fail_where(monkeypatch, module, name: str, concerns, error) -> None:
    """`module.name` raising `error(*args)` where `concerns(*args)`, else doing its work."""
    real = getattr(module, name)

    def failing(*args):
        if concerns(*args):
            raise error(*args)
        return real(*args)

    monkeypatch.setattr(module, name, failing)


@pytest.mark.nvcc
def test_a_kernel_that_does_not_compile_runs_in_tvm(monkeypatch):
    def inject(bad):
        _break_emitter(monkeypatch, "emit_kernel", lambda kernel: kernel.name == bad.kernels[0].name)

    rewritten, regions = _injected_build(monkeypatch, inject)
    _check_runs_like_tvm(rewritten, regions, "did not compile")


@pytest.mark.nvcc
def test_a_glue_that_does_not_compile_runs_in_tvm(monkeypatch):
    def inject(bad):
        _break_emitter(monkeypatch, "emit_glue", lambda regions, _name: any(r.symbol == bad.symbol for r in regions))

    rewritten, regions = _injected_build(monkeypatch, inject)
    _check_runs_like_tvm(rewritten, regions, "host glue did not compile")


@pytest.mark.nvcc
def test_a_kernel_that_fails_its_sass_check_runs_in_tvm(monkeypatch):
    from relax_cutlass.toolkit import compile as compile_stage
    from relax_cutlass.toolkit import sass_check

    def stub(obj, name, family, arch):
        record = {"counts": {"HMMA": 0}, "command": ["cuobjdump"], "sass": ["sm_80"]}
        return sass_check.StubKernelError(f"{name} (injected)", arch, family or "sm80", record, obj)

    def inject(bad):  # verify_object where the compile step calls it
        _fail_where(monkeypatch, compile_stage, "verify_object", lambda _o, name, *_: name == bad.kernels[0].name, stub)

    rewritten, regions = _injected_build(monkeypatch, inject)
    _check_runs_like_tvm(rewritten, regions, "failed its SASS check")


@pytest.mark.nvcc
def test_a_module_that_does_not_link_returns_the_region_that_breaks_it(monkeypatch):
    def inject(bad):
        _fail_where(
            monkeypatch,
            codegen,
            "link_relocatable",
            lambda objects, _name: any(Path(o).name.startswith(bad.kernels[0].name + "-") for o in objects),
            lambda objects, _name: CompileError(Path(objects[0]), ["ld", "-r"], "ld: error: injected link failure"),
        )

    rewritten, regions = _injected_build(monkeypatch, inject)
    _check_runs_like_tvm(rewritten, regions, "link or load failed")


def test_a_returned_region_of_a_kind_without_left_in_tvm_ops_is_reported(monkeypatch, tmp_path):
    """A DenseNet concatenation's batch norm (the channel-affine kind: no op of it is one a kind
    reports as left in TVM) whose kernel did not compile gets its own report row with the
    compiler's reason, not silence (a real build once reported "0 candidate(s) left in TVM")."""
    from relax_cutlass.testing.channel_affine_graphs import dense_block_module

    def compile_all(sources, arch, jobs=None, failures=None):
        for source in sources:
            failures[source.name] = CompileError(tmp_path / "k.cu", ["nvcc"], "error: a test's compile failure")
        return {}

    monkeypatch.setattr(codegen, "compile_all", compile_all)
    with pytest.warns(UserWarning, match="could not offload a region"):
        rewritten = relax_cutlass.offload_pipeline("sm_90a", profile="never")(dense_block_module((64, 32)))
    report = relax_cutlass.offload_report(rewritten)
    assert report.offloaded == []
    (left,) = report.left_in_tvm
    assert "channel_affine" in left["op"] or "batch_norm" in left["op"], left
    assert "did not compile" in left["reasons"][0] and "test's compile failure" in left["reasons"][0], left
    assert "1 candidate(s) left in TVM" in str(report)
