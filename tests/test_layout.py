"""ConvertToNHWC on graphs TVM's ConvertLayout trips over: a ViT, patch stems, squeeze/stack with
negative axes; and a layout failure that must leave the function in NCHW, reported, never raised."""

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.prepare import bind_float16
from relax_cutlass.rewrites.layout import LAYOUT_SKIPPED_ATTR, ConvertToNHWC, layout_skipped
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import build_cpu, compare_on_cpu, random_inputs, run_vm


def _conv_layouts(mod: tvm.IRModule) -> list[str]:
    layouts = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.nn.conv2d":
            layouts.append(str(e.attrs.data_layout))

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return layouts


def _assert_converts_exactly(mod: tvm.IRModule, inputs: list[np.ndarray]) -> tvm.IRModule:
    """ConvertToNHWC puts every conv in NHWC and computes what the NCHW module computes (fp32)."""
    converted = ConvertToNHWC()(mod)
    assert not layout_skipped(converted)
    assert set(_conv_layouts(converted)) == {"NHWC"}
    assert rel_error(run_vm(build_cpu(converted), inputs), run_vm(build_cpu(mod), inputs)) < 1e-5
    return converted


def _conv_then(tail, x_shape=(2, 4, 8, 8)) -> tvm.IRModule:
    """main(x) = tail(bb, conv2d_nchw(x)); a float32 conv with a constant 8-filter 3x3 weight."""
    weight = relax.const(np.random.default_rng(0).standard_normal((8, x_shape[1], 3, 3)).astype("float32"))
    x = relax.Var("x", relax.TensorType(list(x_shape), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = tail(bb, bb.emit(relax.op.nn.conv2d(x, weight, padding=1)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


# TVM 0.27's squeeze layout rule writes out of bounds for a negative axis (std::bad_alloc), its stack
# rule fails on every stack: ConvertToNHWC rewrites both into forms whose rules work.
LAYOUT_HOSTILE_TAILS = {
    "squeeze(-2, -1) of a pooled conv": lambda bb, y: bb.emit(
        relax.op.squeeze(bb.emit(relax.op.mean(y, axis=[2, 3], keepdims=True)), [-2, -1])
    ),
    "squeeze(-2) as nn.MultiheadAttention exports it": lambda bb, y: bb.emit(
        relax.op.squeeze(bb.emit(relax.op.permute_dims(bb.emit(relax.op.expand_dims(y, [0])), [1, 2, 3, 0, 4])), [-2])
    ),
    "stack(axis=-1)": lambda bb, y: bb.emit(relax.op.stack([y, bb.emit(relax.op.nn.relu(y))], axis=-1)),
    "stack(axis=1)": lambda bb, y: bb.emit(relax.op.stack([y, y], axis=1)),
}


@pytest.mark.parametrize("tail", LAYOUT_HOSTILE_TAILS.values(), ids=LAYOUT_HOSTILE_TAILS.keys())
def test_negative_squeeze_and_stack_convert(tail):
    mod = _conv_then(tail)
    _assert_converts_exactly(mod, random_inputs(mod))


def test_a_negative_squeeze_away_from_the_convs_converts():
    """ConvertLayout runs every op's layout rule, also on ops no conv feeds: the ViT's squeeze(-2)
    sits in the attention, far from the patch conv."""
    z = relax.Var("z", relax.TensorType([3, 17, 1, 1, 64], "float32"))
    x = relax.Var("x", relax.TensorType([1, 4, 8, 8], "float32"))
    weight = relax.const(np.ones((8, 4, 3, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, z]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, weight))
            out = bb.emit_output(relax.Tuple([conv, bb.emit(relax.op.squeeze(z, [-2]))]))
        bb.emit_func_output(out)
    converted = ConvertToNHWC()(bb.get())
    assert _conv_layouts(converted) == ["NHWC"] and not layout_skipped(converted)


torch = pytest.importorskip("torch", reason="needs the 'models' extra (torch)")
torch_models = pytest.importorskip("relax_cutlass.testing.models.torch_models")


@pytest.fixture(scope="module")
def small_vit():
    """The vit_b_16 structure at CPU scale: 32x32 image, 16x16 patches (4 tokens + the class token)."""
    model = torch_models.vit(image=32, hidden=32, layers=1, heads=2)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 32, 32)).astype("float32")
    mod, weights = torch_models.import_exported(model, (torch.from_numpy(x),))
    with torch.no_grad():
        reference = model(torch.from_numpy(x)).numpy()
    return mod, weights, x, reference


def test_vit_patch_stem_converts_to_nhwc_exactly(small_vit):
    """The bug: ConvertToNHWC raised std::bad_alloc on a torch ViT (the squeeze(-2) of
    nn.MultiheadAttention's packed q/k/v projection). Now the patch conv is NHWC and the fp32
    module computes what the NCHW one does."""
    mod, weights, x, reference = small_vit
    bound = relax.transform.BindParams("main", weights)(mod)
    converted = _assert_converts_exactly(bound, [x])
    assert rel_error(run_vm(build_cpu(converted), [x]), reference) < 1e-5


def test_vit_offloads_with_the_stem_reason_stated(small_vit):
    mod, weights, x, reference = small_vit
    mod = bind_float16(mod, weights)  # raised std::bad_alloc before
    assert _conv_layouts(mod) == ["NHWC"] and LAYOUT_SKIPPED_ATTR not in mod.attrs
    _, got, rewritten = compare_on_cpu(mod, [x])
    assert rel_error(got, reference) < 2e-2  # float16 compute vs the torch float32 model
    report = relax_cutlass.offload_report(rewritten)
    # the patch embedding (PatchifyConvs: a GEMM of its 16 x 16 x 3 patches), qkv, out-proj,
    # fc1+gelu, fc2+residual, the head; and the attention, reading the packed projection
    gemms = [r for r in report.offloaded if r["op"] == "matmul"]
    assert sorted(r["epilogue"] for r in gemms) == ["bias"] * 4 + ["bias+gelu", "bias+residual_add"]
    assert [r["mnk"][2] for r in gemms].count(16 * 16 * 3) == 1 and not report.left_in_tvm, str(report)
    (attention,) = [r for r in report.offloaded if r["op"] == "attention"]
    assert set(attention["attention"]["packed"]) == {"query", "key", "value"}, attention
    # offload_pipeline runs ConvertToNHWC on the module itself: no error there either.
    sm90 = relax_cutlass.offload_pipeline("sm_90a", compile=False)(mod)
    ops = [r["op"] for r in relax_cutlass.offload_report(sm90).offloaded]
    assert len(ops) == 10 and ops.count("norm") == 3  # and the layer norms (ln_1, ln_2, the final one)
    assert "conv2d" not in ops


class _Stem(torch.nn.Module):
    """A patch-embedding conv over 8 channels (so CUTLASS can take it) and what follows it."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.conv = torch.nn.Conv2d(8, 32, 4, stride=4)
        self.norm = torch.nn.LayerNorm(32)
        self.fc = torch.nn.Linear(32 * 4 if kind == "flatten_linear" else 32, 16)

    def forward(self, x):
        y = self.conv(x)
        if self.kind == "tokens":  # DeiT/timm PatchEmbed without a class token
            return self.fc(self.norm(y.flatten(2).transpose(1, 2)))
        if self.kind == "swin":  # torchvision swin: Permute([0, 2, 3, 1]) then LayerNorm
            return self.fc(self.norm(y.permute(0, 2, 3, 1)))
        return self.fc(torch.relu(y).flatten(1))  # conv -> flatten -> linear


@pytest.mark.parametrize("kind", ["tokens", "swin", "flatten_linear"])
def test_patch_stem_siblings(kind):
    torch.manual_seed(0)
    model = _Stem(kind).eval()
    x = np.random.default_rng(1).uniform(-1, 1, (2, 8, 8, 8)).astype("float32")
    mod, weights = torch_models.import_exported(model, (torch.from_numpy(x),))
    _assert_converts_exactly(relax.transform.BindParams("main", weights)(mod), [x])
    mod = bind_float16(mod, weights)
    _, got, rewritten = compare_on_cpu(mod, [x])
    with torch.no_grad():
        assert rel_error(got, model(torch.from_numpy(x)).numpy()) < 2e-2
    report = relax_cutlass.offload_report(rewritten)
    assert [r["op"] for r in report.offloaded].count("conv2d") == 1, str(report)
    assert not [r for r in report.left_in_tvm if r["op"] == "conv2d"]


def _two_conv_functions() -> tvm.IRModule:
    """main and other, each a float16 NCHW conv + relu."""
    mod = tvm.IRModule()
    for name in ("main", "other"):
        x = relax.Var("x", relax.TensorType([1, 16, 8, 8], "float16"))
        weight = relax.const(np.random.default_rng(0).uniform(-0.1, 0.1, (16, 16, 3, 3)).astype("float16"))
        bb = relax.BlockBuilder()
        with bb.function(name, [x]):
            with bb.dataflow():
                out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, weight, padding=1))))
            bb.emit_func_output(out)
        mod[name] = bb.get()[name]
    return mod


def test_a_layout_failure_leaves_that_function_in_nchw_and_is_reported(monkeypatch):
    """ConvertLayout failing (here made to fail on `other` only) never raises out of ConvertToNHWC:
    that function stays as it was, the others are converted, and the report says why."""
    real = relax.transform.ConvertLayout

    def failing_on_other(desired_layouts):
        @tvm.transform.module_pass(opt_level=0, name="ConvertLayout")
        def convert(mod, _ctx):
            if any(gv.name_hint == "other" for gv in mod.get_global_vars()):
                raise tvm.error.InternalError("std::bad_alloc\nsecond line")
            return real(desired_layouts)(mod)

        return convert

    monkeypatch.setattr(relax.transform, "ConvertLayout", failing_on_other)
    mod = _two_conv_functions()
    converted = ConvertToNHWC()(mod)
    assert _conv_layouts(tvm.IRModule({"main": converted["main"]})) == ["NHWC"]
    tvm.ir.assert_structural_equal(converted["other"], mod["other"])
    reason = "TVM's ConvertLayout failed: InternalError: std::bad_alloc"
    assert layout_skipped(converted) == {"other": reason}
    x = random_inputs(mod)
    assert rel_error(run_vm(build_cpu(converted), x), run_vm(build_cpu(mod), x)) < 1e-2  # float16 sums

    # The pipeline does not raise either; the report names the skip for `other`'s conv only.
    offloaded = relax_cutlass.offload_pipeline("sm_90a", compile=False)(mod)
    report = relax_cutlass.offload_report(offloaded)
    assert [r["op"] for r in report.offloaded] == ["conv2d"]
    (row,) = report.left_in_tvm
    assert row["function"] == "other"
    assert "ConvertToNHWC skipped the layout conversion of this function" in row["reasons"][0]
    assert reason in row["reasons"][0] and reason in str(report)
