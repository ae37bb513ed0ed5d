"""What a depthwise conv2d region computes: problem, kernel and region records, and the output
tiling the direct-convolution kernel runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..epilogue import Epilogue
from ..nhwc import conv_geometry
from ..region import Region


@dataclass(frozen=True)
class DepthwiseProblem:
    """NHWC activations x (C, R, S, 1) filters -> NHWC, one filter per channel (groups == C == K).

    Padding is the top/left padding; the output size P, Q is given, so reads past the bottom/right
    edge are zero-filled (asymmetric padding needs no extra state)."""

    n: int | None
    h: int
    w: int
    c: int
    r: int
    s: int
    p: int
    q: int
    pad: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    element: str = "float16"
    element_accumulator: str = "float32"  # the kernel sums R*S products in float32

    @property
    def k(self) -> int:
        return self.c

    @property
    def element_out(self) -> str:
        return self.element

    @property
    def alignment(self) -> int:
        return 8  # 128-bit channel accesses: C % 8 == 0 is a legality rule

    def flops(self, n: int | None = None) -> int:
        return 2 * (n or self.n or 1) * self.p * self.q * self.c * self.r * self.s


@dataclass(frozen=True)
class DirectConvTile:
    """How the direct convolution tiles the output: each threadblock computes an
    (1, tile_p, tile_q) patch of `groups_per_cta` channels with `warps` warps over its rows, its
    filter staged in `stages` cp.async stages."""

    tile_p: int = 8
    tile_q: int = 8
    groups_per_cta: int = 64
    warps: int = 4
    stages: int = 3

    def describe(self) -> str:
        return f"p{self.tile_p}q{self.tile_q}g{self.groups_per_cta}w{self.warps}s{self.stages}"


@dataclass(frozen=True)
class DepthwiseKernel:
    """One depthwise kernel: dtype, filter size, (fixed) stride and dilation, tile and epilogue are
    compiled in; N, H, W, C, P, Q and padding arrive at run time. `fixed_stride` False: stride and
    dilation are run-time values too (CUTLASS's kOptimized iterator, for any stride/dilation)."""

    problem: DepthwiseProblem
    epilogue: Epilogue
    tile: DirectConvTile
    fixed_stride: bool = True
    arch: int = 80  # CUTLASS 2.x SIMT with cp.async: runs on every arch from sm_80
    target: int = 80
    selected_by: str = field(default="heuristic", compare=False)
    note: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        p = self.problem
        element = {"float16": "f16", "bfloat16": "bf16"}[p.element]
        acc = {"float32": "f32acc", "float16": "f16acc"}[p.element_accumulator]
        geometry = f"s{p.stride[0]}x{p.stride[1]}d{p.dilation[0]}x{p.dilation[1]}" if self.fixed_stride else "anystride"
        epi = self.epilogue.describe().replace("+", "_")
        return f"sm{self.arch}_dwconv2d_fprop_nhwc_{element}_{acc}_r{p.r}s{p.s}_{geometry}_{self.tile.describe()}_{epi}"


@dataclass(frozen=True)
class DepthwiseRegion(Region):
    kernel: DepthwiseKernel
    split_k: int = 1  # CTAs along the output-tile loop per channel group (no reduction: a grid size)

    @property
    def kernels(self) -> tuple[DepthwiseKernel, ...]:
        return (self.kernel,)

    def report_row(self) -> dict:
        p = self.kernel.problem
        m = p.n * p.p * p.q if p.n is not None else "dynamic"
        return self._row("dwconv2d", [m, p.c, p.r * p.s], {"conv": conv_geometry(p, self.split_k)})
