"""What a norm region computes: problem, kernel and region records, and the kernel's row layout
(how many threads share a row, how many elements each holds in registers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...toolkit.dtypes import DTYPE_SHORT
from ..epilogue import Epilogue
from ..region import Region

BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# Normalized sizes the kernel takes: one warp per row up to WARP_MAX_N, one CTA per row (up to 1024
# threads, at most 16 elements each in registers) up to MAX_N.
WARP_MAX_N = 1024
MAX_N = 16384
ROWS_PER_WARP_CTA = 4  # rows (warps) per CTA where a warp normalizes a row


@dataclass(frozen=True)
class NormProblem:
    """[sum = data + residual, each operand read in its dtype (a 16-bit operand cast to float32 in
    the graph is read as stored), added in float32 and rounded to `sum_dtype`], then LayerNorm or
    RMSNorm over the last axis (n, compiled in; rows may be symbolic) with statistics in float32,
    rounded to `norm_dtype`, then cast to `out_dtype`. Whether the sum and the un-cast norm are
    outputs too (the graph uses them outside the region) is the region's (`Region.outputs`): the
    kernel writes them where it is given their pointers."""

    rows: int | None
    n: int
    norm: str  # "layer_norm" | "rms_norm"
    epsilon: float
    data_dtype: str
    sum_dtype: str
    norm_dtype: str
    out_dtype: str
    residual_dtype: str | None = None  # None: no residual add
    gamma_dtype: str | None = None  # None: no scale
    beta_dtype: str | None = None  # None: no shift (RMSNorm, or center=False)
    element_accumulator: str = "float32"

    @property
    def residual(self) -> bool:
        return self.residual_dtype is not None

    @property
    def element(self) -> str:
        return self.data_dtype

    @property
    def tensor_dtypes(self) -> list[str]:
        dtypes = [self.data_dtype, self.sum_dtype, self.norm_dtype, self.out_dtype]
        return dtypes + [d for d in (self.residual_dtype, self.gamma_dtype, self.beta_dtype) if d]

    @property
    def alignment(self) -> int:
        """Elements per vector access: 8 (128 bits of a 16-bit tensor) where n allows, else 4, 2, 1."""
        return next(v for v in (8, 4, 2, 1) if self.n % v == 0)

    def flops(self, _n=None) -> int:
        return 0  # memory-bound: not counted in the report's FLOP share


@dataclass(frozen=True)
class RowLayout:
    """`row_threads` threads normalize one row (32: a warp per row, ROWS_PER_WARP_CTA rows per CTA;
    more: the CTA), each holding `vectors` vectors of `vec` elements of the row in registers."""

    row_threads: int
    vec: int
    vectors: int

    @property
    def block(self) -> int:
        return self.row_threads * ROWS_PER_WARP_CTA if self.row_threads == 32 else self.row_threads

    @property
    def rows_per_block(self) -> int:
        return self.block // self.row_threads

    def describe(self) -> str:
        return f"{'warp' if self.row_threads == 32 else f'cta{self.row_threads}'}_v{self.vec}x{self.vectors}"


def row_layout(problem: NormProblem) -> RowLayout:
    vec = problem.alignment
    if problem.n <= WARP_MAX_N:
        threads = 32
    else:  # at most 16 elements per thread, 128..1024 threads
        per_16 = -(-problem.n // 16)
        threads = min(1024, max(128, (per_16 + 31) // 32 * 32))
    return RowLayout(threads, vec, -(-(problem.n // vec) // threads))


_SHORT = {**DTYPE_SHORT, None: "none"}


def _literal_name(value: float) -> str:
    return repr(float(value)).replace(".", "p").replace("-", "m").replace("+", "")


@dataclass(frozen=True)
class NormKernel:
    """One norm kernel: n, epsilon, the norm, dtypes and outputs are compiled in; rows are read at
    run time."""

    problem: NormProblem
    target: int = 80
    arch: int = 80  # plain CUDA (shuffles, 128-bit accesses): runs on every arch from sm_80
    selected_by: str = field(default="rule", compare=False)
    note: str = field(default="", compare=False)

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue()

    @property
    def layout(self) -> RowLayout:
        return row_layout(self.problem)

    @property
    def name(self) -> str:
        p = self.problem
        parts = [
            f"sm{self.arch}",
            "layernorm" if p.norm == "layer_norm" else "rmsnorm",
            f"n{p.n}",
            f"eps{_literal_name(p.epsilon)}",
            _SHORT[p.data_dtype],
        ]
        if p.residual:
            parts.append(f"add{_SHORT[p.residual_dtype]}to{_SHORT[p.sum_dtype]}")
        parts += [
            f"g{_SHORT[p.gamma_dtype]}",
            f"b{_SHORT[p.beta_dtype]}",
            f"{_SHORT[p.norm_dtype]}to{_SHORT[p.out_dtype]}",
        ]
        return "_".join([*parts, self.layout.describe()])


@dataclass(frozen=True)
class NormRegion(Region):
    kernel: NormKernel

    @property
    def kernels(self) -> tuple[NormKernel, ...]:
        return (self.kernel,)

    def report_row(self) -> dict:
        p = self.kernel.problem
        rows = p.rows if p.rows is not None else "dynamic"
        details = {
            "norm": p.norm,
            "epsilon": p.epsilon,
            "residual": p.residual,
            "output_roles": [role for role, _, _ in self.output_list],
            "flops": 0,  # memory-bound: not in the report's share of GEMM/conv FLOPs
        }
        return self._row("norm", [rows, p.n, 1], details)
