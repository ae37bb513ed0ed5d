"""SinkLayoutPermutes: a model's own NCHW <-> NHWC permutes (ConvNeXt) cancel against ConvertToNHWC's
instead of staying as run-time transposes, values unchanged."""

import os

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import relax as R

import relax_cutlass
from relax_cutlass.prepare import bind_float16, bind_weights
from relax_cutlass.rewrites.layout import ConvertToNHWC, layout_skipped
from relax_cutlass.rewrites.permutes import sink_layout_permutes
from relax_cutlass.testing.errors import rel_error, within
from relax_cutlass.testing.harness import build_cpu, compare_on_cpu, run_vm
from relax_cutlass.testing.models import torch_models


def _permutes(func: relax.Function) -> list[tuple[int, ...]]:
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.permute_dims":
            found.append(tuple(int(a) for a in e.attrs.axes))

    relax.analysis.post_order_visit(func.body, visit)
    return found


def _sunk(mod: tvm.IRModule) -> tvm.IRModule:
    out = tvm.IRModule({"main": sink_layout_permutes(mod["main"])})
    return relax.transform.DeadCodeElimination()(out)


def _assert_same_values(before: tvm.IRModule, after: tvm.IRModule, shapes: list[tuple[int, ...]]):
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, s).astype("float32") for s in shapes]
    assert within(run_vm(build_cpu(after), inputs), run_vm(build_cpu(before), inputs), 1e-6)


G = np.random.default_rng(1).uniform(0.5, 2, (6, 1, 1)).astype("float32")


def test_a_layer_scaled_residual_between_two_permutes_loses_both():
    """ConvNeXt's block tail: permute back to NCHW, layer scale, residual (also NCHW, itself a
    permute of an NHWC tensor), permute to NHWC for the next conv: no permute is left."""

    @tvm.script.ir_module
    class Block:
        @R.function
        def main(y: R.Tensor((2, 4, 5, 6), "float32"), r: R.Tensor((2, 4, 5, 6), "float32")):
            with R.dataflow():
                y_nchw = R.permute_dims(y, axes=[0, 3, 1, 2])
                r_nchw = R.permute_dims(r, axes=[0, 3, 1, 2])
                scaled = R.multiply(R.const(G), y_nchw)
                summed = R.add(scaled, r_nchw)
                act = R.nn.gelu(summed)
                shifted = R.subtract(R.const(1.5, "float32"), act)
                out = R.permute_dims(shifted, axes=[0, 2, 3, 1])
                R.output(out)
            return out

    after = _sunk(Block)
    assert _permutes(after["main"]) == []
    _assert_same_values(Block, after, [(2, 4, 5, 6), (2, 4, 5, 6)])


def test_non_commutative_ops_keep_their_operand_order():
    @tvm.script.ir_module
    class Tail:
        @R.function
        def main(y: R.Tensor((2, 4, 5, 6), "float32")):
            with R.dataflow():
                y_nchw = R.permute_dims(y, axes=[0, 3, 1, 2])
                a = R.divide(R.const(G), y_nchw)
                b = R.subtract(a, R.const(G))
                out = R.permute_dims(b, axes=[0, 2, 3, 1])
                R.output(out)
            return out

    after = _sunk(Tail)
    assert _permutes(after["main"]) == []
    _assert_same_values(Tail, after, [(2, 4, 5, 6)])


def test_what_must_stay_stays():
    """A permute meeting a non-constant tensor of the other layout, an attention-style head
    permute, and a permuted value the function returns keep their transposes."""

    @tvm.script.ir_module
    class Mixed:
        @R.function
        def main(y: R.Tensor((2, 4, 5, 6), "float32"), r: R.Tensor((2, 6, 4, 5), "float32")):
            with R.dataflow():
                y_nchw = R.permute_dims(y, axes=[0, 3, 1, 2])
                summed = R.add(y_nchw, r)  # r is NCHW already: the permute cannot move
                heads = R.permute_dims(summed, axes=[0, 2, 1, 3])
                out = R.nn.relu(heads)
                R.output(out)
            return out

    after = _sunk(Mixed)
    assert _permutes(after["main"]) == [(0, 3, 1, 2), (0, 2, 1, 3)]
    _assert_same_values(Mixed, after, [(2, 4, 5, 6), (2, 6, 4, 5)])


@pytest.fixture(scope="module")
def small_convnext():
    """Two ConvNeXt stages (torchvision's block and LayerNorm2d), fp16 after binding."""
    import torch

    model = torch_models.convnext(num_classes=10, stages=((16, 32, 2), (32, None, 1)))
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 32, 32)).astype("float32")
    imported = torch_models.import_exported(model, (torch.from_numpy(x),))
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    return imported, x, expected


def test_the_builder_is_torchvisions_convnext_tiny():
    """Same parameter count as torchvision.models.convnext_tiny() (28,589,128)."""
    assert sum(p.numel() for p in torch_models.convnext().parameters()) == 28_589_128


def test_convnext_keeps_no_transpose_inside(small_convnext):
    """Before: each of the 3 blocks permutes to NHWC and back, each of the 3 LayerNorm2d twice;
    after ConvertToNHWC the model's input is transposed to NHWC, the last feature map (2 x 32
    x 4 x 4) back to NCHW for the classifier's pooling, and the classifier's LayerNorm2d keeps its
    two permutes of the pooled (2 x 32 x 1 x 1) map: nothing inside the network."""
    (mod, weights), x, expected = small_convnext
    mod = bind_weights(mod, weights)
    assert len(_permutes(mod["main"])) == 12
    converted = ConvertToNHWC()(mod)
    assert not layout_skipped(converted)
    assert _permutes(converted["main"]) == [(0, 2, 3, 1), (0, 3, 1, 2), (0, 2, 3, 1), (0, 3, 1, 2)]
    got = run_vm(build_cpu(converted), [x])
    assert rel_error(got, run_vm(build_cpu(mod), [x])) < 1e-5
    assert rel_error(got, expected) < 1e-5


def test_convnext_offloads_and_computes_the_model(small_convnext):
    """The whole pipeline on CPU (regions served by their composites): every conv, depthwise conv
    and linear layer offloaded, each block's layer scale folded into its second linear layer,
    whose epilogue takes the residual add; the values those of the fp16 module."""
    (mod, weights), x, expected = small_convnext
    got_fp16, _, rewritten = compare_on_cpu(bind_float16(mod, weights), [x], arch="sm_90a")
    # the image to NHWC and into 4 x 4 patches (PatchifyConvs: the stem is a GEMM; one TVM kernel),
    # the last hidden state back to NCHW
    assert len(_permutes(rewritten["main"])) == 3
    # no layer scale left: the one multiply is the classifier pooling's 1/count before its sum
    # (FastTvmReductions' form of a float32 mean)
    script = rewritten["main"].script()
    assert script.count("R.multiply(") == script.count("R.sum(") == 1
    epilogues = [row["epilogue"] for row in relax_cutlass.offload_report(rewritten).offloaded]
    assert epilogues.count("bias+residual_add") == 3
    assert rel_error(got_fp16, expected) < 2e-2
    assert "R.nn.conv2d" not in rewritten["main"].script() and "R.matmul" not in rewritten["main"].script()


# RELAX_CUTLASS_GRAPH_EXAMPLES scales the examples, as in test_graphs.py
SCALE = float(os.environ.get("RELAX_CUTLASS_GRAPH_EXAMPLES", "1"))
N, H, W, C = 2, 3, 4, 5  # distinct sizes: a wrongly moved permute cannot type-check
SHAPES = {"NHWC": (N, H, W, C), "NCHW": (N, C, H, W)}
TO = {"NCHW": (0, 3, 1, 2), "NHWC": (0, 2, 3, 1)}  # the permute that brings a value to this layout
UNARY = (relax.op.nn.relu, relax.op.negative, relax.op.nn.gelu, relax.op.sigmoid)
BINARY = (relax.op.add, relax.op.subtract, relax.op.multiply)


def _channel_constant(layout: str, seed: int) -> relax.Expr:
    """A per-channel constant as a model writes it in `layout`: (C, 1, 1) for NCHW, (C,) for NHWC."""
    shape = (C, 1, 1) if layout == "NCHW" else (C,)
    return relax.const(np.random.default_rng(seed).uniform(0.5, 1.5, shape).astype("float32"))


@st.composite
def layout_graphs(draw):
    """Random chains of layout permutes, unary ops and binary ops (two values of one layout, or a
    value and a per-channel or scalar constant) over two NHWC inputs; the last value is returned."""
    steps = draw(
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 99), st.integers(0, 99)), min_size=3, max_size=10)
    )
    xs = [relax.Var(name, relax.TensorType(SHAPES["NHWC"], "float32")) for name in "xy"]
    bb = relax.BlockBuilder()
    with bb.function("main", xs):
        with bb.dataflow():
            values = [(x, "NHWC") for x in xs]
            for kind, a, b in steps:
                value, layout = values[a % len(values)]
                if kind == 0:  # a layout permute
                    other = "NCHW" if layout == "NHWC" else "NHWC"
                    values.append((bb.emit(relax.op.permute_dims(value, list(TO[other]))), other))
                elif kind == 1:
                    values.append((bb.emit(UNARY[b % len(UNARY)](value)), layout))
                else:
                    same = [v for v, lay in values if lay == layout]
                    if kind == 2 and len(same) > 1:
                        rhs = same[b % len(same)]
                    else:
                        rhs = _channel_constant(layout, b) if b % 3 else relax.const(1.25, "float32")
                    op = BINARY[b % len(BINARY)]
                    values.append((bb.emit(op(rhs, value) if b % 2 else op(value, rhs)), layout))
            out = bb.emit_output(values[-1][0])
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=int(12 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_graphs())
def test_sinking_random_layout_chains_keeps_values_and_adds_no_permute(mod):
    after = _sunk(mod)
    assert len(_permutes(after["main"])) <= len(_permutes(mod["main"]))
    _assert_same_values(mod, after, [SHAPES["NHWC"], SHAPES["NHWC"]])
