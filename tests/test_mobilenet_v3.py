"""MobileNetV3 (torch.export, NHWC float16): TVM's CUDA build of the squeeze-excitation scale.

TVM 0.27 fails to build `scale * x` when `scale` comes out of a conv2d: FuseOps fuses the
broadcasting multiply into the conv's kernel and DLight's Matmul rule asserts (see
relax_cutlass/broadcasts.py). These tests build, for cuda sm_90a (no GPU needed, no CUTLASS kernel
compiled), the graph that failed, in both forms a benchmark builds: TVM's own build of the model
(`tvm_baseline`) and what relax_cutlass leaves to TVM, and check on the CPU that the rewrite keeps
the values.
"""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.op import add, astype, divide, maximum, mean, minimum, multiply, nn

import relax_cutlass
from relax_cutlass.prepare import bind_float16, tvm_baseline
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import build_cpu, op_names, random_inputs, run_vm
from relax_cutlass.transform import MakeGemmBroadcastsExplicit

torch_models = pytest.importorskip(
    "relax_cutlass.testing.models.torch_models", reason="needs the 'models' extra (torch)"
)

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")
# mobilenet_v3_large's 4th and 5th blocks: squeeze-excitation after a stride-2 depthwise conv, then
# with a residual add; the stem, last conv and classifier bring hardswish.
BLOCKS = ((5, 72, 40, True, "RE", 2), (5, 120, 40, True, "RE", 1))


@pytest.fixture(scope="module")
def mobilenet():
    """-> (bound NHWC float16 module, input, PyTorch's float32 output). Batch 2: at batch 1 the
    squeeze-excitation convs have one row, the Matmul rule does not apply to them and the failure
    does not show."""
    import torch

    model = torch_models.mobilenet_v3(width_mult=0.25, blocks=BLOCKS)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 32, 32)).astype("float32")
    mod = bind_float16(*torch_models.import_exported(model, (torch.from_numpy(x),)))
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    return mod, x, expected


def test_the_builder_is_torchvisions_mobilenet_v3_large():
    """Same parameter count as torchvision.models.mobilenet_v3_large() (5,483,032)."""
    model = torch_models.mobilenet_v3()
    assert sum(p.numel() for p in model.parameters()) == 5_483_032


def test_tvm_alone_fails_on_the_squeeze_excitation_scale(mobilenet):
    """The regression's premise, in TVM 0.27: its default CUDA build of the graph fails. When a TVM
    upgrade makes this pass, MakeGemmBroadcastsExplicit can go."""
    with pytest.raises(Exception, match="not properly inlined"):
        tvm.compile(mobilenet[0], CUDA)


def test_tvm_baseline_builds_and_computes_the_model(mobilenet):
    mod, x, expected = mobilenet
    baseline = tvm_baseline(mod)
    # One explicit broadcast per squeeze-excitation block, nothing else changed.
    assert op_names(baseline).count("relax.broadcast_to") == 2
    assert sorted(n for n in op_names(baseline) if n != "relax.broadcast_to") == sorted(op_names(mod))
    tvm.compile(baseline, CUDA)
    assert rel_error(run_vm(build_cpu(baseline), [x]), expected) < 1e-2  # float16 vs PyTorch's float32


def test_offloaded_module_builds(mobilenet):
    """The pipeline offloads every squeeze-excitation conv, so the failing form never reaches TVM
    here; what it leaves to TVM (hardswish, pooling, the squeeze-excitation multiply, the RGB
    stem's channel pad) builds for sm_90a."""
    offloaded = relax_cutlass.offload_pipeline("sm_90a", compile=False)(mobilenet[0])
    report = relax_cutlass.offload_report(offloaded)
    assert sum(r["op"] == "conv2d" and r["mnk"][0] == 2 for r in report.offloaded) == 4  # M = batch
    # every conv: the depthwise ones and the RGB stem (its 3 channels padded to 8) too
    assert not report.left_in_tvm, str(report)
    assert any(r["op"] == "dwconv2d" for r in report.offloaded)
    assert any(r["op"] == "conv2d" and r["shapes"]["data"][-1] == 8 for r in report.offloaded)
    assert "relax.broadcast_to" not in op_names(offloaded)
    tvm.compile(offloaded, CUDA)


def _squeeze_excitation(channels: int, squeeze: int, batch: int | str = 2, size: int = 8) -> tvm.IRModule:
    """x * hardsigmoid(conv(relu(conv(mean(x))))), NHWC float16 with constant weights."""
    rng = np.random.default_rng(0)

    def const(*shape):
        return relax.const(rng.uniform(-1, 1, shape).astype("float16"))

    bb = relax.BlockBuilder()
    n = tvm.tirx.Var(batch, "int64") if isinstance(batch, str) else batch
    x = relax.Var("x", relax.TensorType([n, size, size, channels], "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pooled = bb.emit(mean(bb.emit(astype(x, "float32")), axis=[1, 2], keepdims=True))
            pooled = bb.emit(astype(pooled, "float16"))
            conv = {"data_layout": "NHWC", "kernel_layout": "OHWI"}
            h = bb.emit(nn.conv2d(pooled, const(squeeze, 1, 1, channels), **conv))
            h = bb.emit(nn.relu(bb.emit(add(h, const(1, 1, 1, squeeze)))))
            s = bb.emit(add(bb.emit(nn.conv2d(h, const(channels, 1, 1, squeeze), **conv)), const(1, 1, 1, channels)))
            s = bb.emit(maximum(bb.emit(add(s, relax.const(3.0, "float16"))), relax.const(0.0, "float16")))
            s = bb.emit(divide(bb.emit(minimum(s, relax.const(6.0, "float16"))), relax.const(6.0, "float16")))
            out = bb.emit_output(bb.emit(multiply(x, s)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("batch", [2, "n"])
def test_pipeline_rewrites_a_broadcast_conv_it_leaves_in_tvm(batch):
    """Odd channel counts keep both squeeze-excitation convs in TVM: the pipeline's last pass makes
    their broadcast explicit, so the module still builds (a symbolic batch too), and the values
    stay."""
    mod = _squeeze_excitation(channels=9, squeeze=3, batch=batch)
    with pytest.raises(Exception, match="not properly inlined"):
        tvm.compile(mod, CUDA)
    offloaded = relax_cutlass.offload_pipeline("sm_90a", compile=False)(mod)
    assert not relax_cutlass.offload_report(offloaded).offloaded
    assert op_names(offloaded).count("relax.broadcast_to") == 1
    tvm.compile(offloaded, CUDA)
    inputs = random_inputs(mod, n=3)
    # the convs left in TVM sum in float32 now (AccumulateInFloat32), so the reference does too
    expected = run_vm(build_cpu(relax_cutlass.transform.AccumulateInFloat32()(mod)), inputs)
    assert rel_error(run_vm(build_cpu(offloaded), inputs), expected) < 1e-6


def _module(params, body) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def test_broadcasts_not_fed_by_a_gemm_are_left_alone():
    """Bias adds, a broadcast of a pooled (not convolved) tensor, and leading unit dims (which move
    no element) are not the failing form."""
    x = relax.Var("x", relax.TensorType([2, 4, 4, 8], "float16"))
    pooled_only = _module([x], lambda bb, x: bb.emit(multiply(x, bb.emit(mean(x, axis=[1, 2], keepdims=True)))))
    a, r = relax.Var("a", relax.TensorType([4, 8], "float16")), relax.Var("r", relax.TensorType([1, 4, 16], "float16"))
    w = relax.const(np.ones((8, 16), "float16"))
    unit_dims = _module([a, r], lambda bb, a, r: bb.emit(add(bb.emit(relax.op.matmul(a, w)), r)))
    for mod in (pooled_only, unit_dims):
        assert MakeGemmBroadcastsExplicit()(mod).same_as(mod)
    rewritten = MakeGemmBroadcastsExplicit()(_squeeze_excitation(channels=16, squeeze=8))
    assert op_names(rewritten).count("relax.broadcast_to") == 1  # the scale; not the two bias adds
