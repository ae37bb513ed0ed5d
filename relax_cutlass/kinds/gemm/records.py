"""What a GEMM region computes: problem, tile configuration, kernel and region records, and its
tuning key."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...toolkit.dtypes import DTYPE_SHORT
from ...toolkit.tuning import TuningKey
from ..epilogue import Epilogue, widest_vector
from ..region import Region


@dataclass(frozen=True)
class GemmProblem:
    """A row-major (M, K) x (K, N) product; M may be unknown until run time."""

    m: int | None
    n: int
    k: int
    b_transposed: bool  # B is stored as (N, K) (a "dense" weight), i.e. column-major (K, N)
    element_a: str = "float16"
    element_b: str = "float16"
    element_out: str = "float16"
    element_accumulator: str = "float32"

    @property
    def alignment(self) -> int:
        """Widest vector access (in elements) legal for A, B and D: K and N must be multiples of it."""
        return widest_vector(self.k, self.n)

    def flops(self, m: int | None = None) -> int:
        return 2 * (m if m is not None else (self.m or 0)) * self.n * self.k


# SM90 split-K (TileConfig.scheduler == "splitk"): the most slices, and the fewest main-loop
# iterations a slice keeps. The slice count itself is set per call (emit_sm90.SPLIT_K_ARGUMENTS).
SPLIT_K_MAX_SLICES = 16


SPLIT_K_MIN_ITERATIONS = 4


@dataclass(frozen=True)
class TileConfig:
    """One kernel configuration (a cutlass_library TileDescription plus schedule, flattened).

    SM80 (CUTLASS 2.x): threadblock, warps, stages, swizzle. SM90 (CUTLASS 3.x): threadblock is
    the CTA tile, plus the cluster shape, the warp-specialized schedule ("cooperative" or
    "pingpong") and the tile scheduler ("default" persistent, "streamk", or "splitk": the stream-K
    scheduler in split-K mode, its slice count set at run time from the shape); stages=0 lets the
    collective builder fill the shared memory left by the epilogue.
    """

    threadblock: tuple[int, int, int]
    warps: tuple[int, int, int] = (1, 1, 1)
    stages: int = 0
    instruction: tuple[int, int, int] = (16, 8, 16)
    swizzle: int = 8  # GemmIdentityThreadblockSwizzle<N> (SM80)
    split_k: int = 1
    cluster: tuple[int, int, int] = (1, 1, 1)
    schedule: str = "multistage"  # SM80: "multistage"; SM90: "cooperative" | "pingpong"
    scheduler: str = "default"  # SM90: "default" | "streamk" | "splitk"
    epilogue_tile: tuple[int, int] | None = None  # SM90: the epilogue's subtile (M, N); None: CUTLASS's

    def describe(self) -> str:
        tb = "x".join(map(str, self.threadblock))
        if self.schedule != "multistage":
            cluster = "x".join(map(str, self.cluster))
            scheduler = "" if self.scheduler == "default" else f"_{self.scheduler}"
            epilogue = "" if self.epilogue_tile is None else "_epi{}x{}".format(*self.epilogue_tile)
            return f"tb{tb}_c{cluster}_{self.schedule}{scheduler}{epilogue}"
        warps = "x".join(map(str, self.warps))
        split = f"_splitk{self.split_k}" if self.split_k > 1 else ""
        return f"tb{tb}_w{warps}_s{self.stages}_swz{self.swizzle}{split}"


# TileConfig.describe()'s spellings (the `tile=` option): CUTLASS 2.x multistage, then 3.x
TILE_SPELLING = (
    r"tb\d+x\d+x\d+_(w\d+x\d+x\d+_s\d+_swz\d+(_splitk\d+)?|c\d+x\d+x\d+_[a-z0-9]+(_[a-z]+)?(_epi\d+x\d+)?)",
    "tb128x128x32_w2x2x1_s3_swz8, tb128x128x64_c1x1x1_cooperative",
)


@dataclass(frozen=True)
class GemmKernel:
    """One kernel to instantiate: problem class (dtypes, layout, alignment) + epilogue + tile."""

    problem: GemmProblem
    epilogue: Epilogue
    tile: TileConfig
    arch: int = 80  # kernel family: 80 = CUTLASS 2.x tensor-op (runs on SM80+), 90 = CUTLASS 3.x wgmma
    target: int = 80  # the SM the object is compiled for (sm_90a runs the SM80 family too)
    selected_by: str = field(default="heuristic", compare=False)
    note: str = field(default="", compare=False)  # e.g. why an SM90 target got an SM80 kernel

    @property
    def name(self) -> str:
        p = self.problem
        layout = "tn" if p.b_transposed else "nn"
        acc = {"float32": "f32acc", "float16": "f16acc"}[p.element_accumulator]
        epi = self.epilogue.describe().replace("+", "_")
        out = DTYPE_SHORT[p.element_out]
        inputs = "" if p.element_a == "float16" else "bf16in_"  # fp16 inputs are the unmarked default
        return f"sm{self.arch}_gemm_{layout}_{inputs}{acc}_{out}out_a{p.alignment}_{self.tile.describe()}_{epi}"


@dataclass(frozen=True)
class GemmRegion(Region):
    kernel: GemmKernel
    # Symbolic M with tuning records: (largest M, kernel) pairs in increasing M, the last one for
    # every larger M; the glue picks by the run-time M. Empty: `kernel` for every M.
    dispatch: tuple[tuple[int, GemmKernel], ...] = ()

    @property
    def kernels(self) -> tuple[GemmKernel, ...]:
        return tuple(k for _, k in self.dispatch) or (self.kernel,)

    def report_row(self) -> dict:
        p = self.kernel.problem
        dispatch = [{"max_m": m, "kernel": k.name, "selected_by": k.selected_by} for m, k in self.dispatch]
        mnk = [p.m if p.m is not None else "dynamic", p.n, p.k]
        row = self._row("dense" if p.b_transposed else "matmul", mnk, {})
        return row | ({"dispatch": dispatch} if dispatch else {})


def gemm_key(problem: GemmProblem, arch: int, family: int, m: int) -> TuningKey:
    """The key of a GEMM problem class at M = `m` (M is part of the key: tiles depend on it)."""
    return TuningKey(
        arch=arch,
        op="gemm",
        shape=(m, problem.n, problem.k),
        geometry=(),
        layout="tn" if problem.b_transposed else "nn",
        element=problem.element_a,
        element_out=problem.element_out,
        accumulator=problem.element_accumulator,
        alignment=problem.alignment,
        family=family,
    )
