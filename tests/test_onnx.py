"""relax_cutlass.from_onnx on models exported with both of torch.onnx's exporters (TorchScript, opset
17; dynamo, opset 18): imported, lowered as from_torch lowers, offloaded with the regions
from_torch's import of the same model gets, and checked against onnxruntime on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.onnx_frontend import fold_constant_of_shape
from relax_cutlass.testing.attention import check_regions_against_kernel_model
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import build_cpu, offload_for_cpu, run_vm, serve_regions_on_cpu

onnx = pytest.importorskip("onnx", reason="needs the 'models' extra (onnx)")
torch = pytest.importorskip("torch", reason="needs the 'models' extra (torch)")


def _export(model, args, path, names, exporter: str = "torchscript") -> str:
    dynamo = exporter == "dynamo"
    if dynamo:
        pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnxscript")
    torch.onnx.export(model, args, str(path), opset_version=18 if dynamo else 17, dynamo=dynamo, input_names=names)
    return str(path)


def _offloaded_matches(mod, inputs: list[np.ndarray], want: np.ndarray, tolerance: float):
    """The module and its offloaded form (externs served by their composites) both match `want`."""
    assert rel_error(run_vm(build_cpu(mod), inputs), want) < tolerance
    partitioned, rewritten = offload_for_cpu(mod)
    serve_regions_on_cpu(partitioned)
    assert rel_error(run_vm(build_cpu(rewritten), inputs), want) < tolerance
    return relax_cutlass.offload_report(rewritten)


def _nonzero_biases(model):
    """transformers and nn.MultiheadAttention initialize biases to zero, and torch.onnx's dynamo
    export drops an add of zeros (a GEMM then has no bias epilogue where from_torch's has one):
    biases as a trained model's."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") and not param.any():
                param.normal_(0.0, 0.02)
    return model


def _transformer(family: str, batch: int = 1, padded: bool = False):
    """A tiny random-init transformers model (`tiny_model`): (model, inputs, input names); `padded`:
    given an attention_mask whose second row ends in padding."""
    transformers = pytest.importorskip("transformers")
    from relax_cutlass.testing.models.torch_transformers import TINY_VOCAB, tiny_model

    torch.manual_seed(0)
    model = _nonzero_biases(tiny_model(family, torch, transformers))
    ids = torch.randint(0, TINY_VOCAB, (batch, 16))
    if not padded:
        return model, (ids,), ["ids"]
    mask = torch.ones(batch, 16, dtype=torch.int64)
    mask[1, 10:] = 0
    return model, (ids, mask), ["ids", "mask"]


def _vision(name: str):
    from relax_cutlass.testing.models import torch_models

    torch.manual_seed(0)
    model = {
        "vit": lambda: torch_models.vit(image=32, patch=8, hidden=64, layers=2, heads=4),
        "resnet": lambda: torch_models.resnet50(num_classes=10, width=16, blocks=(1, 1, 1, 1)),
        "convnext": lambda: torch_models.convnext(num_classes=10, stages=((16, 32, 1), (32, None, 1))),
    }[name]()
    return _nonzero_biases(model), (torch.randn(2, 3, 32, 32),), ["x"]


MODELS = {
    "bert_padded": lambda: _transformer("bert", batch=2, padded=True),
    "gpt2": lambda: _transformer("gpt2"),
    "llama_gqa": lambda: _transformer("llama"),
    "vit": lambda: _vision("vit"),
    "resnet": lambda: _vision("resnet"),
    "convnext": lambda: _vision("convnext"),
}
# torch.onnx's TorchScript exporter refuses grouped-query sdpa ("conversion of
# scaled_dot_product_attention not implemented if enable_gqa is True"): Llama exports with dynamo only
# CI runs every model through torch's default exporter (dynamo) and BERT through both; the other
# TorchScript exports are the slow marker's (pytest -m slow; the GPU host's check runs them).
# CI runs one model of each form (a padded BERT through both exporters, a grouped-query Llama, a
# ConvNeXt's convs and norms); the further siblings run with -m slow.
DEFAULT_CASES = {
    ("bert_padded", "torchscript"),
    ("bert_padded", "dynamo"),
    ("llama_gqa", "dynamo"),
    ("convnext", "dynamo"),
}
CASES = [
    (m, e) if (m, e) in DEFAULT_CASES else pytest.param(m, e, marks=pytest.mark.slow)
    for m in MODELS
    for e in ("torchscript", "dynamo")
    if (m, e) != ("llama_gqa", "torchscript")
]


def _signature(report) -> list[tuple]:
    """What the offload report says of each region, without the names of functions; an attention's
    scale to 3 digits (torch.onnx scales q and k by sqrt(scale) each, which the 16-bit lowering
    rounds to float16: 0.17674 for 1/sqrt(32))."""

    def attention(row) -> str:
        fields = dict(row.get("attention", {}))
        if "scale" in fields:
            fields["scale"] = f"{fields['scale']:.3g}"
        # what a row whose every key is masked gives follows each graph's own mask: torch.export's
        # -inf and safe softmax give 0, the dynamo export's finfo.min the mean (no row of these
        # inputs is fully masked)
        fields.pop("masked_rows", None)
        return str(sorted(fields.items()))

    return sorted(
        (r["op"], r["epilogue"], tuple(r["mnk"]), r["kernel"], r["calls"], attention(r)) for r in report.offloaded
    ) + sorted(r["op"] for r in report.left_in_tvm)


@pytest.mark.parametrize("name, exporter", CASES)
def test_exported_models_offload_as_from_torch_and_match_onnxruntime(tmp_path, name, exporter):
    """Each model, exported as users export it, imports; the offloaded module (externs served by
    their composites) matches onnxruntime's run of the same file; the offload report holds the
    regions, kernels and attention forms of from_torch's import of the same model, with nothing
    left in TVM; and the kernel's own model of each attention region matches the region."""
    ort = pytest.importorskip("onnxruntime")
    model, args, names = MODELS[name]()
    path = _export(model, args, tmp_path / f"{name}.onnx", names, exporter)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = [a.numpy() for a in args]
    (want, *_) = session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs, strict=True)})
    mod = relax_cutlass.from_onnx(path)
    partitioned, rewritten = offload_for_cpu(mod)
    serve_regions_on_cpu(partitioned)
    assert rel_error(run_vm(build_cpu(rewritten), inputs), want) < 1e-2
    report = relax_cutlass.offload_report(rewritten)
    _, from_torch = offload_for_cpu(relax_cutlass.from_torch(model, args))
    assert _signature(report) == _signature(relax_cutlass.offload_report(from_torch)), str(report)
    assert not report.left_in_tvm, str(report)
    attention = [r for r in report.offloaded if r["op"] == "attention"]
    assert check_regions_against_kernel_model(partitioned) == len(attention)


def test_a_bfloat16_import_of_a_padded_bert_fuses_as_from_torch(tmp_path):
    """from_onnx(dtype="bfloat16") of the padded BERT (dynamo export, whose mask is finfo.min):
    the same regions and attention forms as from_torch's bfloat16 import, nothing left in TVM,
    and the offloaded module computes what TVM's build of it computes."""
    model, args, names = MODELS["bert_padded"]()
    model = model.to(torch.bfloat16).float()  # a bfloat16 checkpoint's weights
    mod = relax_cutlass.from_onnx(_export(model, args, tmp_path / "bert.onnx", names, "dynamo"), dtype="bfloat16")
    inputs = [a.numpy() for a in args]
    partitioned, rewritten = offload_for_cpu(mod)
    serve_regions_on_cpu(partitioned)
    assert rel_error(run_vm(build_cpu(rewritten), inputs), run_vm(build_cpu(mod), inputs)) < 1e-3
    report = relax_cutlass.offload_report(rewritten)
    assert not report.left_in_tvm and any(r["op"] == "attention" for r in report.offloaded), str(report)
    _, from_torch = offload_for_cpu(relax_cutlass.from_torch(model, args, dtype="bfloat16"))
    assert _signature(report) == _signature(relax_cutlass.offload_report(from_torch)), str(report)


def test_bert_with_an_attention_mask_needs_its_constant_of_shape_folded(tmp_path):
    """transformers' BERT given an attention_mask: its TorchScript export holds ConstantOfShape nodes
    of an empty shape, which TVM's ONNX frontend alone cannot import (fold_constant_of_shape). Every
    GEMM (q|k|v packed into one), layer norm and attention is offloaded, the padding mask read by
    the kernel as its bias, and a fully masked row gives 0 as torch.onnx's safe softmax does."""
    from tvm.relax.frontend.onnx import from_onnx

    model, args, names = _transformer("bert", batch=2, padded=True)
    path = _export(model, args, tmp_path / "bert.onnx", names)
    with pytest.raises(Exception, match="broadcast_to"):  # what TVM's import alone does
        from_onnx(onnx.load(path), keep_params_in_input=False)
    _, rewritten = offload_for_cpu(relax_cutlass.from_onnx(path))
    report = relax_cutlass.offload_report(rewritten)
    assert sum(r["calls"] for r in report.offloaded if r["op"] == "matmul") == 2 * 4, str(report)
    assert sum(r["calls"] for r in report.offloaded if r["op"] == "matmul" and r["mnk"][1] == 384) == 2
    attention = [r for r in report.offloaded if r["op"] == "attention"]
    assert sum(r["calls"] for r in attention) == 2 and not report.left_in_tvm, str(report)
    assert all(r["attention"]["masked_rows"] == "zero" for r in attention), attention


def test_a_nan_tail_that_fills_with_something_else_than_zero_stays_in_tvm():
    """where(isnan(p), 1, p) is no safe softmax the kernel computes: it stays in TVM, saying why."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((2, 2, 16, 32), "float16")) for n in "qkv")
    bias = relax.Var("bias", relax.TensorType((2, 1, 16, 16), "float16"))
    with bb.function("main", [q, k, v, bias]):
        with bb.dataflow():
            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            scores = bb.emit(relax.op.add(bb.emit(relax.op.matmul(q, kt)), bias))
            p = bb.emit(relax.op.nn.softmax(scores, axis=-1))
            p = bb.emit(relax.op.where(relax.op.isnan(p), relax.const(1.0, "float16"), p))
            out = bb.emit_output(bb.emit(relax.op.matmul(p, v)))
        bb.emit_func_output(out)
    _, rewritten = offload_for_cpu(bb.get())
    report = relax_cutlass.offload_report(rewritten)
    assert not [r for r in report.offloaded if r["op"] == "attention"], str(report)
    assert "filled with something else than 0" in str(report), str(report)  # the refused pattern's row


def test_constant_of_shape_of_an_empty_shape_becomes_a_scalar_constant():
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    shape = numpy_helper.from_array(np.zeros(0, np.int64), "empty")
    fill = numpy_helper.from_array(np.array([2.5], np.float32))
    nodes = [
        helper.make_node("ConstantOfShape", ["empty"], ["s"], value=fill),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
        initializer=[shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded = fold_constant_of_shape(model)
    assert [n.op_type for n in folded.graph.node] == ["Constant", "Add"]
    assert [n.op_type for n in model.graph.node] == ["ConstantOfShape", "Add"]  # the input is left alone
    mod = relax_cutlass.from_onnx(model, convert_layout=False)
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(run_vm(build_cpu(mod), [x]), x + 2.5)


def test_an_op_tvm_cannot_import_is_named_with_what_to_do():
    helper = onnx.helper
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], name="my_node")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(NotImplementedError, match=r"my_node \(NoSuchOp\).*export the model without that op"):
        relax_cutlass.from_onnx(model)


def test_a_node_tvm_fails_to_convert_is_named_with_what_to_do():
    """A converter that exists but fails (a Reshape to a shape of another size): the error names the
    node and its op type, not only TVM's message."""
    helper = onnx.helper
    shape = onnx.numpy_helper.from_array(np.array([7], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="bad_reshape")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [7])],
        initializer=[shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(RuntimeError, match=r"failed on node bad_reshape \(Reshape\) \(ValueError: Reshape expects"):
        relax_cutlass.from_onnx(model)


def test_bad_models_and_dtypes_get_clear_errors(tmp_path):
    with pytest.raises(TypeError, match="expected an onnx.ModelProto or a path to a .onnx file, got int"):
        relax_cutlass.from_onnx(42)
    with pytest.raises(FileNotFoundError, match="missing.onnx"):
        relax_cutlass.from_onnx(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="dtype 'int8' is not supported"):
        relax_cutlass.from_onnx(tmp_path / "missing.onnx", dtype="int8")


def test_a_named_batch_dimension_stays_symbolic_and_shapes_can_fix_it(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8, 10, 10)
    path = tmp_path / "dyn.onnx"
    torch.onnx.export(net, (x,), str(path), opset_version=17, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})  # fmt: skip
    mod = relax_cutlass.from_onnx(path)
    batch = mod["main"].params[0].ty.shape.values[0]
    assert not isinstance(batch, tvm.tirx.IntImm), mod["main"].params[0].ty
    x3 = torch.randn(3, 8, 10, 10)
    with torch.no_grad():
        want = net(x3).double().numpy()
    _offloaded_matches(mod, [x3.numpy()], want, 2e-2)
    fixed = relax_cutlass.from_onnx(path, shapes={"x": [3, 8, 10, 10]})
    assert [int(d) for d in fixed["main"].params[0].ty.shape.values] == [3, 8, 10, 10]


def test_a_failing_16_bit_lowering_gets_an_error_naming_the_stage(monkeypatch):
    from relax_cutlass import onnx_frontend

    def broken(*args, **kwargs):
        raise tvm.error.InternalError("Check failed: (tensor) is false: Expected TensorType, but got T.int64")

    monkeypatch.setattr(onnx_frontend, "to_float16", broken)
    helper = onnx.helper
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(RuntimeError, match="lowering the imported module to float16 failed .*import succeeded"):
        relax_cutlass.from_onnx(model)
