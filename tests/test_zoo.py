"""The zoo's checks themselves (relax_cutlass.testing.zoo and .errors), on the CPU: a check that
cannot fail is a defect."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from relax_cutlass.testing import zoo
from relax_cutlass.testing.errors import rel_error


def test_an_all_zero_reference_is_not_a_pass():
    """torchvision's vit_b_16 zero-initializes its head: every build matched its all-zero output
    exactly (error 0.0 in a GPU run), which checked nothing."""
    assert np.isnan(rel_error(np.zeros(4), np.zeros(4)))
    assert np.isnan(rel_error(np.ones(3), np.ones(4)))
    assert rel_error(np.array([1.0, np.nan]), np.ones(2)) == float("inf")
    assert rel_error(np.array([1.0, 1.1]), np.ones(2)) == pytest.approx(0.1 / np.sqrt(2))


def test_zero_initialized_linear_layers_get_random_weights():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    torch.nn.init.zeros_(model[2].weight)
    torch.nn.init.zeros_(model[2].bias)
    kept = model[0].weight.detach().clone()
    zoo.randomize_zero_layers(model, torch)
    assert model[2].weight.detach().abs().sum() > 0
    assert torch.equal(model[0].weight.detach(), kept)


def test_error_bound_and_the_table_say_not_ok():
    assert zoo.error_bound(1e-3) == 1e-2
    assert zoo.error_bound(3e-2) == pytest.approx(4.5e-2)
    record = {
        "model": "m",
        "batch": 1,
        "seq": 0,
        "ok": False,
        "ms": {"relax_cutlass": 1.0, "tvm_default": 2.0, "torch_eager": 3.0},
        "error": {"torch_fp16_vs_fp64": 1e-3, "relax_cutlass_vs_torch_fp64": 5e-2},
        "report": {"offloaded_calls": 1, "left_in_tvm": 0, "flop_fraction": 1.0},
    }
    row = zoo.table([record]).splitlines()[-1]
    assert "5.0e-02 (1.0e-03) NOT OK" in row and "2.00x" in row


def test_zoo_profile_option_names_the_models_it_tunes():
    assert zoo.profile_for("resnet50", "auto") == "auto"
    assert zoo.profile_for("resnet50", "never") == "never"
    assert zoo.profile_for("resnet50", "auto:resnet50+convnext_tiny") == "auto"
    assert zoo.profile_for("vit_b_16", "auto:resnet50+convnext_tiny") == "never"


def test_an_all_zero_reference_matches_only_an_exact_zero():
    """A generated graph may compute y - y: its all-zero result is right, and only an all-zero one."""
    from relax_cutlass.testing.errors import within

    assert within(np.zeros(4), np.zeros(4), 1e-6)
    assert not within(np.full(4, 1e-30), np.zeros(4), 1e-6)
    assert not within(np.ones(3), np.ones(4), 1e-6)
    assert within(np.array([1.0, 1.0 + 1e-9]), np.ones(2), 1e-6)


def test_an_onnx_entry_builds_its_torch_model_and_imports_it_through_onnx(tmp_path):
    """The zoo's `<model>_onnx` entries time from_onnx's import of the same torch model beside its
    from_torch build: same model, same regions (on a small conv net here; the zoo's are full size)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript")
    import relax_cutlass
    from relax_cutlass.testing.harness import offload_for_cpu

    onnx_entry = next(e for e in zoo.ZOO if e.name == "resnet50_onnx")
    assert onnx_entry.model == "resnet50" and next(e for e in zoo.ZOO if e.name == "resnet50").model == "resnet50"
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 1)).eval()
    example = (torch.randn(2, 8, 12, 12),)
    rows = []
    for entry in (onnx_entry, zoo.ZooModel("resnet50", "vision", 2)):
        _, rewritten = offload_for_cpu(entry.import_module(net, example, tmp_path))
        report = relax_cutlass.offload_report(rewritten)
        rows.append(sorted((r["op"], r["kernel"], r["calls"]) for r in report.offloaded))
    assert rows[0] == rows[1] and len(rows[0]) == 2, rows
    assert (tmp_path / "resnet50_onnx.onnx").exists()


@pytest.mark.parametrize("ms, calls", [(2.0, 10), (5.0, 4), (73.0, 1), (0.1, 10), (0.0, 10)])
def test_a_timing_sample_takes_about_twenty_milliseconds_of_calls(ms, calls):
    """bench/zoo.py's samples: ten calls of a fast model, one of a slow build (TVM's default build
    of an 8B-shaped Llama takes 73 ms a call: a hundred of them per sample was most of its row)."""
    from relax_cutlass.testing.gpu_common import calls_per_sample

    assert calls_per_sample(ms) == calls


def test_the_float64_reference_of_a_left_padded_eager_decoder_is_finite():
    """A left-padded Llama batch under eager attention (gemma2_left_padded in the zoo): in float64
    transformers' mask minimum, added to the causal one, overflows to -inf and the fully masked rows
    come out NaN, which made every build's error NaN; those values come from float32, every other
    from float64 itself."""
    torch = pytest.importorskip("torch")
    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    model = last_hidden_state(small_transformer("llama", "eager", layers=1))
    ids = torch.randint(0, 512, (2, 24))
    mask = torch.ones(2, 24, dtype=torch.int64)
    mask[1, :8] = 0
    with torch.no_grad():
        wide = model.float()(ids, mask).numpy()
        plain = copy.deepcopy(model).double()(ids, mask).numpy()
    lost = ~np.isfinite(plain)
    assert lost.any(), "float64 no longer loses the fully masked rows: the fallback checks nothing"
    ref = zoo.float64_reference(model, (ids, mask))
    assert np.isfinite(ref).all() and np.array_equal(ref[~lost], plain[~lost])
    assert np.allclose(ref[lost], wide[lost])
    assert next(model.parameters()).dtype == torch.float32  # the model is left as it is
