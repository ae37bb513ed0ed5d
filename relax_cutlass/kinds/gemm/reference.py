"""The float32 reference of a GEMM profiling job (numpy only: it runs on the GPU host)."""

from __future__ import annotations

import numpy as np

from ..reference import epilogue_problem, torch_cuda


def _gemm_reference(a: np.ndarray, b: np.ndarray, b_transposed: bool) -> np.ndarray:
    bt = b.T if b_transposed else b
    torch = torch_cuda()
    if torch is not None:
        ta, tb = torch.from_numpy(a).cuda().float(), torch.from_numpy(np.ascontiguousarray(bt)).cuda().float()
        return (ta @ tb).cpu().numpy()
    return a.astype("float32") @ bt.astype("float32")


def problem(job: dict, rng: np.random.Generator, tvm, dev):
    """A (m, k) x (k, n) or (n, k)^T problem (relax_cutlass.toolkit.profile_runner)."""
    dtype = job["dtype"]
    m, n, k, bt = job["m"], job["n"], job["k"], job["b_transposed"]
    a = rng.uniform(-1, 1, size=(m, k)).astype(dtype)
    b = (rng.uniform(-1, 1, size=(n, k) if bt else (k, n)) / np.sqrt(k)).astype(dtype)
    call_args = lambda tensors, out, _split_k, iterations: (*tensors, out, m, n, k, bt, iterations)  # noqa: E731
    return epilogue_problem(job, rng, tvm, dev, (a, b), _gemm_reference(a, b, bt), (m, n), call_args)
