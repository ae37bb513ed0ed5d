"""The one measure every check of a result uses: relative L2 error against a reference."""

from __future__ import annotations

import numpy as np


def as_numpy(value) -> np.ndarray:
    """A numpy array of a numpy array, a TVM tensor or a CPU torch tensor."""
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    return np.asarray(value)


def rel_error(got, expected) -> float:
    """‖got - expected‖ / ‖expected‖ in float64. NaN where that would check nothing (the shapes
    differ, or the reference is all zeros: every result would match it), inf where `got` holds a
    non-finite value; so `rel_error(...) <= tolerance` fails in both cases."""
    got, expected = as_numpy(got).astype("float64"), as_numpy(expected).astype("float64")
    if got.shape != expected.shape or not np.linalg.norm(expected) > 0:
        return float("nan")
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def within(got, expected, tolerance: float) -> bool:
    """`got` matches `expected` to `tolerance` relative error. Where the reference is all zeros
    (a generated graph may compute y - y), only an exactly zero result matches: relative error has
    nothing to measure there."""
    got, expected = as_numpy(got), as_numpy(expected)
    if got.shape == expected.shape and not np.any(expected):
        return not np.any(got)
    return rel_error(got, expected) <= tolerance
