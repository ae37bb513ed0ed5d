"""What a depthwise conv2d region computes: problem, kernel and region records, and the output
tilings of its two kernel families (CUTLASS's direct convolution, relax_cutlass's own blocked one)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...toolkit.dtypes import DTYPE_SHORT
from ..epilogue import Epilogue
from ..nhwc import conv_geometry
from ..region import Region

# A launch's grid holds at most this many CTAs per channel group (CUDA's grid z limit).
MAX_GRID_Z = 65535


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

    def tiles(self, problem: DepthwiseProblem, n: int) -> int:
        """Output tiles of one channel group at batch n."""
        return n * -(-problem.p // self.tile_p) * -(-problem.q // self.tile_q)

    def one_tile_per_cta(self, _problem: DepthwiseProblem) -> bool:
        """Always: each threadblock of CUTLASS's direct convolution computes a single output tile
        (the glue launches every tile of the batch). Its mainloop (CUTLASS 4.2,
        depthwise_fprop_direct_conv_multistage.h) stages tile i's float32 sums for the epilogue in
        the shared-memory activation stage i % stages, and the epilogue ends without a barrier;
        tile i+1 then starts its cp.async prefetch into that same stage, so a fast warp overwrites
        sums a slower warp has not read yet. A CTA that computes several tiles writes a few wrong
        outputs: a 5x5 stride-1 conv at batch 32 (C = 120) on the H200, 7.2e-3 relative error
        against float64. Where the sums outgrow an activation stage (3x3 stride 1 on 8x8 tiles:
        12.8 KB of fp16 activations, 16 KB of sums) the epilogue also overruns the next stage,
        already loaded with the CTA's next tile (MobileNetV3 at batch 32: inf). With one tile per
        CTA neither can happen."""
        return True


@dataclass(frozen=True)
class BlockedTile:
    """The tiling of relax_cutlass's own register-blocked direct kernel (direct_templates.py): each
    CTA computes a tile_p x tile_q patch of output pixels of `groups_per_cta` channels of one image,
    each thread one channel pair's rows_per_thread x cols_per_thread block of it. Spelt
    "direct_p8q16g32t4x4" (tile= pins take it, the t part optional)."""

    tile_p: int = 8
    tile_q: int = 16
    groups_per_cta: int = 32
    rows_per_thread: int = 4
    cols_per_thread: int = 4

    family = "direct"

    def describe(self) -> str:
        return (
            f"direct_p{self.tile_p}q{self.tile_q}g{self.groups_per_cta}t{self.rows_per_thread}x{self.cols_per_thread}"
        )

    @property
    def threads(self) -> int:
        return self.groups_per_cta // 2 * (self.tile_p // self.rows_per_thread) * (self.tile_q // self.cols_per_thread)

    def halo_bytes(self, problem: DepthwiseProblem) -> int:
        """Shared memory of a CTA: its input halo of groups_per_cta 16-bit channels."""
        rows = (self.tile_p - 1) * problem.stride[0] + problem.r
        cols = (self.tile_q - 1) * problem.stride[1] + problem.s
        return rows * cols * self.groups_per_cta * 2

    def tiles(self, problem: DepthwiseProblem, n: int) -> int:
        """Output tiles of one channel group at batch n (the grid's x: one per CTA)."""
        return n * -(-problem.p // self.tile_p) * -(-problem.q // self.tile_q)

    def ctas(self, problem: DepthwiseProblem, n: int) -> int:
        return self.tiles(problem, n) * -(-problem.c // self.groups_per_cta)

    def one_tile_per_cta(self, _problem: DepthwiseProblem) -> bool:
        return False  # always: the grid holds every tile, counted at run time by the kernel


# Shared memory a direct kernel's CTA may take (static shared memory: no opt-in attribute).
MAX_HALO_BYTES = 48 * 1024


@dataclass(frozen=True)
class DepthwiseKernel:
    """One depthwise kernel: dtype, filter size, (fixed) stride and dilation, tile and epilogue are
    compiled in; N, H, W, C, P, Q and padding arrive at run time. The tile's type is the family
    (`direct`: relax_cutlass's blocked kernel, always fixed stride). `fixed_stride` False: stride and
    dilation are run-time values too (CUTLASS's kOptimized iterator, for any stride/dilation)."""

    problem: DepthwiseProblem
    epilogue: Epilogue
    tile: DirectConvTile | BlockedTile  # CUTLASS's direct convolution, or relax_cutlass's own
    fixed_stride: bool = True
    arch: int = 80  # CUTLASS 2.x SIMT with cp.async: runs on every arch from sm_80
    target: int = 80
    selected_by: str = field(default="heuristic", compare=False)
    note: str = field(default="", compare=False)

    @property
    def direct(self) -> bool:
        """Whether this is relax_cutlass's own blocked direct kernel (else CUTLASS's)."""
        return isinstance(self.tile, BlockedTile)

    @property
    def name(self) -> str:
        p = self.problem
        element = DTYPE_SHORT[p.element]
        acc = {"float32": "f32acc", "float16": "f16acc"}[p.element_accumulator]
        geometry = f"s{p.stride[0]}x{p.stride[1]}d{p.dilation[0]}x{p.dilation[1]}" if self.fixed_stride else "anystride"
        epi = self.epilogue.describe().replace("+", "_")
        return f"sm{self.arch}_dwconv2d_fprop_nhwc_{element}_{acc}_r{p.r}s{p.s}_{geometry}_{self.tile.describe()}_{epi}"


@dataclass(frozen=True)
class DepthwiseRegion(Region):
    kernel: DepthwiseKernel
    # CTAs along the output-tile loop per channel group (no reduction: a grid size); where the
    # kernel computes one tile per CTA (DirectConvTile.one_tile_per_cta), the glue sets it to the
    # number of tiles of the batch at run time
    split_k: int = 1

    @property
    def kernels(self) -> tuple[DepthwiseKernel, ...]:
        return (self.kernel,)

    def report_row(self) -> dict:
        p = self.kernel.problem
        m = p.n * p.p * p.q if p.n is not None else "dynamic"
        return self._row("dwconv2d", [m, p.c, p.r * p.s], {"conv": conv_geometry(p, self.split_k)})
