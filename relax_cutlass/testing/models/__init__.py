"""Small Relax model builders used by the main job, tests, benchmarks and tutorials.

Built with `relax.BlockBuilder` the way frontends emit them (dense as permute_dims + matmul, bias
as a broadcast add), with weights as parameters that `bind_weights` turns into constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.op import astype, erf, matmul, multiply, nn, permute_dims, reshape, sigmoid

ACTIVATION_BUILDERS = {
    "identity": lambda bb, x: x,
    "relu": lambda bb, x: bb.emit(nn.relu(x)),
    "gelu": lambda bb, x: bb.emit(nn.gelu(x)),
    "gelu_tanh": lambda bb, x: bb.emit(nn.gelu_tanh(x)),
    "silu": lambda bb, x: bb.emit(nn.silu(x)),
    "sigmoid": lambda bb, x: bb.emit(sigmoid(x)),
    # As the PyTorch frontend writes Hardswish: x * clip(x + 3, 0, 6) / 6.
    "hardswish": lambda bb, x: _hardswish(bb, x),
    # What frontends and FoldConstant leave of an erf gelu: 0.5*x*(1+erf(x/sqrt(2))), erf in fp32.
    "gelu_decomposed": lambda bb, x: _gelu_decomposed(bb, x),
    # GPT-2's NewGELUActivation, 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))), x^3 as the multiplies
    # FixTvmCudaForms makes of x ** 3, the constants rounded to the element type as an export does.
    "gelu_tanh_decomposed": lambda bb, x: gelu_tanh_decomposed(bb, x),
    # QuickGELU, x * sigmoid(1.702 x), as CLIP exports it: not built in (tutorial 02 registers it).
    "quick_gelu": lambda bb, x: quick_gelu(bb, x),
}


ActivationBuilder = Callable[[relax.BlockBuilder, relax.Expr], relax.Expr]


def _activation_builder(activation: str | ActivationBuilder) -> ActivationBuilder:
    """A named builder from ACTIVATION_BUILDERS, or the caller's own `(bb, x) -> expr`."""
    if callable(activation):
        return activation
    if activation not in ACTIVATION_BUILDERS:
        raise ValueError(f"unknown activation {activation!r}: one of {sorted(ACTIVATION_BUILDERS)} or a callable")
    return ACTIVATION_BUILDERS[activation]


def _scalar(value: float, dtype: str) -> relax.Expr:
    return relax.const(value, dtype)


def _gelu_decomposed(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    dtype = x.ty.dtype
    scaled = bb.emit(multiply(x, _scalar(1 / math.sqrt(2), dtype)))
    e = bb.emit(astype(erf(bb.emit(astype(scaled, "float32"))), dtype))
    one_plus = bb.emit(relax.op.add(e, _scalar(1.0, dtype)))
    return bb.emit(multiply(bb.emit(multiply(x, _scalar(0.5, dtype))), one_plus))


def gelu_tanh_decomposed(bb: relax.BlockBuilder, x: relax.Expr, cubic: float = 0.044715) -> relax.Expr:
    """0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + cubic * x^3))) as torch.export writes GPT-2's gelu."""
    dtype = x.ty.dtype
    half = bb.emit(multiply(x, _scalar(0.5, dtype)))
    cube = bb.emit(multiply(bb.emit(multiply(x, x)), x))
    inner = bb.emit(relax.op.add(x, bb.emit(multiply(cube, _scalar(cubic, dtype)))))
    t = bb.emit(relax.op.tanh(bb.emit(multiply(inner, _scalar(math.sqrt(2 / math.pi), dtype)))))
    return bb.emit(multiply(half, bb.emit(relax.op.add(t, _scalar(1.0, dtype)))))


def quick_gelu(bb: relax.BlockBuilder, x: relax.Expr, scale: float = 1.702) -> relax.Expr:
    """x * sigmoid(scale * x), the way a frontend writes QuickGELU (scale 1.702)."""
    scaled = bb.emit(multiply(x, _scalar(scale, x.ty.dtype)))
    return bb.emit(multiply(x, bb.emit(sigmoid(scaled))))


def _hardswish(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    dtype = x.ty.dtype
    clipped = bb.emit(relax.op.clip(bb.emit(relax.op.add(x, _scalar(3.0, dtype))), 0, 6))
    return bb.emit(multiply(x, bb.emit(relax.op.divide(clipped, _scalar(6.0, dtype)))))


def dense(bb, x, w, b=None, *, transposed=True, out_dtype=None):
    """x @ w.T (+ b) with w given as (N, K), the way frontends lower nn.Linear; or x @ w for (K, N)."""
    wt = bb.emit(permute_dims(w)) if transposed else w
    y = bb.emit(matmul(x, wt, out_dtype=out_dtype))
    return bb.emit(relax.op.add(y, b)) if b is not None else y


def dense_epilogue_model(
    m: int | str,
    n: int,
    k: int,
    *,
    bias: bool = True,
    activation: str | ActivationBuilder = "identity",
    residual: bool = False,
    residual_relu: bool = False,
    transposed: bool = True,
    dtype: str = "float16",
    out_cast: str | None = None,
    batch: tuple[int, ...] = (),
) -> tvm.IRModule:
    """main(x[, residual], w[, b]) = cast(post(act(x @ w^T + b) + residual)); M may be symbolic."""
    m_dim = tvm.tirx.Var(m, "int64") if isinstance(m, str) else m
    lead = [*batch, m_dim]
    x = relax.Var("x", relax.TensorType([*lead, k], dtype))
    w = relax.Var("w", relax.TensorType([n, k] if transposed else [k, n], dtype))
    params = [x]
    r = None
    if residual:
        r = relax.Var("residual", relax.TensorType([*lead, n], dtype))
        params.append(r)
    params.append(w)
    b = None
    if bias:
        b = relax.Var("b", relax.TensorType([n], dtype))
        params.append(b)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            y = dense(bb, x, w, b, transposed=transposed)
            y = _activation_builder(activation)(bb, y)
            if residual:
                y = bb.emit(relax.op.add(y, r))
                if residual_relu:
                    y = bb.emit(nn.relu(y))
            if out_cast:
                y = bb.emit(astype(y, out_cast))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def gated_mlp_model(
    m: int | str,
    hidden: int,
    intermediate: int,
    *,
    activation: str | ActivationBuilder = "silu",
    dtype: str = "float16",
    bias: bool = False,
    down: bool = True,
    up_first: bool = False,
) -> tvm.IRModule:
    """main(x, w_gate, w_up[, b_gate, b_up][, w_down]) = down(act(x @ w_gate^T [+ b_gate]) * (x @ w_up^T
    [+ b_up])), the gated MLP of Llama (silu), Gemma (gelu_tanh) and GLU variants; M may be symbolic;
    `up_first`: the up product is the multiply's first operand."""
    m_dim = tvm.tirx.Var(m, "int64") if isinstance(m, str) else m
    x = relax.Var("x", relax.TensorType([m_dim, hidden], dtype))
    w_gate = relax.Var("w_gate", relax.TensorType([intermediate, hidden], dtype))
    w_up = relax.Var("w_up", relax.TensorType([intermediate, hidden], dtype))
    params = [x, w_gate, w_up]
    b_gate = b_up = None
    if bias:
        b_gate = relax.Var("b_gate", relax.TensorType([intermediate], dtype))
        b_up = relax.Var("b_up", relax.TensorType([intermediate], dtype))
        params += [b_gate, b_up]
    w_down = relax.Var("w_down", relax.TensorType([hidden, intermediate], dtype))
    if down:
        params.append(w_down)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            gate = _activation_builder(activation)(bb, dense(bb, x, w_gate, b_gate))
            up = dense(bb, x, w_up, b_up)
            y = bb.emit(multiply(up, gate) if up_first else multiply(gate, up))
            if down:
                y = dense(bb, y, w_down)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def conv2d_epilogue_model(
    n: int | str,
    h: int,
    w: int,
    c: int,
    k: int,
    kernel: int | tuple[int, int] = 3,
    *,
    stride: int = 1,
    padding: int | tuple[int, ...] = 1,
    dilation: int = 1,
    groups: int = 1,
    bias: bool = True,
    activation: str | ActivationBuilder = "identity",
    residual: bool = False,
    residual_relu: bool = False,
    layout: str = "NCHW",
    dtype: str = "float16",
) -> tvm.IRModule:
    """main(x[, residual], w[, b]) = post(act(conv2d(x, w) + b) + residual), the way the PyTorch
    frontend writes it: NCHW/OIHW by default (filters of C/groups channels), bias as a (1, K, 1, 1)
    broadcast add."""
    r, s = (kernel, kernel) if isinstance(kernel, int) else kernel
    n_dim = tvm.tirx.Var(n, "int64") if isinstance(n, str) else n
    pads = (padding,) * 4 if isinstance(padding, int) else tuple(padding)
    p = (h + pads[0] + pads[-2 if len(pads) == 4 else 0] - dilation * (r - 1) - 1) // stride + 1
    q = (w + pads[1 if len(pads) == 4 else 0] + pads[-1] - dilation * (s - 1) - 1) // stride + 1
    nchw = layout == "NCHW"
    x = relax.Var("x", relax.TensorType([n_dim, c, h, w] if nchw else [n_dim, h, w, c], dtype))
    weight = relax.Var("w", relax.TensorType([k, c // groups, r, s] if nchw else [k, r, s, c // groups], dtype))
    params = [x]
    res = None
    if residual:
        res = relax.Var("residual", relax.TensorType([n_dim, k, p, q] if nchw else [n_dim, p, q, k], dtype))
        params.append(res)
    params.append(weight)
    b = relax.Var("b", relax.TensorType([k], dtype)) if bias else None
    params += [b] if bias else []
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(
                nn.conv2d(
                    x, weight, strides=stride, padding=padding, dilation=dilation, groups=groups,
                    data_layout=layout, kernel_layout="OIHW" if nchw else "OHWI",
                )
            )  # fmt: skip
            if bias:
                y = bb.emit(relax.op.add(y, bb.emit(reshape(b, [1, k, 1, 1] if nchw else [1, 1, 1, k]))))
            y = _activation_builder(activation)(bb, y)
            if residual:
                y = bb.emit(relax.op.add(y, res))
                if residual_relu:
                    y = bb.emit(nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def bert_encoder_layer(
    batch: int = 8, seq: int = 128, hidden: int = 1024, ffn: int = 4096, heads: int = 16, dtype: str = "float16"
) -> tvm.IRModule:
    """One BERT-large encoder layer, as torch.export + from_exported_program would produce it.

    ``main(x: (batch, seq, hidden), *weights) -> (batch, seq, hidden)``; attention score matmuls are
    batched (ND x ND) and stay in TVM; the six dense layers are offload candidates.
    """
    head_dim = hidden // heads
    x = relax.Var("x", relax.TensorType([batch, seq, hidden], dtype))
    names = [
        ("q", hidden, hidden),
        ("k", hidden, hidden),
        ("v", hidden, hidden),
        ("o", hidden, hidden),
        ("ffn1", ffn, hidden),
        ("ffn2", hidden, ffn),
    ]
    weights = {}
    for name, n, k in names:
        weights[f"{name}_w"] = relax.Var(f"{name}_w", relax.TensorType([n, k], dtype))
        weights[f"{name}_b"] = relax.Var(f"{name}_b", relax.TensorType([n], dtype))
    for ln in ("ln1", "ln2"):
        weights[f"{ln}_g"] = relax.Var(f"{ln}_g", relax.TensorType([hidden], dtype))
        weights[f"{ln}_b"] = relax.Var(f"{ln}_b", relax.TensorType([hidden], dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *weights.values()]):
        with bb.dataflow():

            def lin(inp, name):
                return dense(bb, inp, weights[f"{name}_w"], weights[f"{name}_b"])

            def heads_of(t):
                t = bb.emit(reshape(t, [batch, seq, heads, head_dim]))
                return bb.emit(permute_dims(t, [0, 2, 1, 3]))

            q, k, v = (heads_of(lin(x, n)) for n in ("q", "k", "v"))
            scores = bb.emit(matmul(q, bb.emit(permute_dims(k, [0, 1, 3, 2]))))
            scores = bb.emit(multiply(scores, _scalar(1 / math.sqrt(head_dim), dtype)))
            probs = bb.emit(nn.softmax(scores, axis=-1))
            ctx = bb.emit(permute_dims(bb.emit(matmul(probs, v)), [0, 2, 1, 3]))
            ctx = bb.emit(reshape(ctx, [batch, seq, hidden]))
            attn = bb.emit(relax.op.add(lin(ctx, "o"), x))
            h = bb.emit(nn.layer_norm(attn, weights["ln1_g"], weights["ln1_b"], axes=[-1]))
            f = bb.emit(nn.gelu(lin(h, "ffn1")))
            y = bb.emit(relax.op.add(lin(f, "ffn2"), h))
            y = bb.emit(nn.layer_norm(y, weights["ln2_g"], weights["ln2_b"], axes=[-1]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def random_weights(
    mod: tvm.IRModule, seed: int = 0, skip: tuple[str, ...] = ("x", "residual")
) -> dict[str, np.ndarray]:
    """Random (never zero) weights for every parameter of main not in `skip`, scaled like an init."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in mod["main"].params:
        if p.name in skip:
            continue
        shape = [int(d) for d in p.ty.shape.values]
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1  # (N, K) dense, (K, C, R, S) conv
        scale = 1 / math.sqrt(fan_in) if len(shape) > 1 else 0.1
        value = rng.uniform(-1, 1, size=shape) * scale
        if p.name.endswith("_g"):
            value = 1.0 + value
        out[p.name] = value.astype(str(p.ty.dtype))
    return out


def onnx_conv_mlp(batch: int = 2, seed: int = 0):
    """A small ONNX model built with onnx.helper (conv + bias + relu, global pooling, Gemm + Relu,
    MatMul + Add), weights as initializers; imported with `tvm.relax.frontend.onnx.from_onnx`.
    Returns (IRModule with weights as constants, the onnx ModelProto)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(seed)

    def init(name, *shape):
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
        return numpy_helper.from_array((rng.uniform(-1, 1, shape) / math.sqrt(fan_in)).astype("float32"), name)

    inits = [init("conv_w", 16, 8, 3, 3), init("conv_b", 16), init("fc1_w", 64, 16), init("fc1_b", 64)]
    inits += [init("fc2_w", 64, 32), init("fc2_b", 32)]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc1_w", "fc1_b"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("MatMul", ["hr", "fc2_w"], ["m"]),
        helper.make_node("Add", ["m", "fc2_b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 32])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return from_onnx(model, keep_params_in_input=False), model
