"""The float32 reference of a fused attention profiling job (numpy only: it runs on the GPU host)."""

from __future__ import annotations

import numpy as np
import tvm_ffi


def problem(job: dict, rng: np.random.Generator, tvm, dev):
    """q, k, v as packed BSNH tensors; the reference is softmax(q k^T * scale) v per head (float32),
    under TVM's causal mask when the job has one (1 TopLeft, 2 BottomRight: query i sees key j iff
    j <= i + offset, offset 0 or |S - T|)."""
    b, s, t, n, h, dv = job["attention"]
    q = rng.uniform(-1, 1, size=(b, s, n, h)).astype(job["dtype"])
    k = rng.uniform(-1, 1, size=(b, t, n, h)).astype(job["dtype"])
    v = rng.uniform(-1, 1, size=(b, t, n, dv)).astype(job["dtype"])
    scores = np.einsum("bsnh,btnh->bnst", q.astype("float32"), k.astype("float32")) * job["scale"]
    causal = job.get("causal", 0)  # manifests written before causal attention have none
    if causal:
        offset = abs(s - t) if causal == 2 else 0
        seen = np.arange(t)[None, :] <= np.arange(s)[:, None] + offset
        scores = np.where(seen, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = np.einsum("bnst,btnv->bsnv", probs, v.astype("float32"))
    tensors = [tvm.runtime.tensor(x, dev) for x in (q, k, v)]
    shape = tvm_ffi.Shape(job["attention"])

    def call(fn, out, _split_k, iterations):
        return fn(*tensors, out, shape, float(job["scale"]), causal, iterations)

    return (b, s, n, dv), want, call
