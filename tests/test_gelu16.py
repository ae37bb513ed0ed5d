"""The 16-bit GELU (kernel_spec.GELU16_LOG2_TAIL, templates.GELU16_FUNCTOR): its accuracy over every
finite fp16 input, the fit that produced it, the C++ that computes it, and which kernels use it."""

import numpy as np
import pytest

from relax_cutlass.kinds.conv2d.records import Conv2dProblem
from relax_cutlass.kinds.conv2d.select import choose_conv2d_kernel
from relax_cutlass.kinds.epilogue import ACTIVATIONS, GELU16_LOG2_TAIL, Epilogue
from relax_cutlass.kinds.gemm.records import GemmKernel, GemmProblem
from relax_cutlass.kinds.gemm.select import candidate_tiles_sm90, choose_kernel
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing import gelu16


def test_within_one_fp16_ulp_of_gelu_for_every_fp16_input():
    report = gelu16.fp16_error_report(GELU16_LOG2_TAIL)
    assert report["inputs"] == 63488
    assert report["max_ulps"] == 1, report
    # Relative to max(|gelu|, fp16 min normal): a sixth of an fp16 ulp at worst.
    assert report["max_relative_error"] < 1e-4, report
    assert report["differing"] < 0.05 * report["inputs"], report


def test_far_inputs_and_zero():
    x = np.array([-1e30, -100.0, -20.0, -8.0, -0.0, 0.0, 8.0, 100.0, 1e30], dtype=np.float32)
    got = gelu16.gelu16_emulated(x, GELU16_LOG2_TAIL)
    np.testing.assert_allclose(got, gelu16.gelu_exact(x), rtol=1e-6, atol=1e-14)
    assert np.isnan(gelu16.gelu16_emulated(np.array([np.nan], np.float32), GELU16_LOG2_TAIL)).all()


def test_coefficients_are_the_fit_the_script_makes():
    fitted = gelu16.fit().astype(np.float32)
    np.testing.assert_array_equal(fitted, np.array(GELU16_LOG2_TAIL, dtype=np.float32))


def test_gelu_form_follows_the_output_type():
    gelu = ACTIVATIONS["gelu"]
    assert gelu.for_output("float16") is gelu.for_output("bfloat16") is gelu.narrow
    assert gelu.for_output("float32") is gelu and gelu.functor == "cutlass::epilogue::thread::GELU"
    assert ACTIVATIONS["relu"].for_output("float16") is ACTIVATIONS["relu"]


@pytest.mark.parametrize("element_out", ["float16", "float32"])
def test_kernels_define_and_use_the_form_of_their_output(element_out):
    tile = candidate_tiles_sm90("float32", "float16")[0]
    problem = GemmProblem(m=256, n=128, k=64, b_transposed=True, element_out=element_out)
    epilogue = Epilogue(bias=True, activation="gelu", residual=True, residual_activation="relu")
    sm90 = emit_kernel(GemmKernel(problem, epilogue, tile, arch=90, target=90)).text
    sm80 = emit_kernel(choose_kernel(problem, epilogue, 80)).text
    narrow = element_out == "float16"
    for text in (sm90, sm80):
        assert ("RelaxCutlassGelu16" in text) == narrow
        assert ("cutlass::epilogue::thread::GELU," in text or "cutlass::epilogue::thread::GELU>" in text) != narrow
        assert text.count("struct RelaxCutlassGelu16 {") == int(narrow)


def test_conv_kernels_use_the_16bit_form():
    problem = Conv2dProblem(n=1, h=14, w=14, c=64, k=64, r=3, s=3, p=14, q=14, pad=(1, 1))
    kernel, _ = choose_conv2d_kernel(problem, Epilogue(bias=True, activation="gelu"), 80)
    assert "RelaxCutlassGelu16" in emit_kernel(kernel).text


@pytest.mark.nvcc
def test_cpp_functor_matches_the_emulation():
    """The C++ (host path, exp2f instead of ex2.approx; the device path compiled for sm_90a) gives
    the emulated values, elementwise and in the Array form the epilogues call."""
    from relax_cutlass.extend import evaluate_functor

    x = gelu16.finite_fp16()
    got = evaluate_functor(ACTIVATIONS["gelu"].narrow, x, arch="sm_90a")
    want = gelu16.gelu16_emulated(x, GELU16_LOG2_TAIL).astype(np.float64)
    np.testing.assert_allclose(got, np.stack([want, want], axis=1), rtol=1e-6, atol=1e-30)
