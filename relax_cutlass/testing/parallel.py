"""A tensor-parallel group simulated in one process on the CPU: one thread per rank, each running
the rank's module in its own VM, the all-reduces between them summed in numpy.

disco's all-reduce (`runtime.disco.allreduce`, what `R.ccl.allreduce` becomes) needs a disco worker
and a collective backend; here it is replaced, for the duration of a run, by a function that waits
for every rank's contribution and gives each the sum. This checks what a sharding rewrite decides
(per-rank modules, where the collectives sit, each rank's weights) without GPUs.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .harness import CPU, exported_library

ALLREDUCE = "runtime.disco.allreduce"


class SummingGroup:
    """`world_size` ranks, one thread each, that exchange values: `total(x)` waits for every rank's
    x of the same step (the ranks' calls matched by their order in each rank) and gives each the
    sum. Numpy arrays or torch tensors alike."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=60)
        self.slots: dict[tuple[int, int], object] = {}
        self.local = threading.local()

    def total(self, x):
        rank, step = self.local.rank, self.local.step
        self.slots[(rank, step)] = x
        self.barrier.wait()
        summed = sum(self.slots[(r, step)] for r in range(self.world_size))
        self.barrier.wait()
        self.local.step += 1
        return summed

    def allreduce(self, send, kind, _in_group, recv) -> None:
        """`runtime.disco.allreduce`'s signature: the sum (kind 0), accumulated in float64."""
        if tuple(kind) != (0,):
            raise NotImplementedError(f"only the sum is simulated, not reduction kind {tuple(kind)}")
        value = send.numpy()
        recv.copyfrom(self.total(value.astype(np.float64)).astype(value.dtype))

    def run(self, rank_main: Callable[[int], object]) -> list:
        """rank_main(rank) on every rank at once, each in its thread -> their results, by rank; the
        first rank's error is raised here (the others are released from their waits)."""
        results: dict[int, object] = {}
        errors: list[BaseException] = []

        def run_rank(rank: int) -> None:
            self.local.rank, self.local.step = rank, 0
            try:
                results[rank] = rank_main(rank)
            except BaseException as err:  # re-raised below, in the caller's thread
                errors.append(err)
                self.barrier.abort()

        threads = [threading.Thread(target=run_rank, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return [results[r] for r in range(self.world_size)]


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
    group = SummingGroup(len(params))
    with _allreduce_by(group.allreduce):
        with tempfile.TemporaryDirectory() as folder:  # the loaded library outlives its file
            library = exported_library(tvm.compile(module, CPU), Path(folder) / "ranks.so")

        def rank_main(rank: int) -> np.ndarray:
            vm = relax.VirtualMachine(library, tvm.cpu())
            out = vm["main"](*[tvm.runtime.tensor(np.asarray(a)) for a in (*inputs, *params[rank])])
            return (out if hasattr(out, "numpy") else out[0]).numpy()

        return group.run(rank_main)
