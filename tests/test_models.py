"""Real models through real frontends: ResNet-50 written in PyTorch, torch.export, Relax, offload."""

import pytest
import tvm
from harness import compare_on_cpu, random_inputs
from tvm import relax

import relax_cutlass
from relax_cutlass.models import bind_float16

torch_models = pytest.importorskip("relax_cutlass.torch_models", reason="needs the 'models' extra (torch)")


@pytest.fixture(scope="module")
def resnet50():
    """The whole ResNet-50 (all 53 convolutions), at a 32x32 image to keep the CPU run short."""
    mod, weights = torch_models.resnet50_module(batch=1, image=32)
    return bind_float16(mod, weights)


def test_resnet50_offloads_every_conv_but_the_rgb_stem(resnet50):
    _, _, rewritten = compare_on_cpu(resnet50, random_inputs(resnet50))
    report = relax_cutlass.offload_report(rewritten)
    convs = [r for r in report.offloaded if r["op"] == "conv2d"]
    assert len(convs) == 52  # 53 convolutions; the stem (C=3) stays in TVM
    # Every bottleneck's last conv carries the block's residual add and relu; batch norm is folded
    # into each conv's bias.
    assert sum(r["epilogue"] == "bias+residual_add+relu" for r in convs) == 16
    assert {r["epilogue"] for r in convs} == {"bias", "bias+relu", "bias+residual_add+relu"}
    assert [r["op"] for r in report.offloaded if r["op"] != "conv2d"] == ["matmul"]  # the classifier
    (stem,) = report.left_in_tvm
    assert stem["op"] == "conv2d" and "C=3" in stem["reasons"][0]


def _op_names(func):
    names = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            names.append(e.op.name)

    relax.analysis.post_order_visit(func.body, visit)
    return names


def test_resnet50_has_no_layout_change_between_offloaded_convs(resnet50):
    """NCHW in, NHWC throughout: one transpose of the input, one of the pooled features."""
    offloaded = relax_cutlass.offload_pipeline("sm_80", compile=False)(resnet50)
    ops = _op_names(offloaded["main"])
    assert ops.count("relax.permute_dims") + ops.count("relax.layout_transform") == 2
    assert "relax.nn.batch_norm" not in ops
