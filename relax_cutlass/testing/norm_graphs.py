"""Relax graphs of the norm forms real models produce (after from_torch's ToMixedPrecision), for
the CPU tests and the GPU tests of the norm kind."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


def norm_module(
    form: str = "layer_norm",
    rows=(4, 16),
    n: int = 64,
    dtype: str = "float16",
    residual: str = "none",
    stream: str = "float32",
    cast: str | None = None,
    leak: tuple[str, ...] = (),
    epsilon: float = 1e-5,
    axis: int = -1,
    weights: str = "const",
    seed: int = 0,
    numerator: float = 1.0,
) -> tvm.IRModule:
    """main(x[, r]) -> the forms of the norm kind:

    residual "none": norm(x); "add": norm(x + r), x and r of `stream`; "cast": norm(astype(x,
    stream) + r) with x of `dtype` (BERT/GPT-2's fp32 residual stream after a 16-bit GEMM);
    "cast_both": norm(astype(x) + astype(r)). form: "layer_norm", "rms_norm" (R.nn.rms_norm),
    "rms_decomposed" (Llama's x * rsqrt(mean(x * x) + eps) * w), "rms_reciprocal" (the same with
    `numerator` / sqrt for rsqrt, as ONNX writes it). cast: the norm's output is cast to
    it. leak: "sum" and/or "norm" are used outside the region too (both outputs are returned).
    weights: "const" (bound constants) or "param" (main's parameters). `rows` may hold a str: a
    symbolic dim."""
    rng = np.random.default_rng(seed)
    dims = [tvm.tirx.Var(d, "int64") if isinstance(d, str) else d for d in rows]
    shape = [*dims, n]
    norm_dtype = stream if residual != "none" else dtype
    x_dtype = dtype if residual in ("none", "cast", "cast_both") else stream
    params = [relax.Var("x", relax.TensorType(shape, x_dtype))]
    if residual != "none":
        r_dtype = dtype if residual == "cast_both" else stream
        params.append(relax.Var("r", relax.TensorType(shape, r_dtype)))

    def weight(name, offset):
        value = (rng.uniform(0.5, 1.5, n) + offset).astype(norm_dtype)
        if weights == "const":
            return relax.const(value, norm_dtype)
        params.append(relax.Var(name, relax.TensorType([n], norm_dtype)))
        return params[-1]

    gamma = weight("gamma", 0.0)
    beta = weight("beta", -1.0) if form == "layer_norm" else None
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            x = params[0]
            if residual == "none":
                h = x
            else:
                a = bb.emit(relax.op.astype(x, stream)) if residual in ("cast", "cast_both") else x
                b = bb.emit(relax.op.astype(params[1], stream)) if residual == "cast_both" else params[1]
                h = bb.emit(relax.op.add(a, b))
            if form == "layer_norm":
                y = bb.emit(relax.op.nn.layer_norm(h, gamma, beta, axes=[axis], epsilon=epsilon))
            elif form == "rms_norm":
                y = bb.emit(relax.op.nn.rms_norm(h, gamma, axes=[axis], epsilon=epsilon))
            else:
                sq = bb.emit(relax.op.multiply(h, h))
                mean = bb.emit(relax.op.mean(sq, axis=[axis], keepdims=True))
                eps = bb.emit(relax.op.add(mean, relax.const(epsilon, norm_dtype)))
                if form == "rms_reciprocal":
                    rstd = bb.emit(relax.op.divide(relax.const(numerator, norm_dtype), bb.emit(relax.op.sqrt(eps))))
                else:
                    rstd = bb.emit(relax.op.rsqrt(eps))
                y = bb.emit(relax.op.multiply(gamma, bb.emit(relax.op.multiply(h, rstd))))
            out = bb.emit(relax.op.astype(y, cast)) if cast else y
            results = [out]
            out_dtype = cast or norm_dtype
            if "sum" in leak:  # the residual stream continues (pre-LN)
                results.append(bb.emit(relax.op.multiply(h, relax.const(2.0, norm_dtype))))
            if "norm" in leak:  # the f32 norm is the next residual (post-LN)
                results.append(bb.emit(relax.op.multiply(y, relax.const(3.0, norm_dtype))))
            # one output: the users outside the region, cast to the output's dtype and concatenated
            results = [r if r is out else bb.emit(relax.op.astype(r, out_dtype)) for r in results]
            gv = bb.emit_output(relax.op.concat(results, axis=-1) if len(results) > 1 else out)
        bb.emit_func_output(gv)
    return bb.get()
