"""The tensor-parallel sum as a PyTorch op, so a sharded torch model exports with its collectives.

`tensor_parallel_sum(x)` marks where the partial results of a row-parallel projection are summed
over the group. `relax_cutlass.from_torch` imports it as `R.ccl.allreduce(x, "sum")`, which TVM's
disco runs with the group's backend (NCCL: `parallel.nccl`). Run in PyTorch, it sums with
torch.distributed where a process group is initialized, with the function given to `summing_with`
(a single-process simulation of the group: tests), and is the identity otherwise (a group of one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from ..frontend import TENSOR_PARALLEL_SUM

__all__ = ["summing_with", "tensor_parallel_sum"]

_summing: list[Callable[[torch.Tensor], torch.Tensor]] = []


@torch.library.custom_op(f"relax_cutlass::{TENSOR_PARALLEL_SUM}", mutates_args=())
def tensor_parallel_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of `x` over the tensor-parallel group (a new tensor)."""
    if _summing:
        return _summing[-1](x).clone()
    out = x.clone()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(out)
    return out


@tensor_parallel_sum.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@contextlib.contextmanager
def summing_with(function: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Within the block, `tensor_parallel_sum` in PyTorch returns `function(x)`: how the ranks of a
    group simulated in one process (threads) exchange their partial sums."""
    _summing.append(function)
    try:
        yield
    finally:
        _summing.pop()
