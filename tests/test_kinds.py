"""The region-kind protocol (relax_cutlass.kinds): the built-in kinds, and the example kind of
docs/architecture.md (act(x + bias)), registered at run time and taken through partition,
planning, C++ emission and the report."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass import kinds
from relax_cutlass.kinds.bias_act.kind import KIND as BIAS_ACT
from relax_cutlass.kinds.bias_act.reference import reference
from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
from relax_cutlass.stages.constants import offloaded_functions
from relax_cutlass.stages.emit import emit_glue, emit_kernel
from relax_cutlass.stages.patterns import all_specs, spec_by_name
from relax_cutlass.transform import LiftConstants, PartitionForCutlass


@pytest.fixture
def bias_act():
    with kinds.registered(BIAS_ACT) as kind:
        yield kind


def test_builtin_kinds():
    names = [k.name for k in kinds.kinds()]
    assert names == ["gemm", "conv2d", "attention", "depthwise_conv2d", "norm", "channel_affine"]
    for kind in kinds.kinds():
        assert kind.args_type in kind.args
        for spec in kind.specs():
            assert kinds.kind_of(spec) is kind and spec_by_name()[spec.name] == spec
    sizes = [s.size for s in all_specs()]
    assert sizes == sorted(sizes, reverse=True)


def test_kind_references_need_no_tvm_compiler():
    """The profile runner on a GPU host imports every kind's reference with only TVM's runtime."""
    code = (
        "import sys, relax_cutlass.toolkit.profile_runner, relax_cutlass.kinds\n"
        "kinds = relax_cutlass.kinds.REGISTERED + list(relax_cutlass.kinds.OPT_IN)\n"
        "for name in kinds: __import__(f'relax_cutlass.kinds.{name}.reference')\n"
        "assert 'tvm.relax' not in sys.modules and 'tvm' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    for kind in kinds.kinds():  # the name the profiler's manifest gives the runner
        assert kind.reference_module == f"relax_cutlass.kinds.{kind.name}.reference"


def _graph(rows: int = 32, n: int = 64) -> tvm.IRModule:
    """relu(x @ w + b) (a GEMM with its epilogue), then silu(y + c): bias + activation alone."""
    x = relax.Var("x", relax.TensorType([rows, n], "float16"))
    w = relax.Var("w", relax.TensorType([n, n], "float16"))
    b = relax.Var("b", relax.TensorType([n], "float16"))
    c = relax.Var("c", relax.TensorType([n], "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b, c]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.add(bb.emit(relax.op.matmul(x, w)), b)))
            z = bb.emit(relax.op.add(y, c))
            out = bb.emit_output(relax.op.nn.silu(z))
        bb.emit_func_output(out)
    return bb.get()


def _regions(mod: tvm.IRModule, **options):
    part = LiftConstants()(PartitionForCutlass("sm_80")(mod))
    return plan_regions([f for _, f in offloaded_functions(part)], CodegenOptions.create("sm_80", **options))


def test_example_kind_is_opt_in():
    (region,) = _regions(_graph())
    assert kinds.kind_of(region).name == "gemm"
    assert "BiasAct" not in emit_glue([region], "m").text


def test_example_kind_offloads(bias_act):
    regions = _regions(_graph())
    by_kind = {kinds.kind_of(r).name: r for r in regions}
    assert sorted(by_kind) == ["bias_act", "gemm"]
    gemm, example = by_kind["gemm"], by_kind["bias_act"]
    assert gemm.composite == "relax_cutlass.matmul_bias_relu"  # the GEMM keeps its epilogue
    assert example.composite == "relax_cutlass.bias_act_silu"
    assert example.kernel.problem.rows == 32 and example.kernel.problem.n == 64
    assert set(example.arg_roles) == {"data", "bias"}

    kernel = emit_kernel(example.kernel)
    assert kernel.kind == "cuda" and f"{example.kernel.name}_run" in kernel.text
    assert "v / (1.f + __expf(-v))" in kernel.text
    glue = emit_glue(regions, "m").text
    assert "struct RelaxCutlassBiasActArgs" in glue and f"__tvm_ffi_{example.symbol}" in glue
    assert f"{example.kernel.name}_run(const RelaxCutlassBiasActArgs* args" in glue

    report = relax_cutlass.offload_report(_graph())
    assert sorted(r["op"] for r in report.offloaded) == ["bias_act", "matmul"]
    assert "[offloaded] bias_act rows=32 n=64 epilogue=bias+silu" in str(report)


def test_example_kind_rules(bias_act):
    """A bias that is not a vector over the last axis stays in TVM."""
    x = relax.Var("x", relax.TensorType([8, 16], "float16"))
    c = relax.Var("c", relax.TensorType([8, 1], "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, c]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(x, c)))
        bb.emit_func_output(out)
    assert _regions(bb.get()) == []


def test_example_kind_reference():
    rng = np.random.default_rng(0)
    x, b = rng.uniform(-2, 2, (4, 8)).astype("float16"), rng.uniform(-1, 1, 8).astype("float16")
    want = x.astype("float32") + b.astype("float32")
    np.testing.assert_allclose(reference(x, b, "relu"), np.maximum(want, 0))
    np.testing.assert_allclose(reference(x, b, "silu"), want / (1 + np.exp(-want)), rtol=1e-6)


def test_register_twice_fails(bias_act):
    with pytest.raises(ValueError, match="already registered"):
        kinds.register(bias_act)


def test_registered_keeps_a_kind_the_environment_enables(monkeypatch):
    """A test's `registered(KIND)` inside a run with RELAX_CUTLASS_ENABLE_KINDS naming that kind
    (the GPU host's batch enables opt-in kinds so) runs with it, and leaves it registered."""
    monkeypatch.setenv(kinds.ENABLE_ENV, BIAS_ACT.name)
    with kinds.registered(BIAS_ACT) as kind:
        assert kind is BIAS_ACT and kinds.is_registered(BIAS_ACT.name)
    assert kinds.is_registered(BIAS_ACT.name)
    monkeypatch.delenv(kinds.ENABLE_ENV)
    assert not kinds.is_registered(BIAS_ACT.name)


@pytest.mark.nvcc
def test_example_kind_builds(bias_act):
    """The example kind's kernel and glue compile and link into a loadable library (no GPU)."""
    from relax_cutlass.stages.codegen import build_regions

    regions = [r for r in _regions(_graph()) if kinds.kind_of(r) is bias_act]
    module = build_regions(regions, CodegenOptions.create("sm_80"), "bias_act_example")
    assert module is not None
