"""relax_cutlass.from_onnx on models exported with torch.onnx (TorchScript exporter, opset 17):
imported, lowered as from_torch lowers, offloaded, and checked against torch on the CPU."""

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


def _export(model, args, path, names) -> str:
    torch.onnx.export(model, args, str(path), opset_version=17, dynamo=False, input_names=names)
    return str(path)


def _offloaded_matches(mod, inputs: list[np.ndarray], want: np.ndarray, tolerance: float):
    """The module and its offloaded form (externs served by their composites) both match `want`."""
    assert rel_error(run_vm(build_cpu(mod), inputs), want) < tolerance
    partitioned, rewritten = offload_for_cpu(mod)
    serve_regions_on_cpu(partitioned)
    assert rel_error(run_vm(build_cpu(rewritten), inputs), want) < tolerance
    return relax_cutlass.offload_report(rewritten)


def _bert_export(tmp_path, layers: int = 2):
    """transformers' BERT (random init) given an attention_mask with one padded row, exported; ->
    (path, inputs, torch's float64-compared output)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=128, vocab_size=100
    )
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 10:] = 0
    with torch.no_grad():
        want = LastHidden()(ids, mask).double().numpy()
    return _export(LastHidden(), (ids, mask), tmp_path / "bert.onnx", ["ids", "mask"]), [ids, mask], want


def test_bert_with_an_attention_mask_imports_offloads_and_matches_torch(tmp_path):
    """transformers' BERT given an attention_mask: its export holds ConstantOfShape nodes of an empty
    shape, which TVM's ONNX frontend alone cannot import (fold_constant_of_shape), and its attention
    ends in the safe softmax as torch.onnx writes it, where(isnan(p), 0, p). Every GEMM, layer norm
    and attention is offloaded, the padding mask read by the kernel as its bias; the kernel's own
    model of each region, fully masked rows included, matches the region."""
    from tvm.relax.frontend.onnx import from_onnx

    path, (ids, mask), want = _bert_export(tmp_path)
    with pytest.raises(Exception, match="broadcast_to"):  # what TVM's import alone does
        from_onnx(onnx.load(path), keep_params_in_input=False)
    mod = relax_cutlass.from_onnx(path)
    report = _offloaded_matches(mod, [ids.numpy(), mask.numpy()], want, 2e-2)
    gemms = sum(r["calls"] for r in report.offloaded if r["op"] == "matmul")
    assert gemms == 2 * 4, str(report)  # per layer: q|k|v packed into one GEMM, output, two FFN
    assert sum(r["calls"] for r in report.offloaded if r["op"] == "matmul" and r["mnk"][1] == 192) == 2
    assert sum(r["calls"] for r in report.offloaded if r["op"] == "norm") == 2 * 2 + 1, str(report)
    attention = [r for r in report.offloaded if r["op"] == "attention"]
    assert sum(r["calls"] for r in attention) == 2 and not report.left_in_tvm, str(report)
    assert all(r["attention"]["masked_rows"] == "zero" for r in attention), attention
    partitioned, _ = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned) == len(attention)


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


def test_a_small_cnn_imports_nhwc_and_offloads_every_conv(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1, bias=False),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 32),
    ).eval()
    x = torch.randn(2, 8, 12, 12)
    with torch.no_grad():
        want = net(x).double().numpy()
    mod = relax_cutlass.from_onnx(_export(net, (x,), tmp_path / "cnn.onnx", ["x"]))
    report = _offloaded_matches(mod, [x.numpy()], want, 2e-2)
    assert sum(r["calls"] for r in report.offloaded if r["op"] == "conv2d") == 2, str(report)
    assert not [r for r in report.left_in_tvm if r["op"] == "conv2d"], str(report)


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


def test_gpt2_imports_offloads_and_matches_torch(tmp_path):
    """torch.onnx's GPT-2 builds its causal mask as tril of a constant with a PrimValue diagonal
    offset, which TVM 0.27's ToMixedPrecision cannot type ("Expected TensorType, but got T.int64"):
    from_onnx folds such input-free subgraphs first. Every GEMM and both attentions are offloaded."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=100)).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt2 = gpt2

        def forward(self, ids):
            return self.gpt2(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 100, (1, 16))
    with torch.no_grad():
        want = LastHidden()(ids).double().numpy()
    mod = relax_cutlass.from_onnx(_export(LastHidden(), (ids,), tmp_path / "gpt2.onnx", ["ids"]))
    report = _offloaded_matches(mod, [ids.numpy()], want, 2e-2)
    attention = [r for r in report.offloaded if r["op"] == "attention"]
    assert sum(r["calls"] for r in attention) == 2 and not report.left_in_tvm, str(report)
    partitioned, _ = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned) == len(attention)


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
