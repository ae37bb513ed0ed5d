"""The numpy reference of the norm kind (numpy only: it runs on GPU hosts with just the TVM
runtime): what the kernel computes, in float64 (the tests round it to the outputs' dtypes)."""

from __future__ import annotations

import numpy as np


def norm_reference(
    x: np.ndarray,
    residual: np.ndarray | None = None,
    gamma: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    norm: str = "layer_norm",
    epsilon: float = 1e-5,
) -> tuple[np.ndarray, np.ndarray]:
    """-> (sum, norm) in float64: sum = x + residual (x without one), normalized over the last axis
    (LayerNorm: (s - mean) / sqrt(var + eps); RMSNorm: s / sqrt(mean(s^2) + eps)), times gamma,
    plus beta."""
    s = x.astype("float64") + (residual.astype("float64") if residual is not None else 0.0)
    if norm == "layer_norm":
        centered = s - s.mean(axis=-1, keepdims=True)
        y = centered / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + epsilon)
    else:
        y = s / np.sqrt((s * s).mean(axis=-1, keepdims=True) + epsilon)
    if gamma is not None:
        y = y * gamma.astype("float64").reshape(-1)
    if beta is not None:
        y = y + beta.astype("float64").reshape(-1)
    return s, y
