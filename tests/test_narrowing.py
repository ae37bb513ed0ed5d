"""NarrowFloat32Islands: MobileNetV3's hardswish and the residual add after it, which mixed precision
left in float32 between 16-bit values, computed in 16 bits again so they fuse into conv epilogues.

On the H200 every hardswish of MobileNetV3-Large ran as a TVM kernel after its conv (torch 2.11's
export writes it with a clamp to (-inf, 6] that ToMixedPrecision splits across dtypes).
"""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.op import add, astype, divide, maximum, minimum, multiply

import relax_cutlass
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import build_cpu, compare_on_cpu, op_names, run_vm
from relax_cutlass.transform import NarrowFloat32Islands


def f32(value: float):
    return relax.const(value, "float32")


def exported_hardswish(x: relax.Expr, bb: relax.BlockBuilder) -> relax.Expr:
    """The form from_torch gives a 16-bit x (the zoo's MobileNetV3-Large import, op for op)."""
    relu = bb.emit(maximum(add(x, relax.const(3.0, "float16")), relax.const(0.0, "float16")))
    clamped = bb.emit(maximum(minimum(astype(relu, "float32"), f32(float("inf"))), f32(float("-inf"))))
    return bb.emit(divide(multiply(astype(x, "float32"), minimum(clamped, f32(6.0))), f32(6.0)))


def block(residual: bool) -> tvm.IRModule:
    """x -> hardswish (float32) -> [+ y in float32] -> float16, as a MobileNetV3 block leaves it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 4, 8), "float16"))
    y = relax.Var("y", relax.TensorType((2, 4, 4, 8), "float16"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            h = exported_hardswish(x, bb)
            if residual:
                h = bb.emit(add(astype(y, "float32"), h))
            out = bb.emit_output(astype(h, "float16"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("residual", [False, True])
def test_the_exported_hardswish_is_computed_in_16_bits(residual):
    mod = block(residual)
    narrowed = NarrowFloat32Islands()(mod)
    names = op_names(narrowed)
    assert "relax.astype" not in names, narrowed  # no float32 island left: not even a cast
    assert names.count("relax.minimum") == names.count("relax.maximum") == 1
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-5, 5, (2, 4, 4, 8)).astype("float16") for _ in range(2)]
    got, want = run_vm(build_cpu(narrowed), inputs), run_vm(build_cpu(mod), inputs)
    assert np.abs(got.astype("float32") - want.astype("float32")).max() <= 8e-3  # one 16-bit rounding at 5


def test_other_float32_forms_are_left_alone():
    """A float32 add of float32 values, and a hardswish-like form with another constant, stay."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float16"))
    w = relax.Var("w", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            summed = bb.emit(astype(add(astype(x, "float32"), w), "float16"))
            relu = bb.emit(maximum(add(x, relax.const(2.0, "float16")), relax.const(0.0, "float16")))
            other = bb.emit(
                divide(multiply(astype(x, "float32"), minimum(astype(relu, "float32"), f32(6.0))), f32(6.0))
            )
            out = bb.emit_output(add(astype(summed, "float32"), other))
        bb.emit_func_output(out)
    mod = bb.get()
    assert NarrowFloat32Islands()(mod).script() == mod.script()


def test_mobilenet_v3_fuses_every_hardswish_and_residual():
    """torchvision's MobileNetV3 blocks through from_torch: each hardswish after a conv is in the
    conv's epilogue and each residual add in the producing conv's; values as before."""
    torch = pytest.importorskip("torch")
    torch_models = pytest.importorskip("relax_cutlass.testing.models.torch_models")
    blocks = ((3, 64, 24, False, "HS", 1), (3, 72, 24, False, "HS", 1))  # hardswish blocks, the second residual
    torch.manual_seed(0)
    model = torch_models.mobilenet_v3(width_mult=0.5, blocks=blocks).eval()
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 32, 32)).astype("float32")
    mod = relax_cutlass.from_torch(model, (torch.from_numpy(x),))
    assert NarrowFloat32Islands()(mod).script() != mod.script()  # the export's form is the one narrowed
    _, got, rewritten = compare_on_cpu(mod, [x])
    report = relax_cutlass.offload_report(rewritten)
    epilogues = [r["epilogue"] for r in report.offloaded if r["op"] in ("conv2d", "dwconv2d")]
    assert sum("hardswish" in e for e in epilogues) >= 5, epilogues  # stem, 2 x (expand, depthwise), last
    assert any("residual" in e for e in epilogues), epilogues
    # nothing of a hardswish is left to TVM: its minimum only where the squeeze-excitation is
    assert "relax.divide" not in op_names(rewritten)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    assert rel_error(got.astype("float32"), expected) < 2e-2


def shuffled_windows(fill: float) -> tvm.IRModule:
    """Swin's window shuffle as from_torch leaves it: a 16-bit norm output widened to float32, padded,
    rolled (a take), partitioned (reshape, permute_dims) and narrowed again for the next GEMM."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 4, 8), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wide = bb.emit(relax.op.nn.pad(astype(x, "float32"), [0, 0, 0, 0, 0, 0, 0, 0], pad_value=fill))
            rolled = bb.emit(relax.op.take(wide, relax.const(np.array([1, 2, 3, 0], "int64")), axis=1))
            windows = bb.emit(relax.op.permute_dims(relax.op.reshape(rolled, (2, 2, 2, 2, 2, 8)), [0, 1, 3, 2, 4, 5]))
            out = bb.emit_output(astype(relax.op.reshape(windows, (8, 4, 8)), "float16"))
        bb.emit_func_output(out)
    return bb.get()


def test_data_movement_of_a_widened_value_moves_16_bits():
    """Regression (torchvision's Swin-T: its windows were shuffled in float32 between 16-bit norms
    and GEMMs): the widening cast moves past the pad, take and views and cancels with the narrowing
    one; the values are the same bits."""
    mod = shuffled_windows(0.0)
    narrowed = NarrowFloat32Islands()(mod)
    assert "relax.astype" not in op_names(narrowed), narrowed
    x = np.random.default_rng(0).uniform(-4, 4, (2, 4, 4, 8)).astype("float16")
    np.testing.assert_array_equal(run_vm(build_cpu(narrowed), [x]), run_vm(build_cpu(mod), [x]))


def test_a_pad_whose_fill_is_no_16_bit_value_keeps_the_cast_before_it():
    narrowed = NarrowFloat32Islands()(shuffled_windows(0.1))
    names = op_names(narrowed)
    assert names.index("relax.astype") < names.index("relax.nn.pad"), names
