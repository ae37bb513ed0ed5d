"""Partitioning: which regions become composites, and legality rules that keep others in TVM."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.op import astype, divide, erf, multiply, nn

import relax_cutlass
from relax_cutlass.kinds.gemm.patterns import all_gemm_specs
from relax_cutlass.prepare import bind_weights
from relax_cutlass.stages.constants import composite_of, offloaded_functions
from relax_cutlass.stages.patterns import spec_by_name
from relax_cutlass.testing.models import dense, dense_epilogue_model, random_weights


def graph(params: dict[str, tuple[list[int], str]], body) -> tvm.IRModule:
    """main(**params) = body(bb, *param_vars), built in one dataflow block."""
    args = [relax.Var(name, relax.TensorType(shape, dtype)) for name, (shape, dtype) in params.items()]
    bb = relax.BlockBuilder()
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *args))
        bb.emit_func_output(out)
    return bb.get()


X, W, B = ([64, 16], "float16"), ([32, 16], "float16"), ([32], "float16")


def composites(mod):
    return sorted(str(composite_of(f).attrs["Composite"]) for _, f in offloaded_functions(mod))


def partition(mod):
    return relax_cutlass.transform.PartitionForCutlass()(mod)


def test_spec_names_are_unique_and_round_trip():
    specs = all_gemm_specs()
    assert len({s.name for s in specs}) == len(specs)
    assert all(spec_by_name()[s.name] == s for s in specs)
    assert all(s.name.startswith("relax_cutlass.") for s in specs)  # never collides with TVM's "cutlass."


@pytest.mark.parametrize(
    "activation",
    ["identity", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "gelu_decomposed", "gelu_tanh_decomposed"],
)
@pytest.mark.parametrize("residual,residual_relu", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("transposed", [True, False])
def test_each_epilogue_fuses_into_one_region(activation, residual, residual_relu, transposed):
    mod = dense_epilogue_model(
        64, 32, 16, activation=activation, residual=residual, residual_relu=residual_relu, transposed=transposed
    )
    act = {"gelu_decomposed": "gelu", "gelu_tanh_decomposed": "gelu_tanh"}.get(activation, activation)
    parts = ["dense" if transposed else "matmul", "bias"] + ([act] if act != "identity" else [])
    parts += ["residual_add"] * residual + ["relu"] * residual_relu
    assert composites(partition(mod)) == ["relax_cutlass." + "_".join(parts)]


def test_no_bias_and_final_cast():
    mod = dense_epilogue_model(64, 32, 16, bias=False, activation="relu", out_cast="float32")
    assert composites(partition(mod)) == ["relax_cutlass.dense_relu_cast"]


def test_folded_weights_are_kn_matmuls():
    """FoldConstant folds permute_dims of a bound (N, K) weight: the region becomes a (K, N) matmul."""
    mod = dense_epilogue_model(64, 32, 16, activation="gelu")
    assert composites(partition(bind_weights(mod, random_weights(mod)))) == ["relax_cutlass.matmul_bias_gelu"]


def _gelu_variant(bb, x, variant):
    dt = "float16"
    c = lambda v: relax.const(v, dt)  # noqa: E731
    scaled = bb.emit(divide(x, c(math.sqrt(2))) if variant["divide"] else multiply(x, c(1 / math.sqrt(2))))
    if variant["fp32_erf"]:
        e = bb.emit(astype(bb.emit(erf(bb.emit(astype(scaled, "float32")))), dt))
    else:
        e = bb.emit(erf(scaled))
    one_plus = bb.emit(relax.op.add(c(1.0), e))
    half = c(variant["half"])
    if variant["order"] == 0:
        return bb.emit(multiply(bb.emit(multiply(x, half)), one_plus))
    if variant["order"] == 1:
        return bb.emit(multiply(bb.emit(multiply(x, one_plus)), half))
    return bb.emit(multiply(x, bb.emit(multiply(one_plus, half))))


def _model_with(act_fn):
    return graph({"x": X, "w": W, "b": B}, lambda bb, x, w, b: act_fn(bb, dense(bb, x, w, b)))


@pytest.mark.parametrize("divide", [False, True])
@pytest.mark.parametrize("fp32_erf", [False, True])
@pytest.mark.parametrize("order", [0, 1, 2])
def test_decomposed_gelu_forms_fuse(divide, fp32_erf, order):
    variant = dict(divide=divide, fp32_erf=fp32_erf, order=order, half=0.5)
    mod = _model_with(lambda bb, y: _gelu_variant(bb, y, variant))
    assert composites(partition(mod)) == ["relax_cutlass.dense_bias_gelu"]


def test_wrong_gelu_constant_is_not_fused_as_gelu():
    variant = dict(divide=False, fp32_erf=True, order=0, half=0.6)
    mod = _model_with(lambda bb, y: _gelu_variant(bb, y, variant))
    assert composites(partition(mod)) == ["relax_cutlass.dense_bias"]


def test_wrong_tanh_gelu_constant_is_not_fused_as_gelu_tanh():
    """0.05 x^3 instead of GPT-2's 0.044715 x^3 is some other function: the GEMM keeps its bias only."""
    from relax_cutlass.testing.models import gelu_tanh_decomposed

    mod = _model_with(lambda bb, y: gelu_tanh_decomposed(bb, y, cubic=0.05))
    assert composites(partition(mod)) == ["relax_cutlass.dense_bias"]


def _bloom_gelu(bb, x, one: float = 1.0):
    """transformers' bloom_gelu_forward: x * 0.5 * (1 + tanh(0.79788456 * x * (one + 0.044715 * x * x)))."""
    op, dtype = relax.op, x.ty.dtype

    def c(v):
        return relax.const(v, dtype)

    square = bb.emit(op.multiply(bb.emit(op.multiply(x, c(0.044715))), x))
    inner = bb.emit(op.multiply(bb.emit(op.multiply(x, c(0.79788456))), bb.emit(op.add(square, c(one)))))
    tanh = bb.emit(op.add(bb.emit(op.tanh(inner)), c(1.0)))
    return bb.emit(op.multiply(bb.emit(op.multiply(x, c(0.5))), tanh))


@pytest.mark.parametrize(("one", "fused"), [(1.0, True), (1.5, False)])
def test_bloom_gelu_fuses_as_gelu_tanh(one, fused):
    """Regression (the zoo's bloom_4l on the H200: its gelu, x factored out of the tanh's argument,
    ran as a TVM kernel after each h->4h GEMM): fused as gelu_tanh, and only with its constants."""
    mod = _model_with(lambda bb, y: _bloom_gelu(bb, y, one))
    assert composites(partition(mod)) == ["relax_cutlass.dense_bias" + ("_gelu_tanh" if fused else "")]


def _left_reasons(mod):
    return [r for row in relax_cutlass.offload_report(mod).left_in_tvm for r in row["reasons"]]


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        (dict(dtype="float32"), "only float16/bfloat16 inputs"),
        (dict(n=33), "must both be even"),
        (dict(k=15), "must both be even"),
    ],
)
def test_illegal_regions_stay_in_tvm_with_a_reason(kwargs, reason):
    shape = dict(m=64, n=32, k=16) | {k: v for k, v in kwargs.items() if k in ("n", "k")}
    mod = dense_epilogue_model(
        shape["m"], shape["n"], shape["k"], activation="relu", **{k: v for k, v in kwargs.items() if k == "dtype"}
    )
    assert composites(partition(mod)) == []
    reasons = _left_reasons(mod)
    assert reasons and any(reason in r for r in reasons), reasons


def test_bfloat16_matmul_after_a_cast_is_offloaded():
    """Relax rejects mixed-dtype matmuls itself; a cast before the matmul stays outside the region."""
    mod = graph(
        {"x": ([64, 16], "float16"), "w": ([16, 32], "bfloat16")},
        lambda bb, x, w: bb.emit(relax.op.matmul(bb.emit(astype(x, "bfloat16")), w)),
    )
    assert composites(partition(mod)) == ["relax_cutlass.matmul"]


def test_symbolic_k_and_batched_rhs_stay_in_tvm():
    k = tvm.tirx.Var("k", "int64")
    mod = graph(
        {"x": ([8, 64, k], "float16"), "w": ([k, 32], "float16"), "y": ([8, 32, 16], "float16")},
        lambda bb, x, w, y: bb.emit(relax.op.matmul(bb.emit(relax.op.matmul(x, w)), y)),
    )
    assert composites(partition(mod)) == []
    reasons = _left_reasons(mod)
    assert any("must be static" in r for r in reasons)
    assert any("batched ND x ND" in r for r in reasons)


def test_bias_dtype_mismatch_keeps_bias_out_of_the_kernel():
    """matmul(out fp32) + fp32 bias + cast fp16: the bias add cannot be fused, the matmul can."""

    def body(bb, x, w, b):
        y = bb.emit(relax.op.matmul(x, w, out_dtype="float32"))
        return bb.emit(astype(bb.emit(relax.op.add(y, b)), "float16"))

    mod = graph({"x": X, "w": ([16, 32], "float16"), "b": ([32], "float32")}, body)
    assert composites(partition(mod)) == ["relax_cutlass.matmul_bias"]  # fp32 out + fp32 bias is legal


def test_broadcast_residual_is_not_fused():
    def body(bb, x, w, b, r):
        return bb.emit(relax.op.add(bb.emit(nn.relu(dense(bb, x, w, b))), r))

    mod = graph({"x": X, "w": W, "b": B, "r": ([1, 32], "float16")}, body)
    assert composites(partition(mod)) == ["relax_cutlass.dense_bias_relu"]


def test_intermediate_used_outside_is_not_swallowed():
    def body(bb, x, w, b):
        y = dense(bb, x, w, b)
        return bb.emit(relax.op.add(bb.emit(nn.gelu(y)), y))  # y leaks out of any gelu region

    mod = graph({"x": X, "w": W, "b": B}, body)
    assert composites(partition(mod)) == ["relax_cutlass.dense_bias"]
    x_np = np.random.default_rng(0).uniform(-1, 1, (64, 16)).astype("float16")
    from relax_cutlass.testing.harness import compare_on_cpu, random_inputs

    compare_on_cpu(mod, [x_np] + random_inputs(mod)[1:])
