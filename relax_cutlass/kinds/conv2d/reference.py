"""The float32 reference of a conv2d profiling job (numpy only: it runs on the GPU host)."""

from __future__ import annotations

import numpy as np
import tvm_ffi

from ..reference import epilogue_problem, torch_cuda


def conv2d_reference(x: np.ndarray, w: np.ndarray, geometry: list[int]) -> np.ndarray:
    """NHWC x OHWI (K, R, S, C/groups) -> NHWC in float32 (torch on the GPU when available, else
    numpy im2col). `geometry`: n, h, w, c, k, r, s, p, q, pad_h, pad_w, stride_h, stride_w,
    dilation_h, dilation_w, groups (the profiler's `conv` shape)."""
    n, h, wd, c, k, r, s, p, q, pad_h, pad_w, sh, sw, dh, dw, groups = geometry
    torch = torch_cuda()
    if torch is not None:
        import torch.nn.functional as F

        tx = torch.from_numpy(x).cuda().float().permute(0, 3, 1, 2)
        tw = torch.from_numpy(w).cuda().float().permute(0, 3, 1, 2)
        # Padding as (top, left) with the output size P, Q given: pad the far side enough, crop.
        tx = F.pad(tx, (pad_w, max(0, (q - 1) * sw + (s - 1) * dw + 1 - wd - pad_w),
                        pad_h, max(0, (p - 1) * sh + (r - 1) * dh + 1 - h - pad_h)))  # fmt: skip
        y = F.conv2d(tx, tw, stride=(sh, sw), dilation=(dh, dw), groups=groups)[:, :, :p, :q]
        return y.permute(0, 2, 3, 1).contiguous().cpu().numpy()
    xp = np.zeros((n, h + 2 * pad_h + (r - 1) * dh + p * sh, wd + 2 * pad_w + (s - 1) * dw + q * sw, c), "float32")
    xp[:, pad_h : pad_h + h, pad_w : pad_w + wd] = x
    # Output channel k reads the input channels of its group: (groups, K/groups, C/groups) filters.
    filters = w.astype("float32").reshape(groups, k // groups, r, s, c // groups)
    out = np.zeros((n, p, q, groups, k // groups), "float32")
    for i in range(r):
        for j in range(s):
            patch = xp[:, i * dh : i * dh + p * sh : sh, j * dw : j * dw + q * sw : sw][:, :p, :q]
            out += np.einsum("npqgc,gkc->npqgk", patch.reshape(n, p, q, groups, c // groups), filters[:, :, i, j])
    return out.reshape(n, p, q, k)


def problem(job: dict, rng: np.random.Generator, tvm, dev):
    """An NHWC x OHWI fprop problem (relax_cutlass.toolkit.profile_runner)."""
    dtype = job["dtype"]
    g = job["conv"]
    n, h, wd, c, k, r, s, p, q = g[:9]
    per_group = c // g[15]
    x = rng.uniform(-1, 1, size=(n, h, wd, c)).astype(dtype)
    w = (rng.uniform(-1, 1, size=(k, r, s, per_group)) / np.sqrt(r * s * per_group)).astype(dtype)
    shape = tvm_ffi.Shape(g)
    call_args = lambda tensors, out, split_k, iterations: (*tensors, out, shape, split_k, iterations)  # noqa: E731
    return epilogue_problem(job, rng, tvm, dev, (x, w), conv2d_reference(x, w, g), (n, p, q, k), call_args)
