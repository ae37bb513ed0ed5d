"""The sigmoid-based 16-bit activations (epilogue.SIGMOID16_FORMS, templates.SIGMOID16_FUNCTOR):
silu, sigmoid and tanh-GELU as rcp(1 + 2^(-z log2 e)). Their accuracy over every finite fp16 input
(and a bfloat16 sweep), the C++ that computes them, and which kernels use them."""

import math

import numpy as np
import pytest

from relax_cutlass.kinds.epilogue import ACTIVATIONS, SIGMOID16_FORMS, Epilogue
from relax_cutlass.kinds.gemm.records import GemmKernel, GemmProblem
from relax_cutlass.kinds.gemm.select import candidate_tiles_sm90, choose_kernel
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing import gelu16

LOG2E = np.float32(1.44269504)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _sigmoid64(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


EXACT = {
    "silu": lambda x: x * _sigmoid64(x),
    "sigmoid": _sigmoid64,
    # 0.5 x (1 + tanh(u)) written as x * sigmoid(2u): no cancellation in the float64 reference
    "gelu_tanh": lambda x: x * _sigmoid64(2.0 * SQRT_2_OVER_PI * (x + 0.044715 * x**3)),
}


def _emulated(base: str, x: np.ndarray) -> np.ndarray:
    """The functor's float32 arithmetic: each step rounded to float32 (ex2.approx and rcp.approx are
    within 2^-22 of the exact values, well inside the margins below), results under 2^-126 flushed."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if base == "gelu_tanh":
            square = (x * x).astype(np.float32)
            z = x * (square.astype(np.float64) * np.float32(0.0713548162) + np.float32(1.59576912)).astype(np.float32)
        else:
            z = x
        e = np.exp2((z.astype(np.float32) * -LOG2E).astype(np.float64)).astype(np.float32)
        s = (1.0 / (np.float32(1.0) + e).astype(np.float64)).astype(np.float32)
        s = np.where(np.abs(s) < 2.0**-126, np.float32(0), s)
        result = s if base == "sigmoid" else (x * s).astype(np.float32)
    return np.where(np.abs(result) < 2.0**-126, np.float32(0), result)


@pytest.mark.parametrize("base", sorted(SIGMOID16_FORMS))
def test_within_one_fp16_ulp_for_every_fp16_input(base):
    x = gelu16.finite_fp16()
    exact = EXACT[base](x.astype(np.float64))
    got = _emulated(base, x)
    ulps = gelu16.fp16_ulps(got.astype(np.float16), exact.astype(np.float16))
    assert ulps.max() <= 1, (base, x[np.argmax(ulps)])
    relative = np.abs(got - exact) / np.maximum(np.abs(exact), gelu16.FP16_MIN_NORMAL)
    assert relative.max() < 2e-6, (base, x[np.argmax(relative)])


@pytest.mark.parametrize("base", sorted(SIGMOID16_FORMS))
def test_relative_accuracy_over_the_bfloat16_range(base):
    """bfloat16 reaches 3e38: the tails keep their relative precision down to the flush at 2^-126
    (tanh-GELU's argument grows as x^3, so its float32 rounding costs a few 1e-6 near x = -7; a
    bfloat16 ulp is 4e-3)."""
    bits = np.arange(0, 1 << 16, 7, dtype=np.uint32) << 16
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    exact = EXACT[base](x.astype(np.float64))
    got = _emulated(base, x).astype(np.float64)
    kept = np.abs(exact) >= 2.0**-120
    relative = np.abs(got[kept] - exact[kept]) / np.abs(exact[kept])
    assert relative.max() < 1e-5, (base, x[kept][np.argmax(relative)])
    assert np.all(np.abs(got[~kept]) <= 2.0**-119)


def test_forms_follow_the_output_type():
    for base, (name, functor, *_) in SIGMOID16_FORMS.items():
        activation = ACTIVATIONS[base]
        narrow = activation.for_output("float16")
        assert narrow is activation.for_output("bfloat16") and (narrow.name, narrow.functor) == (name, functor)
        assert activation.for_output("float32") is activation and activation.functor.startswith("cutlass::")


@pytest.mark.parametrize("element_out", ["float16", "float32"])
def test_gated_mlp_kernels_define_the_form_of_their_output(element_out):
    tile = candidate_tiles_sm90("float32", "float16")[0]
    problem = GemmProblem(m=256, n=128, k=64, b_transposed=True, element_out=element_out)
    epilogue = Epilogue(activation="silu", residual=True, residual_op="multiply")
    sm90 = emit_kernel(GemmKernel(problem, epilogue, tile, arch=90, target=90)).text
    sm80 = emit_kernel(choose_kernel(problem, epilogue, 80)).text
    narrow = element_out == "float16"
    for text in (sm90, sm80):
        assert ("RelaxCutlassSilu16" in text) == narrow
        assert ("cutlass::epilogue::thread::SiLu" in text) != narrow
        assert text.count("struct RelaxCutlassSilu16 {") == int(narrow)


@pytest.mark.nvcc
def test_cpp_functors_match_the_emulation():
    """The C++ host path (exp2f and a division instead of the approx instructions; the device path
    compiled for sm_90a) gives the emulated values, elementwise and in the Array form."""
    from relax_cutlass.extend import evaluate_functor

    x = gelu16.finite_fp16()[::5]
    for base in sorted(SIGMOID16_FORMS):
        got = evaluate_functor(ACTIVATIONS[base].narrow, x, arch="sm_90a")
        want = _emulated(base, x).astype(np.float64)
        np.testing.assert_allclose(got, np.stack([want, want], axis=1), rtol=1e-6, atol=1e-30, err_msg=base)
