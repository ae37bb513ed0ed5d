"""What a bias + activation region computes: problem, kernel and region records (no TVM compiler
needed: the walkthrough's first step)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...toolkit.dtypes import DTYPE_SHORT
from ..epilogue import Epilogue
from ..region import Region


@dataclass(frozen=True)
class BiasActProblem:
    """out = act(x + bias) over (rows, n): rows may be symbolic (None), n is compiled in."""

    rows: int | None
    n: int
    activation: str = "relu"
    element: str = "float16"
    element_accumulator: str = "float32"  # the kernel adds and activates in float32
    alignment: int = 1  # elements: the kernel reads one at a time


@dataclass(frozen=True)
class BiasActKernel:
    """One elementwise kernel: dtype and activation are compiled in, sizes are arguments."""

    problem: BiasActProblem
    target: int = 80
    arch: int = 80
    selected_by: str = field(default="rule", compare=False)
    note: str = field(default="", compare=False)

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue(bias=True, activation=self.problem.activation)

    @property
    def name(self) -> str:
        element = DTYPE_SHORT[self.problem.element]
        return f"sm{self.arch}_bias_act_{element}_{self.problem.activation}"


@dataclass(frozen=True)
class BiasActRegion(Region):
    kernel: BiasActKernel

    @property
    def kernels(self) -> tuple[BiasActKernel, ...]:
        return (self.kernel,)

    def report_row(self) -> dict:
        p = self.kernel.problem
        return self._row("bias_act", [p.rows if p.rows is not None else "dynamic", p.n, 1], {})
