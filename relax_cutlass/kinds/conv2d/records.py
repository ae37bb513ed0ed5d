"""What a conv2d region computes: problem (with its implicit-GEMM view), kernel and region records,
and its tuning key."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...toolkit.dtypes import DTYPE_SHORT
from ...toolkit.tuning import TuningKey
from ..epilogue import Epilogue, widest_vector
from ..gemm.records import GemmProblem, TileConfig
from ..nhwc import conv_geometry
from ..region import Region
from .groups import group_mode, grouped_kernel_problems, iterator_for

# The schedule of CUTLASS 3.x SM90 conv kernels: `KernelImplicitTmaWarpSpecializedSm90`, the one
# CUTLASS 4.2 implements (its persistent cooperative / ping-pong conv schedules are declared and
# static_assert'ed "not supported for conv yet").
SM90_CONV_SCHEDULE = "warpspecialized"
# A conv tile's schedule -> its kernel family; every other schedule ("multistage") is SM80's.
CONV_FAMILY_OF_SCHEDULE = {SM90_CONV_SCHEDULE: 90, "1sm": 100, "2sm": 100}


def conv_family(tile: TileConfig) -> int:
    """The kernel family of a conv2d tile: 90 (SM90 wgmma), 100 (SM100 tcgen05) or 80."""
    return CONV_FAMILY_OF_SCHEDULE.get(tile.schedule, 80)


@dataclass(frozen=True)
class Conv2dProblem:
    """An NHWC x OHWI -> NHWC forward convolution; the batch N may be unknown. With groups > 1 the
    filter is (K, R, S, C/groups): output channel k reads only the C/groups input channels of its
    group, k // (K/groups).

    CUTLASS runs it as an implicit GEMM of M = N*P*Q, N = K, K = (C/groups)*R*S. Padding is the
    top/left padding: with the output size P, Q given explicitly, reads past the bottom/right edge
    are zero-filled, so asymmetric padding needs no extra state.
    """

    n: int | None
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    p: int
    q: int
    pad: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    element: str = "float16"  # activations, filters and output
    element_accumulator: str = "float32"
    groups: int = 1  # 1: every output channel reads every input channel

    @property
    def element_out(self) -> str:
        return self.element

    @property
    def channels_per_group(self) -> int:
        return self.c // self.groups

    @property
    def k_per_group(self) -> int:
        return self.k // self.groups

    @property
    def alignment(self) -> int:
        """Widest vector access (in elements) legal for activations and filters (read group by
        group: C/groups) and output (K)."""
        return widest_vector(self.channels_per_group, self.k)

    def implicit_gemm(self, n_hint: int = 1) -> GemmProblem:
        """The GEMM this convolution runs as (row-major activations x (K, CRS) filter)."""
        batch = self.n if self.n is not None else n_hint
        return GemmProblem(
            m=batch * self.p * self.q,
            n=self.k,
            k=self.channels_per_group * self.r * self.s,
            b_transposed=True,
            element_a=self.element,
            element_b=self.element,
            element_out=self.element,
            element_accumulator=self.element_accumulator,
        )

    def flops(self, n: int | None = None) -> int:
        return self.implicit_gemm(n or self.n or 1).flops()


@dataclass(frozen=True)
class Conv2dKernel:
    """One conv2d fprop kernel to instantiate. Like a GEMM kernel, it is shape-agnostic: only the
    dtypes, alignment, epilogue, tile, group mode and iterator are compiled in; the problem size
    (groups included, and the split-K slice count) arrives at run time.

    The group mode and the iterator follow from the problem and the tile (groups.group_mode,
    groups.iterator_for), so that a kernel record given another tile (the profiler's stage 2)
    never compiles a mode its tile cannot run; a tile that fits no mode is refused here.

    The family (`arch`) follows from the tile too (`conv_family`): a "warpspecialized" tile is a
    CUTLASS 3.x SM90 kernel (TMA im2col + wgmma), a "1sm" / "2sm" one an SM100 kernel (TMA im2col +
    tcgen05: emit_3x.py), any other an SM80 implicit GEMM."""

    problem: Conv2dProblem
    epilogue: Epilogue
    tile: TileConfig
    target: int = 80
    selected_by: str = field(default="heuristic", compare=False)
    note: str = field(default="", compare=False)

    @property
    def arch(self) -> int:
        """The kernel family: the tile's (so a copy with another tile, the profiler's stage 2, is
        that tile's family)."""
        return conv_family(self.tile)

    def __post_init__(self):
        p = self.problem
        if self.arch != 80 and p.groups > 1:
            raise ValueError(f"no SM{self.arch} conv2d kernel for groups={p.groups}: CUTLASS 3.x convs are ungrouped")
        if reasons := grouped_kernel_problems(p.groups, p.k, self.tile.threadblock[1], self.epilogue.residual):
            raise ValueError(f"no grouped conv2d kernel for {p} with tile {self.tile.describe()}: {'; '.join(reasons)}")

    @property
    def group_mode(self) -> str:
        """cutlass::conv::GroupMode: "none" (groups == 1), "single" or "multiple"."""
        return group_mode(self.problem.groups, self.problem.k, self.tile.threadblock[1])

    @property
    def iterator(self) -> str:
        """cutlass::conv::IteratorAlgorithm: "optimized" | "analytic" (CUTLASS 3.x: "im2col", TMA's)."""
        if self.arch != 80:
            return "im2col"
        return iterator_for(self.group_mode, self.problem.r, self.problem.s)

    @property
    def name(self) -> str:
        p = self.problem
        acc = {"float32": "f32acc", "float16": "f16acc"}[p.element_accumulator]
        element = DTYPE_SHORT[p.element]
        epi = self.epilogue.describe().replace("+", "_")
        groups = "" if self.group_mode == "none" else f"{self.group_mode}group_"
        return (
            f"sm{self.arch}_conv2d_fprop_nhwc_{element}_{acc}_a{p.alignment}_{self.iterator}_{groups}"
            f"{self.tile.describe()}_{epi}"
        )


@dataclass(frozen=True)
class Conv2dRegion(Region):
    kernel: Conv2dKernel
    split_k: int = 1  # serial split-K slices (1: none), chosen for this region's shape

    @property
    def kernels(self) -> tuple[Conv2dKernel, ...]:
        return (self.kernel,)

    def report_row(self) -> dict:
        p = self.kernel.problem
        gemm = p.implicit_gemm()
        return self._row(
            "conv2d",
            [gemm.m if p.n is not None else "dynamic", gemm.n, gemm.k],
            {"conv": conv_geometry(p, self.split_k) | {"groups": p.groups}},
        )


def conv2d_key(problem: Conv2dProblem, arch: int, family: int = 80) -> TuningKey:
    """The key of a conv2d fprop problem (static batch). `family`: the newest kernel family among
    its candidates (90 / 100: CUTLASS 3.x and SM80 kernels were timed), so records timed without SM90 kernels do
    not stand for those timed with them. The group count ends the geometry of grouped convs only,
    so ungrouped ones keep their records' keys."""
    p = problem
    return TuningKey(
        arch=arch,
        op="conv2d",
        shape=(p.n, p.h, p.w, p.c, p.k, p.r, p.s, p.p, p.q),
        geometry=(*p.pad, *p.stride, *p.dilation, *((p.groups,) if p.groups > 1 else ())),
        layout="nhwc",
        element=p.element,
        element_out=p.element,
        accumulator=p.element_accumulator,
        alignment=p.alignment,
        family=family,
    )
