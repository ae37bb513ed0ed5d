"""What a channel-affine region computes: problem, kernel and region records (no TVM compiler
needed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...toolkit.dtypes import DTYPE_SHORT
from ..epilogue import Epilogue
from ..region import Region

# The most parts one region concatenates (DenseNet-201's longest block: 48 layers, 49 parts).
MAX_PARTS = 64
# Elements a thread reads and writes at once (16 bytes of a 16-bit dtype): every part's channels
# must be a multiple of it.
VECTOR = 8


@dataclass(frozen=True)
class ChannelAffineProblem:
    """out = act((concat(parts, channels) - mean) / sqrt(var + eps) * gamma + beta), per channel of
    the last axis, computed in float32 and rounded once to the parts' dtype. `rows` (the product of
    the leading axes) may be symbolic (None); `channels` are each part's, in order."""

    rows: int | None
    channels: tuple[int, ...]
    epsilon: float
    activation: str = "relu"
    element: str = "float16"
    element_accumulator: str = "float32"  # the graph's batch norm runs in float32
    alignment: int = VECTOR


@dataclass(frozen=True)
class ChannelAffineKernel:
    """One kernel per dtype and activation: the parts, their channels and epsilon are arguments."""

    problem: ChannelAffineProblem
    target: int = 80
    arch: int = 80  # plain CUDA (128-bit accesses): runs on every arch from sm_80
    selected_by: str = field(default="rule", compare=False)
    note: str = field(default="", compare=False)

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue(activation=self.problem.activation)

    @property
    def name(self) -> str:
        return f"sm{self.arch}_channel_affine_{DTYPE_SHORT[self.problem.element]}_{self.problem.activation}"


@dataclass(frozen=True)
class ChannelAffineRegion(Region):
    kernel: ChannelAffineKernel

    @property
    def kernels(self) -> tuple[ChannelAffineKernel, ...]:
        return (self.kernel,)

    def report_row(self) -> dict:
        p = self.kernel.problem
        rows = p.rows if p.rows is not None else "dynamic"
        details = {"parts": len(p.channels), "epsilon": p.epsilon, "flops": 0}  # memory-bound
        return self._row("channel_affine", [rows, sum(p.channels), 1], details)
