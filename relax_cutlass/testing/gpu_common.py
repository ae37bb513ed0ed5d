"""Shared by the artifact builder (here) and the GPU runner (TVM runtime only): numpy and stdlib only.

Arrays are regenerated from their name on both sides, so weights never travel to the GPU host
separately from the libraries that have them bound as constants.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Callable

import numpy as np

try:  # registers numpy's "bfloat16" dtype (ships with TVM and JAX)
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover
    pass


def random_array(name: str, shape, dtype: str, seed: int = 0) -> np.ndarray:
    """Deterministic, never-zero data for tensor `name`: uniform(-1, 1) scaled by 1/sqrt(fan_in)
    for weights (fan_in = product of all but the first dim: (N, K) dense, (K, C, R, S) or
    (K, R, S, C) filters), so activations stay O(1) through deep stacks."""
    digest = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")
    rng = np.random.default_rng(digest)
    shape = [int(s) for s in shape]
    scale = 1.0
    if name.endswith("_w") or name == "w":
        scale = 1 / math.sqrt(math.prod(shape[1:]))
    elif name.endswith("_b") or name == "b":
        scale = 0.5
    # 64 levels, never zero: (i + 0.5) / 32 for i in [-32, 32). Low-entropy values keep libraries
    # with bound weights compressible enough to carry to the GPU host (a BERT-large layer's 25 MB
    # of random fp16 weights would not fit next to the runtime bundle), at no cost to the checks.
    value = (np.floor(rng.uniform(-1, 1, size=shape) * 32) + 0.5) / 32 * scale
    if name.endswith("_g"):
        value = 1.0 + 0.1 * value
    return value.astype(dtype)


def shape_of(spec: list, dims: dict[str, int]) -> list[int]:
    return [d if isinstance(d, int) else dims[d] for d in spec]


def time_torch(fn, repeat: int = 15, number: int = 20) -> float:
    """Median ms per call of a torch callable on the GPU: 5 warm-up calls, then `repeat` CUDA-event
    measurements of `number` back-to-back calls (the peers' timing; torch is imported only here,
    so the builder keeps numpy-only imports)."""
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / number)
    return statistics.median(samples)


def calls_per_sample(ms_per_call: float, target_ms: float = 20.0, most: int = 10) -> int:
    """How many back-to-back calls one timing sample takes: enough for about `target_ms` (a
    sample of a fast model is not one launch's jitter), at most `most`, at least one (a slow
    build, such as TVM's default one of a large model, is timed in a second, not a minute)."""
    if not ms_per_call > 0:
        return most
    return max(1, min(most, math.ceil(target_ms / ms_per_call)))


def alternating_samples(
    timers: dict[str, Callable[[], float]], rounds: int, discard: int = 0
) -> dict[str, list[float]]:
    """`rounds` measurements per timer, taken in turn (a, b, c, a, b, c, ...), after `discard`
    rounds that are thrown away."""
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for index in range(discard + rounds):
        for name, timer in timers.items():
            value = timer()
            if index >= discard:
                samples[name].append(value)
    return samples


def time_alternating(timers: dict[str, Callable[[], float]], rounds: int = 3, discard: int = 1) -> dict[str, float]:
    """Median of `rounds` measurements per timer, taken in turn after `discard` rounds thrown away.
    A GPU's clocks drift with its temperature over a run: timed one after the other, the first of
    two equal kernels looks faster (H100, 2026-11-23: 8% on 8192^3), and the first round after the
    warm-up ran 7-10% faster than every later one for relax_cutlass and cuBLAS alike (the same
    H100), so ratios are taken this way."""
    samples = alternating_samples(timers, rounds, discard)
    return {name: statistics.median(values) for name, values in samples.items()}
