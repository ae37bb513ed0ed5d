"""Custom activations (relax_cutlass.extend): registration rules, partition, CPU semantics, emitted
C++ for every kernel family, and the nvcc check of the expression."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from tvm.relax.dpl import is_const, is_op, wildcard

import relax_cutlass
from relax_cutlass.extend import (
    ActivationCheckError,
    check_activation,
    register_activation,
    registered_activations,
    unregister_activation,
)
from relax_cutlass.kinds.conv2d.records import Conv2dProblem
from relax_cutlass.kinds.conv2d.select import choose_conv2d_kernel
from relax_cutlass.kinds.epilogue import Epilogue
from relax_cutlass.kinds.gemm.records import GemmProblem
from relax_cutlass.kinds.gemm.select import choose_kernel
from relax_cutlass.prepare import bind_weights
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing import models
from relax_cutlass.testing.harness import compare_on_cpu, random_inputs
from relax_cutlass.testing.models import conv2d_epilogue_model, dense_epilogue_model, random_weights

QUICK_GELU_CXX = "x / (1.0f + expf(-1.702f * x))"


def quick_gelu_pattern(x, const):
    """x * sigmoid(1.702 * x), as CLIP's QuickGELU is exported."""
    return is_op("relax.multiply")(x, is_op("relax.sigmoid")(is_op("relax.multiply")(x, const(1.702))))


def quick_gelu_reference(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-1.702 * x))


@pytest.fixture
def quick_gelu():
    register_activation("quick_gelu", quick_gelu_pattern, QUICK_GELU_CXX)
    yield "quick_gelu"
    unregister_activation("quick_gelu")


def test_registration_adds_patterns_and_unregistration_removes_them(quick_gelu):
    from relax_cutlass.stages.patterns import all_specs, spec_by_name

    names = [s.name for s in all_specs()]
    assert "relax_cutlass.dense_bias_quick_gelu" in names
    assert "relax_cutlass.conv2d_bias_quick_gelu_residual_add_relu" in names
    assert spec_by_name()["relax_cutlass.matmul_quick_gelu_cast"].activation == "quick_gelu"
    assert registered_activations() == ["quick_gelu"]
    unregister_activation("quick_gelu")
    assert not any("quick_gelu" in s.name for s in all_specs())
    register_activation("quick_gelu", quick_gelu_pattern, QUICK_GELU_CXX)  # for the fixture's teardown


@pytest.mark.parametrize(
    "name,pattern,expression,message",
    [
        ("QuickGelu", quick_gelu_pattern, QUICK_GELU_CXX, "lower_snake_case"),
        ("relu", quick_gelu_pattern, QUICK_GELU_CXX, "built-in activation"),
        ("residual_add", quick_gelu_pattern, QUICK_GELU_CXX, "reserved"),
        ("scaled", lambda x, const: is_op("relax.multiply")(x, wildcard()), "x", "tensor other than x"),
        ("scaled", lambda x, const: is_op("relax.multiply")(x, is_const()), "x", r"const\(value\)"),
        ("summed", lambda x, const: is_op("relax.sum")(x), "x", "relax.sum, which is not an elementwise op"),
        ("soft", lambda x, const: is_op("relax.nn.softmax")(x), "x", "not an elementwise op"),
        ("same", lambda x, const: x, "x", "just x"),
        ("constant", lambda x, const: is_op("relax.exp")(const(1.0)), "1.0f", "of `float x`"),
        ("noinput", lambda x, const: is_op("relax.exp")(const(1.0)), "x", "never uses x"),
        ("two", quick_gelu_pattern, "x; x", "one C.. expression"),
        ("broken", lambda x, const: 1 / 0, "x", "pattern builder of activation 'broken' failed"),
        ("notpat", lambda x, const: "x", "x", "must return a DFPattern"),
    ],
)
def test_bad_registrations_are_refused_with_the_reason(name, pattern, expression, message):
    with pytest.raises((ValueError, TypeError), match=message):
        register_activation(name, pattern, expression)
    assert registered_activations() == []


def test_registering_twice_needs_replace(quick_gelu):
    with pytest.raises(ValueError, match="replace=True"):
        register_activation("quick_gelu", quick_gelu_pattern, QUICK_GELU_CXX)
    register_activation("quick_gelu", quick_gelu_pattern, "x / (1.0f + __expf(-1.702f * x))", replace=True)
    assert "__expf" in emit_kernel(_gemm_kernel(80, Epilogue(bias=True, activation="quick_gelu"))).text


def test_dense_quick_gelu_is_fused_and_computes_the_same_on_cpu(quick_gelu):
    mod = dense_epilogue_model(64, 96, 80, activation="quick_gelu")
    mod = bind_weights(mod, random_weights(mod))
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod))
    (row,) = relax_cutlass.offload_report(rewritten, arch="sm_80").offloaded
    assert row["epilogue"] == "bias+quick_gelu"


def test_conv2d_quick_gelu_residual_is_fused_and_computes_the_same_on_cpu(quick_gelu):
    mod = conv2d_epilogue_model(2, 8, 8, 16, 16, activation="quick_gelu", residual=True, residual_relu=True)
    mod = bind_weights(mod, random_weights(mod))
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod))
    (row,) = relax_cutlass.offload_report(rewritten, arch="sm_80").offloaded
    assert row["op"] == "conv2d" and row["epilogue"] == "bias+quick_gelu+residual_add+relu"


def test_a_different_constant_is_not_fused_and_the_report_says_why(quick_gelu):
    mod = dense_epilogue_model(64, 96, 80, activation=functools.partial(models.quick_gelu, scale=1.5))
    mod = bind_weights(mod, random_weights(mod))
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod))
    report = relax_cutlass.offload_report(rewritten)
    assert [r["epilogue"] for r in report.offloaded] == ["bias"]  # the GEMM + bias still offloads
    (row,) = report.not_fused
    # FoldConstant pre-transposed the bound weight: the root is a plain matmul.
    assert row["refused"][0]["pattern"] == "relax_cutlass.matmul_bias_quick_gelu"
    assert row["fused_as"] == "relax_cutlass.matmul_bias"
    assert row["root"].endswith("= relax.matmul((64, 80) x (80, 96))")
    assert "quick_gelu.const0=1.5 is not 1.702" in str(report)


def _gemm_kernel(arch: int, epilogue: Epilogue):
    return choose_kernel(GemmProblem(m=256, n=128, k=64, b_transposed=True), epilogue, arch)


@pytest.mark.parametrize(
    "arch,residual",
    [(80, {}), (80, dict(residual=True, residual_activation="relu")), (90, {}), (90, dict(residual=True))],
)
def test_every_gemm_kernel_family_defines_and_uses_the_functor(quick_gelu, arch, residual):
    text = emit_kernel(_gemm_kernel(arch, Epilogue(bias=True, activation=quick_gelu, **residual))).text
    definition = text.index("struct RelaxCutlassActivation_quick_gelu {")
    use = text.index("RelaxCutlassActivation_quick_gelu,") if arch == 80 else text.index("Activation_quick_gelu, float")
    assert definition < use and QUICK_GELU_CXX in text


@pytest.mark.parametrize("residual", [False, True])
def test_conv2d_kernels_define_and_use_the_functor(quick_gelu, residual):
    problem = Conv2dProblem(n=2, h=8, w=8, c=16, k=16, r=3, s=3, p=8, q=8, pad=(1, 1))
    epilogue = Epilogue(bias=True, activation="quick_gelu", residual=residual)
    kernel, _ = choose_conv2d_kernel(problem, epilogue, 80)
    text = emit_kernel(kernel).text
    assert text.index("struct RelaxCutlassActivation_quick_gelu {") < text.index("RelaxCutlassActivation_quick_gelu,")


def test_builtin_kernels_carry_no_custom_definitions(quick_gelu):
    text = emit_kernel(_gemm_kernel(80, Epilogue(bias=True, activation="gelu"))).text
    assert "RelaxCutlassActivation_" not in text


@pytest.mark.nvcc
def test_check_activation_compiles_the_expression_and_compares(quick_gelu):
    assert check_activation(quick_gelu, quick_gelu_reference) < 1e-5
    with pytest.raises(ActivationCheckError, match=r"at x=.*the reference"):
        check_activation(quick_gelu, lambda x: x / (1 + np.exp(-1.7 * x)))


@pytest.mark.nvcc
def test_check_activation_reports_expressions_that_do_not_compile():
    from relax_cutlass.toolkit.compile import CompileError

    register_activation("typo", lambda x, const: is_op("relax.exp")(x), "expff(x)")
    try:
        with pytest.raises(CompileError, match="expff"):
            check_activation("typo", np.exp)
    finally:
        unregister_activation("typo")
