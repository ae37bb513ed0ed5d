"""A tensor-parallel group simulated in one process on the CPU: one thread per rank, each running
the rank's module in its own VM, the all-reduces between them summed in numpy.

disco's all-reduce (`runtime.disco.allreduce`, what `R.ccl.allreduce` becomes) needs a disco worker
and a collective backend; here it is replaced, for the duration of a run, by a function that waits
for every rank's contribution and gives each the sum. This checks what a sharding rewrite decides
(per-rank modules, where the collectives sit, each rank's weights) without GPUs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .harness import CPU

ALLREDUCE = "runtime.disco.allreduce"


class _Group:
    """The ranks' pending contributions to each all-reduce, matched by their order in each rank."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=60)
        self.slots: dict[tuple[int, int], np.ndarray] = {}
        self.local = threading.local()

    def allreduce(self, send, kind, _in_group, recv) -> None:
        if tuple(kind) != (0,):
            raise NotImplementedError(f"only the sum is simulated, not reduction kind {tuple(kind)}")
        rank, step = self.local.rank, self.local.step
        self.slots[(rank, step)] = send.numpy()
        self.barrier.wait()
        total = sum(self.slots[(r, step)].astype(np.float64) for r in range(self.world_size))
        self.barrier.wait()
        recv.copyfrom(total.astype(self.slots[(rank, step)].dtype))
        self.local.step += 1


@contextlib.contextmanager
def _allreduce_by(function) -> Iterator[None]:
    original = tvm_ffi.get_global_func(ALLREDUCE, allow_missing=True)
    tvm_ffi.register_global_func(ALLREDUCE, function, override=True)
    try:
        yield
    finally:
        if original is not None:
            tvm_ffi.register_global_func(ALLREDUCE, original, override=True)


def run_ranks_on_cpu(module: tvm.IRModule, params: Sequence[Sequence[np.ndarray]], inputs: Sequence[np.ndarray]):
    """main(*inputs, *params[r]) of `module` (built for llvm) on every rank r, all at once -> each
    rank's output (as numpy)."""
    group = _Group(len(params))
    outputs: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []
    with _allreduce_by(group.allreduce):
        executable = tvm.compile(module, CPU)

        def rank_main(rank: int) -> None:
            group.local.rank, group.local.step = rank, 0
            try:
                vm = relax.VirtualMachine(executable, tvm.cpu())
                args = [tvm.runtime.tensor(np.asarray(a)) for a in (*inputs, *params[rank])]
                out = vm["main"](*args)
                outputs[rank] = (out if hasattr(out, "numpy") else out[0]).numpy()
            except BaseException as err:  # re-raised below, in the caller's thread
                errors.append(err)
                group.barrier.abort()

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(params))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return [outputs[r] for r in range(len(params))]
