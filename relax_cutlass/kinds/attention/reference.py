"""The float32 reference of a fused attention profiling job (numpy only: it runs on the GPU host)."""

from __future__ import annotations

import numpy as np
import tvm_ffi

# Query rows the reference is computed at: the full softmax(q k^T) v of a long sequence takes the
# GPU host's CPU minutes and gigabytes (2 x 16 heads x 8192^2 float32 scores are 8.6 GB), which made
# tuning attention take ~100 s per problem. A candidate is checked at these rows of every batch
# and head: the first and last two (the kernel's edge tiles), the middle, and random ones.
CHECKED_ROWS = 32


def checked_rows(s: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted distinct query rows of a sequence of s to check (all of them for short sequences)."""
    if s <= CHECKED_ROWS + 5:
        return np.arange(s)
    fixed = [0, 1, s // 2, s - 2, s - 1]
    return np.unique(np.concatenate([fixed, rng.choice(s, CHECKED_ROWS, replace=False)]))


def attention_reference(q, k, v, scale: float, causal: int, rows: np.ndarray, softcap: float = 0.0) -> np.ndarray:
    """softmax(q k^T * scale) v in float32 at query rows `rows` of BSNH q / k / v: (B, len(rows), N,
    V); under TVM's causal mask when `causal` (1 TopLeft, 2 BottomRight: query i sees key j iff
    j <= i + offset, offset 0 or |S - T|); the scores soft-capped to softcap * tanh(scores) where
    `softcap` is not 0 (scale then the tanh's). k and v may have fewer heads than q (grouped-query
    attention: query head n reads kv head n // (N / N_kv))."""
    s, t = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    qf = q[:, rows].astype("float32").transpose(0, 2, 1, 3)  # (B, N, R, H)
    kf = k.astype("float32").transpose(0, 2, 3, 1)  # (B, N, H, T)
    scores = np.matmul(qf, kf) * scale  # (B, N, R, T)
    if softcap:
        scores = np.float32(softcap) * np.tanh(scores)
    if causal:
        offset = abs(s - t) if causal == 2 else 0
        seen = np.arange(t)[None, :] <= rows[:, None] + offset
        scores = np.where(seen, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.matmul(probs, v.astype("float32").transpose(0, 2, 1, 3))  # (B, N, R, V)
    return out.transpose(0, 2, 1, 3)


def problem(job: dict, rng: np.random.Generator, tvm, dev):
    """q, k, v as packed BSNH tensors; the reference (`attention_reference`) at a sample of query rows, as
    (index into the output, values) for the runner's check."""
    b, s, t, n, h, dv = job["attention"]
    group = job.get("kv_group", 1)  # grouped-query attention: k and v have n / group heads
    q = rng.uniform(-1, 1, size=(b, s, n, h)).astype(job["dtype"])
    k = rng.uniform(-1, 1, size=(b, t, n // group, h)).astype(job["dtype"])
    v = rng.uniform(-1, 1, size=(b, t, n // group, dv)).astype(job["dtype"])
    causal = job.get("causal", 0)  # manifests written before causal attention have none
    rows = checked_rows(s, rng)
    softcap = job.get("softcap", 0.0)  # compiled into the kernel: the reference alone needs it
    want = ((slice(None), rows), attention_reference(q, k, v, job["scale"], causal, rows, softcap))
    tensors = [tvm.runtime.tensor(x, dev) for x in (q, k, v)]
    shape = tvm_ffi.Shape(job["attention"])

    def call(fn, out, _split_k, iterations):
        return fn(*tensors, out, shape, float(job["scale"]), causal, group, iterations)

    return (b, s, n, dv), want, call
