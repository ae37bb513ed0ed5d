"""Fit the polynomial of relax_cutlass's 16-bit GELU (kernel_spec.GELU16_LOG2_TAIL) and report its error.

    .venv/bin/python -m relax_cutlass.testing.gelu16

The kernels compute gelu(x) = x * Phi(x) as relu(x) - |x| * 2^P(|x|), where 2^P(t) ~ 1 - Phi(t)
(templates.GELU16_FUNCTOR). P is fitted to log2(1 - Phi(t)) on [0, 6] by Lawson's iteratively
reweighted least squares (a minimax fit), weighting each point by the error it causes in the output
relative to max(|gelu(x)|, fp16's smallest normal): the negative tail, where gelu is tiny, keeps its
relative precision down to fp16's normal range, and beyond it only the absolute error counts.
Degree 5 is the smallest whose error stays below one fp16 ulp; degree 6 would fit better on [0, 6]
but is not decreasing beyond it, so inputs past 6 would need a clamp (one more instruction).
"""

from __future__ import annotations

import math
import sys

import numpy as np

FP16_MIN_NORMAL = 6.103515625e-05


def log2_upper_tail(t: np.ndarray) -> np.ndarray:
    """log2(1 - Phi(t)), accurate in the far tail (erfc, not 1 - erf)."""
    return np.log2(np.vectorize(lambda v: 0.5 * math.erfc(v / math.sqrt(2.0)))(t))


def fit(degree: int = 5, upper: float = 6.0, points: int = 6000, iterations: int = 400) -> np.ndarray:
    """Coefficients c[0..degree] (lowest first) of P(t) ~ log2(1 - Phi(t)) on [0, upper]."""
    t = (1 - np.cos(np.linspace(0, np.pi, points))) / 2 * upper  # Chebyshev-spaced
    target = log2_upper_tail(t)
    # Output error per unit error of P, relative to max(|gelu|, fp16 min normal): ln2 * |x| Q / floor.
    weight = np.minimum(1.0, t * np.exp2(target) / FP16_MIN_NORMAL)
    weight[0] = 1.0
    basis = np.vander(t / upper, degree + 1, increasing=True)
    lawson = np.full(points, 1.0 / points)
    for _ in range(iterations):
        scale = np.sqrt(lawson) * weight
        coefficients, *_ = np.linalg.lstsq(basis * scale[:, None], target * scale, rcond=None)
        residual = np.abs(basis @ coefficients - target) * weight
        lawson = lawson * residual / np.sum(lawson * residual)
    return coefficients / upper ** np.arange(degree + 1)


def finite_fp16() -> np.ndarray:
    """Every finite fp16 value, as float32."""
    values = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    return values[np.isfinite(values)].astype(np.float32)


def gelu_exact(x: np.ndarray) -> np.ndarray:
    """x * Phi(x) in float64 (erfc keeps the negative tail's relative precision)."""
    x = np.asarray(x, dtype=np.float64)
    return x * np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2.0)))(x)


def gelu16_emulated(x: np.ndarray, coefficients) -> np.ndarray:
    """The kernels' float32 arithmetic (templates.GELU16_FUNCTOR): Horner with fused multiply-adds
    (float64 products of float32 values are exact, so one rounding per step, as fmaf), exp2 as
    ex2.approx.ftz (relative error below 2^-22, results below 2^-126 flushed to zero)."""
    x = np.asarray(x, dtype=np.float32)
    t = np.abs(x)
    p = np.full_like(t, np.float32(coefficients[-1]))
    with np.errstate(over="ignore"):  # huge |x|: P overflows to -inf, as in float32 on the GPU
        for c in coefficients[-2::-1]:
            p = (p.astype(np.float64) * t + np.float32(c)).astype(np.float32)
        tail = np.where(p < -126, 0.0, np.exp2(p.astype(np.float64))).astype(np.float32)
        return (np.maximum(x, 0).astype(np.float64) - t.astype(np.float64) * tail).astype(np.float32)


def fp16_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in fp16 ulps (steps between representable values; +0 and -0 are the same)."""

    def ordered(h: np.ndarray) -> np.ndarray:
        bits = np.asarray(h, dtype=np.float16).view(np.uint16).astype(np.int64)
        return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)

    return np.abs(ordered(a) - ordered(b))


def fp16_error_report(coefficients) -> dict:
    """Errors of the 16-bit GELU over every finite fp16 input, rounded to fp16, against the correctly
    rounded gelu: max ulps, how many differ, and the float32 result's max error relative to
    max(|gelu|, fp16 min normal)."""
    x = finite_fp16()
    exact = gelu_exact(x)
    got = gelu16_emulated(x, coefficients)
    ulps = fp16_ulps(got.astype(np.float16), exact.astype(np.float16))
    relative = np.abs(got - exact) / np.maximum(np.abs(exact), FP16_MIN_NORMAL)
    return {
        "max_ulps": int(ulps.max()),
        "differing": int(np.count_nonzero(ulps)),
        "inputs": int(x.size),
        "max_relative_error": float(relative.max()),
    }


def main() -> int:
    from relax_cutlass.kinds.epilogue import GELU16_LOG2_TAIL

    coefficients = fit()
    print("GELU16_LOG2_TAIL = (" + ", ".join(f"{c:.9g}" for c in coefficients.astype(np.float32)) + ")")
    print("fitted:  ", fp16_error_report(tuple(float(c) for c in coefficients.astype(np.float32))))
    print("in use:  ", fp16_error_report(GELU16_LOG2_TAIL))
    return 0


if __name__ == "__main__":
    sys.exit(main())
