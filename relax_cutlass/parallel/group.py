"""Run a tensor-parallel build on one process per GPU with TVM's disco.

`TensorParallelModule(library, build.params)` starts a disco process session of `world_size`
workers (worker 0 is a thread of this process), gives it the NCCL backend (`parallel.nccl`) and
NCCL communicators on GPUs 0..n-1, loads the exported library on every worker and copies each
rank's weights to its worker once. Calling it runs main on every worker (the all-reduces inside
synchronize them) and returns worker 0's output.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Sequence

import numpy as np
import tvm

from .nccl import load_nccl_backend

__all__ = ["TensorParallelModule", "disco"]


@functools.cache
def disco() -> types.ModuleType:
    """`tvm.runtime.disco`, usable. In apache-tvm 0.27 `import tvm` imports it before it loads the
    library that defines its functions (libtvm_runtime_extra), which leaves its function table
    empty and the package unimportable; the table is filled again here, now that it is loaded."""
    import tvm_ffi

    api = "tvm.runtime.disco._ffi_api"
    if api in sys.modules and not hasattr(sys.modules[api], "SessionProcess"):
        tvm_ffi.init_ffi_api("runtime.disco", api)
    import tvm.runtime.disco as module

    return module


class TensorParallelModule:
    """An exported tensor-parallel library on `len(params)` workers, each with its rank's weights.

    `device="cuda"`: GPU r serves rank r, with NCCL between them. `device="cpu"` runs a group of one
    on the CPU (no collective: the disco plumbing alone, as tests check it)."""

    def __init__(self, library: str, params: Sequence[Sequence[np.ndarray]], device: str = "cuda"):
        if device not in ("cuda", "cpu"):
            raise ValueError(f"TensorParallelModule: device={device!r}: use 'cuda' or 'cpu'")
        world_size = len(params)
        if world_size < 1 or len({len(p) for p in params}) != 1:
            raise ValueError("TensorParallelModule: give every rank's weights, the same count for each rank")
        if device == "cpu" and world_size != 1:
            raise ValueError("TensorParallelModule: a CPU group has one rank (no collective backend runs on the CPU)")
        self.world_size = world_size
        self.session = disco().ProcessSession(num_workers=world_size)
        if device == "cuda":
            # loading the backend's library as a module runs its registrations in every worker
            self.session.load_vm_module(str(load_nccl_backend()))
            self.session.init_ccl("nccl", *range(world_size))
        self._device = None if device == "cuda" else tvm.cpu()  # None: each worker's own GPU
        self.module = self.session.load_vm_module(str(library), self._device)
        self.weights = [self._scatter([p[i] for p in params]) for i in range(len(params[0]))]

    def _scatter(self, values: Sequence[np.ndarray]):
        """A tensor on every worker, worker r's holding values[r]."""
        first = values[0]
        if any(v.shape != first.shape or v.dtype != first.dtype for v in values):
            raise ValueError("TensorParallelModule: the ranks' weights differ in shape or dtype")
        ref = self.session.empty(first.shape, str(first.dtype), self._device)
        for rank, value in enumerate(values):
            ref.debug_copy_from(rank, np.ascontiguousarray(value))
        return ref

    def _replicated(self, inputs: Sequence[np.ndarray]) -> list:
        """Each input on every worker (the same values)."""
        return [self._scatter([np.asarray(x)] * self.world_size) for x in inputs]

    def __call__(self, *inputs: np.ndarray) -> np.ndarray:
        """main(inputs) on every rank (inputs replicated); worker 0's output."""
        args = self._replicated(inputs)
        out = self.module["main"](*args, *self.weights)
        value = out.debug_get_from_remote(0)
        if not hasattr(value, "numpy"):  # frontends return a 1-tuple
            (value,) = value
        return value.numpy()

    def run_only(self, *inputs: np.ndarray, repeat: int = 1) -> None:
        """main(inputs) `repeat` times on every rank, waiting for all workers (for timing)."""
        args = self._replicated(inputs)
        for _ in range(repeat):
            self.module["main"](*args, *self.weights)
        self.synchronize()

    def synchronize(self) -> None:
        """Wait until every worker has run what it was given, on its device too."""
        device = self.session.call_packed(self.session.get_global_func("runtime.disco.device"))
        sync = self.session.get_global_func("runtime.Device_StreamSync")
        self.session.call_packed(sync, device, 0)  # its default stream, where TVM's kernels run
        self.session._sync_all()

    def shutdown(self) -> None:
        self.session.shutdown()
