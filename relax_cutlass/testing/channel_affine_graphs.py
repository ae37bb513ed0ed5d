"""Relax graphs of the channel-affine kind's form (DenseNet's pre-activation batch norm of a
concatenation) for its CPU and GPU tests."""

from __future__ import annotations

import numpy as np
from tvm import relax


def dense_block_parameters(channels: int, seed=0) -> tuple[np.ndarray, ...]:
    """The batch norm's (gamma, beta, mean, var) that `dense_block_module` binds, in float32, for a
    test's float64 reference."""
    rng = np.random.default_rng(seed)
    bounds = ((0.5, 1.5), (-0.5, 0.5), (-1, 1), (0.5, 2.0))
    return tuple(rng.uniform(lo, hi, (channels,)).astype("float32") for lo, hi in bounds)


def dense_block_module(parts_channels=(64, 32, 32), dtype="float16", rows=(2, 8, 8), training=False, seed=0):
    """act(batch_norm(astype(concat(parts, axis), f32)))) cast back, as ToMixedPrecision leaves a
    DenseNet layer's input in NHWC."""
    bb = relax.BlockBuilder()
    parts = [relax.Var(f"p{i}", relax.TensorType((*rows, c), dtype)) for i, c in enumerate(parts_channels)]
    gamma, beta, mean, var = (relax.const(p) for p in dense_block_parameters(sum(parts_channels), seed))
    with bb.function("main", parts):
        with bb.dataflow():
            x = bb.emit(relax.op.concat(parts, axis=3)) if len(parts) > 1 else parts[0]
            x = bb.emit(relax.op.astype(x, "float32"))
            bn = bb.emit(relax.op.nn.batch_norm(x, gamma, beta, mean, var, axis=3, epsilon=1e-5, training=training))
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0))))
            out = bb.emit_output(bb.emit(relax.op.astype(y, dtype)))
        bb.emit_func_output(out)
    return bb.get()
