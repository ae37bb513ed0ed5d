"""fold_output_scales: a constant per-feature scale after a linear layer (ConvNeXt's layer scale) is
folded into the weights, so the residual add after it fuses into the GEMM; never where the folded
weights would lose precision or the GEMM's result is read elsewhere."""

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.gemm.scales import fold_output_scales
from relax_cutlass.testing.harness import compare_on_cpu, op_names

RNG = np.random.default_rng(0)
W = (RNG.uniform(-1, 1, (32, 16)) / 6).astype("float16")
B = RNG.uniform(-0.5, 0.5, (16,)).astype("float16")


def _block(scale: np.ndarray, scale_first: bool = True, extra_use: bool = False) -> tvm.IRModule:
    """main(x, r) = scale * (x @ W + B) + r [, and x @ W + B again as a second output]."""
    x = relax.Var("x", relax.TensorType((2, 8, 32), "float16"))
    r = relax.Var("r", relax.TensorType((2, 8, 16), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, r]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, relax.const(W), out_dtype="float16")), relax.const(B)))
            g = relax.const(scale.astype("float16"))
            scaled = bb.emit(relax.op.multiply(g, y) if scale_first else relax.op.multiply(y, g))
            out = bb.emit(relax.op.add(scaled, r))
            if extra_use:
                out = bb.emit(relax.Tuple([out, y]))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("scale_first", [True, False])
@pytest.mark.parametrize("shape", [(16,), (1, 1, 16)])
def test_a_layer_scale_folds_and_the_residual_fuses(scale_first, shape):
    mod = _block(RNG.uniform(0.1, 1.0, shape), scale_first)
    folded = fold_output_scales(mod["main"])
    assert "relax.multiply" not in op_names(tvm.IRModule({"main": folded}))
    x, r = RNG.uniform(-1, 1, (2, 8, 32)).astype("float16"), RNG.uniform(-1, 1, (2, 8, 16)).astype("float16")
    _, _, rewritten = compare_on_cpu(mod, [x, r], rtol=2e-3, arch="sm_90a")
    report = relax_cutlass.offload_report(rewritten)
    assert [row["epilogue"] for row in report.offloaded] == ["bias+residual_add"]
    assert "relax.multiply" not in op_names(rewritten) and "relax.add" not in op_names(rewritten)


@pytest.mark.parametrize(
    "why, scale, extra_use",
    [
        ("a freshly initialized 1e-6 layer scale: W * g is subnormal in fp16", np.full((16,), 1e-6), False),
        ("a scale over rows, not output features", RNG.uniform(0.5, 1, (8, 1)), False),
        ("the GEMM's result is also read elsewhere", RNG.uniform(0.5, 1, (16,)), True),
    ],
)
def test_what_is_not_folded(why, scale, extra_use):
    mod = _block(scale, extra_use=extra_use)
    assert "relax.multiply" in op_names(tvm.IRModule({"main": fold_output_scales(mod["main"])})), why


def test_a_scaled_gemm_returned_through_an_alias_is_folded_once():
    """gv = lv, lv = g * (x @ W + B) (a dataflow output aliasing the scaled value): one GEMM."""
    x = relax.Var("x", relax.TensorType((2, 8, 32), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, relax.const(W), out_dtype="float16")), relax.const(B)))
            scaled = bb.emit(relax.op.multiply(y, relax.const(RNG.uniform(0.5, 1, (16,)).astype("float16"))))
            out = bb.emit_output(scaled)
        bb.emit_func_output(out)
    folded = relax.transform.DeadCodeElimination()(tvm.IRModule({"main": fold_output_scales(bb.get()["main"])}))
    assert op_names(folded).count("relax.matmul") == 1 and "relax.multiply" not in op_names(folded)
