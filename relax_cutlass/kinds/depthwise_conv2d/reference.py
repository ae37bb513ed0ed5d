"""The float32 reference of a depthwise conv2d (numpy only: it runs on GPU hosts with just the TVM
runtime). The kind is not profiled yet, so no profiler job uses it; the tests check the kind's
regions against it."""

from __future__ import annotations

import numpy as np


def depthwise_reference(
    x: np.ndarray,
    w: np.ndarray,
    out_hw: tuple[int, int],
    pad: tuple[int, int] = (0, 0),
    stride: tuple[int, int] = (1, 1),
    dilation: tuple[int, int] = (1, 1),
) -> np.ndarray:
    """NHWC x (C, R, S, 1) -> NHWC in float32, padding as (top, left) with the output size given
    (reads past the bottom/right edge are zeros), as the kernel computes it."""
    n, h, wd, c = x.shape
    _, r, s, _ = w.shape
    p, q = out_hw
    rows = (p - 1) * stride[0] + (r - 1) * dilation[0] + 1
    cols = (q - 1) * stride[1] + (s - 1) * dilation[1] + 1
    xp = np.zeros((n, max(rows, pad[0] + h), max(cols, pad[1] + wd), c), "float32")
    xp[:, pad[0] : pad[0] + h, pad[1] : pad[1] + wd] = x
    out = np.zeros((n, p, q, c), "float32")
    for i in range(r):
        for j in range(s):
            top, left = i * dilation[0], j * dilation[1]
            rows_taken = slice(top, top + (p - 1) * stride[0] + 1, stride[0])
            window = xp[:, rows_taken, left : left + (q - 1) * stride[1] + 1 : stride[1]]
            out += window * w[:, i, j, 0].astype("float32")
    return out
