"""FastTvmReductions: average pools as window sums, float32 means of 16-bit tensors as one reduction.

DenseNet-121 (batch 32, H200) spent 5.0 of its 8.0 ms in TVM's three transition AvgPool2d(2)
kernels, which DLight schedules one thread block per output element. Each rewritten module is
checked against the original on the CPU (llvm), and the rewritten forms against TVM's CUDA fusion:
one kernel each.
"""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.op import add, astype, divide, maximum, mean, minimum, multiply, nn

import relax_cutlass
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import build_cpu, compare_on_cpu, op_names, run_vm
from relax_cutlass.transform import FastTvmReductions


def module(build, shape, dtype="float16") -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(x))
        bb.emit_func_output(out)
    return bb.get()


def run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    return run_vm(build_cpu(mod), [x])


def assert_same_values(mod: tvm.IRModule, rewritten: tvm.IRModule, shape, dtype="float16") -> None:
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype(dtype)
    expected, got = run(mod, x), run(rewritten, x)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    # TVM's pool sums in the input's dtype, the rewrite in float32: a 16-bit rounding apart
    tolerance = 2e-3 if dtype == "float16" else 1e-6
    assert np.abs(got.astype("float64") - expected.astype("float64")).max() <= tolerance


def fused(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` after TVM's CUDA legalization and fusion (its default pipeline's passes before DLight)."""
    for p in (
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ):
        mod = p(mod)
    return mod


def fused_kernels(mod: tvm.IRModule) -> list[str]:
    """The PrimFuncs main calls after TVM's CUDA fusion."""
    return [gv.name_hint for gv, f in fused(mod).functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def written_shapes(mod: tvm.IRModule) -> list[list[int]]:
    """The shapes of the tensors main's kernels write, after TVM's CUDA fusion."""
    mod = fused(mod)
    shapes = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_tir":
            shapes.append([int(d) for d in e.ty.shape.values])

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return shapes


POOLS = {
    1: (nn.avg_pool1d, ("NCW", "NWC")),
    2: (nn.avg_pool2d, ("NCHW", "NHWC")),
    3: (nn.avg_pool3d, ("NCDHW", "NDHWC")),
}


@st.composite
def pools(draw):
    dims = draw(st.integers(1, 3))
    window = [draw(st.integers(1, 3)) for _ in range(dims)]
    strides = [draw(st.integers(1, 3)) for _ in range(dims)]
    padding = [draw(st.integers(0, k // 2)) for k in window] * 2
    sizes = [draw(st.integers(k, k + 5)) for k in window]
    return {
        "dims": dims,
        "window": window,
        "strides": strides,
        "padding": padding,
        "sizes": sizes,
        "channels_last": draw(st.booleans()),
        "count_include_pad": draw(st.booleans()),
        "ceil_mode": draw(st.booleans()),
        "dtype": draw(st.sampled_from(["float16", "float32"])),
    }


def pool_module(p: dict) -> tuple[tvm.IRModule, list[int]]:
    op, layouts = POOLS[p["dims"]]
    layout = layouts[p["channels_last"]]
    shape = [2, *p["sizes"], 3] if p["channels_last"] else [2, 3, *p["sizes"]]
    kwargs = {"ceil_mode": p["ceil_mode"], "count_include_pad": p["count_include_pad"], "layout": layout}
    mod = module(lambda x: op(x, p["window"], p["strides"], p["padding"], **kwargs), shape, p["dtype"])
    return mod, shape


@settings(max_examples=20, deadline=None)
@given(pools())
def test_every_average_pool_keeps_its_values(p):
    mod, shape = pool_module(p)
    rewritten = FastTvmReductions()(mod)
    assert_same_values(mod, rewritten, shape, p["dtype"])
    # rewritten unless ceil_mode adds a partial window (TVM's own rule, left to it)
    per_dim = zip(p["sizes"], p["padding"], p["window"], p["strides"], strict=False)  # padding: before, after
    floor = [(n + 2 * pad - k) // s + 1 for n, pad, k, s in per_dim]
    out = list(rewritten["main"].ret_ty.shape.values)
    out_sizes = [int(d) for d in (out[1:-1] if p["channels_last"] else out[2:])]
    assert (out_sizes == floor) == (not any(n.startswith("relax.nn.avg_pool") for n in op_names(rewritten)))


@pytest.mark.parametrize("count_include_pad", [True, False])
def test_densenets_pool_and_inceptions_are_one_fused_kernel(count_include_pad):
    """DenseNet's AvgPool2d(2) and Inception's 3x3 stride-1 padded pool: one elementwise kernel."""
    for pool, shape in (
        (lambda x: nn.avg_pool2d(x, 2, 2, layout="NHWC"), (2, 8, 8, 16)),
        (lambda x: nn.avg_pool2d(x, 3, 1, 1, layout="NHWC", count_include_pad=count_include_pad), (2, 7, 7, 16)),
    ):
        mod = module(pool, shape)
        rewritten = FastTvmReductions()(mod)
        assert "relax.nn.avg_pool2d" not in op_names(rewritten)
        assert len(fused_kernels(rewritten)) == 1, fused_kernels(rewritten)
        assert_same_values(mod, rewritten, shape)


def test_adaptive_pools_rewritten_where_their_windows_tile_the_input():
    tiled = module(lambda x: nn.adaptive_avg_pool2d(x, (4, 3), layout="NHWC"), (2, 8, 9, 4))
    rewritten = FastTvmReductions()(tiled)
    assert "relax.nn.adaptive_avg_pool2d" not in op_names(rewritten)
    assert_same_values(tiled, rewritten, (2, 8, 9, 4))
    uneven = module(lambda x: nn.adaptive_avg_pool2d(x, (3, 3), layout="NHWC"), (2, 8, 8, 4))
    assert FastTvmReductions()(uneven).script() == uneven.script()
    # a global pool written as an adaptive one: 64 x 64 offsets would be spelled out, so it stays
    global_pool = module(lambda x: nn.adaptive_avg_pool2d(x, (1, 1), layout="NHWC"), (2, 64, 64, 4))
    assert FastTvmReductions()(global_pool).script() == global_pool.script()


def test_symbolic_batch():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 8, 8, 4], "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pooled = bb.emit(nn.avg_pool2d(x, 2, 2, layout="NHWC"))
            out = bb.emit_output(mean(astype(pooled, "float32"), [1, 2], keepdims=True))
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = FastTvmReductions()(mod)
    assert not {"relax.nn.avg_pool2d", "relax.mean"} & set(op_names(rewritten))
    assert_same_values(mod, rewritten, (3, 8, 8, 4))


@pytest.mark.parametrize("keepdims", [True, False])
def test_a_float32_mean_is_one_kernel_with_what_computes_its_input(keepdims):
    """EfficientNet-B0's squeeze-excitation pool, mean(cast(x, float32)), and MobileNetV3's,
    mean(hardswish(x) in float32): the cast or the activation was a kernel of its own, writing the
    whole activation in float32."""
    shape = (2, 7, 7, 16)

    def hardswish(x):
        y = astype(x, "float32")
        return divide(
            multiply(y, minimum(maximum(add(y, relax.const(3.0)), relax.const(0.0)), relax.const(6.0))),
            relax.const(6.0),
        )

    for activation in (lambda x: astype(x, "float32"), hardswish):
        mod = module(lambda x, f=activation: astype(mean(f(x), [1, 2], keepdims=keepdims), "float16"), shape)
        assert list(shape) in written_shapes(mod)  # the activation written in float32
        rewritten = FastTvmReductions()(mod)
        assert "relax.mean" not in op_names(rewritten)
        # one kernel reads x and reduces it (a second casts the (2, 16) means to float16)
        assert list(shape) not in written_shapes(rewritten), written_shapes(rewritten)
        x = np.random.default_rng(1).uniform(-1, 1, shape).astype("float16")
        assert rel_error(run(rewritten, x), run(mod, x)) < 1e-3
    # a 16-bit mean sums in its dtype, as TVM's does: left as it is
    plain = module(lambda x: mean(x, [1, 2]), shape)
    assert FastTvmReductions()(plain).script() == plain.script()


def test_the_pipeline_leaves_no_average_pool_to_tvm():
    """A DenseNet transition (conv -> AvgPool2d(2) -> conv), through offload_pipeline's passes with
    the convs served on the CPU: the pool between them becomes window sums, values unchanged."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8, 8, 16), "float16"))
    rng = np.random.default_rng(2)
    w1 = relax.const(rng.uniform(-0.3, 0.3, (32, 1, 1, 16)).astype("float16"))
    w2 = relax.const(rng.uniform(-0.3, 0.3, (32, 3, 3, 32)).astype("float16"))
    conv = {"data_layout": "NHWC", "kernel_layout": "OHWI", "out_dtype": "float16"}
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(nn.conv2d(x, w1, **conv))
            y = bb.emit(nn.avg_pool2d(y, 2, 2, layout="NHWC"))
            out = bb.emit_output(nn.conv2d(y, w2, padding=1, **conv))
        bb.emit_func_output(out)
    mod = bb.get()
    x_value = rng.uniform(-1, 1, (2, 8, 8, 16)).astype("float16")
    _, _, rewritten = compare_on_cpu(mod, [x_value])
    assert "relax.nn.avg_pool2d" not in op_names(rewritten)
    assert relax_cutlass.offload_report(rewritten).offloaded
