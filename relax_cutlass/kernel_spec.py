"""What a kernel computes, as small frozen records.

Everything downstream of partitioning (kernel choice, C++ emission, compilation, the offload report)
reads these records instead of Relax IR, so each stage can be tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .arch import arch_name
from .templates import GELU16_FUNCTOR

# Relax dtype -> CUTLASS element type.
CUTLASS_ELEMENT = {
    "float16": "cutlass::half_t",
    "bfloat16": "cutlass::bfloat16_t",
    "float32": "float",
}
DTYPE_BITS = {"float16": 16, "bfloat16": 16, "float32": 32}


def widest_vector(*extents: int) -> int:
    """The widest 16-bit vector access (8, 4 or 2 elements; else 1) that divides every extent."""
    return next((w for w in (8, 4, 2) if all(e % w == 0 for e in extents)), 1)


@dataclass(frozen=True)
class Activation:
    """An elementwise activation applied in the epilogue, and the CUTLASS functor that computes it."""

    name: str
    functor: str
    # CUTLASS skips the source (bias) load when it can; "heavy" functors tell the epilogue to
    # evaluate them once per fragment rather than inline per element.
    is_heavy: bool = False
    # C++ defining `functor` (a template over the element or Array type), which every kernel TU
    # using it must contain: set for custom activations (relax_cutlass.extend), empty for CUTLASS's.
    definition: str = ""
    # A cheaper form, accurate to 16-bit outputs, for kernels that write fp16/bf16 (None: same form).
    narrow: Activation | None = None

    def for_output(self, element_out: str) -> Activation:
        """The form a kernel writing `element_out` instantiates."""
        return self.narrow if self.narrow is not None and DTYPE_BITS[element_out] == 16 else self


# log2(1 - Phi(t)) ~ sum(c[i] * t**i) for t >= 0: weighted minimax fit by scripts/fit_gelu16.py.
GELU16_LOG2_TAIL = (-1.00012076, -1.14917588, -0.464120954, -0.0482372046, 0.00582726812, -0.000320508756)
_GELU16 = Activation(
    "gelu16",
    "RelaxCutlassGelu16",
    is_heavy=True,
    definition=GELU16_FUNCTOR.substitute(
        functor="RelaxCutlassGelu16", **{f"c{i}": f"{c:.9g}" for i, c in enumerate(GELU16_LOG2_TAIL)}
    ),
)


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation("identity", "cutlass::epilogue::thread::Identity"),
        Activation("relu", "cutlass::epilogue::thread::ReLu"),
        # erf form, as R.nn.gelu and the decomposed 0.5*x*(1+erf(x/sqrt(2))); erff for float32
        # outputs, the polynomial form (within 1 ulp, about a third of the instructions) for 16-bit.
        Activation("gelu", "cutlass::epilogue::thread::GELU", is_heavy=True, narrow=_GELU16),
        # tanh form, as R.nn.gelu_tanh.
        Activation("gelu_tanh", "cutlass::epilogue::thread::GELU_taylor", is_heavy=True),
        Activation("silu", "cutlass::epilogue::thread::SiLu", is_heavy=True),
        Activation("sigmoid", "cutlass::epilogue::thread::Sigmoid", is_heavy=True),
        # x * relu6(x + 3) / 6, as PyTorch's Hardswish (frontends decompose it; see patterns).
        Activation("hardswish", "cutlass::epilogue::thread::HardSwish", is_heavy=True),
    )
}


@dataclass(frozen=True)
class Epilogue:
    """D = post(act(acc + bias) + residual), cast to the output dtype.

    `post` is only meaningful with a residual (the ResNet/Transformer `relu(x + f(x))` shape).
    """

    bias: bool = False
    activation: str = "identity"
    residual: bool = False
    residual_activation: str = "identity"

    def __post_init__(self) -> None:
        for name in (self.activation, self.residual_activation):
            if name not in ACTIVATIONS:
                raise ValueError(f"unknown epilogue activation {name!r}; known: {sorted(ACTIVATIONS)}")
        if self.residual_activation != "identity" and not self.residual:
            raise ValueError("a post-residual activation needs a residual")

    def parts(self) -> list[str]:
        """The fused steps in order, e.g. ["bias", "gelu", "residual_add", "relu"]."""
        steps = [
            ("bias", self.bias),
            (self.activation, self.activation != "identity"),
            ("residual_add", self.residual),
            (self.residual_activation, self.residual_activation != "identity"),
        ]
        return [name for name, present in steps if present]

    def describe(self) -> str:
        return "+".join(self.parts()) or "none"

    def functors(self, element_out: str) -> tuple[Activation, Activation]:
        """(activation, post-residual activation) in the forms a kernel writing `element_out` uses."""
        return tuple(ACTIVATIONS[name].for_output(element_out) for name in (self.activation, self.residual_activation))

    def definitions(self, element_out: str) -> str:
        """The C++ definitions of the functors this epilogue uses that CUTLASS does not define."""
        return "".join(dict.fromkeys(a.definition for a in self.functors(element_out)))


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
        out = {"float16": "f16", "float32": "f32", "bfloat16": "bf16"}[p.element_out]
        inputs = "" if p.element_a == "float16" else "bf16in_"  # fp16 inputs are the unmarked default
        return f"sm{self.arch}_gemm_{layout}_{inputs}{acc}_{out}out_a{p.alignment}_{self.tile.describe()}_{epi}"


@dataclass(frozen=True)
class Conv2dProblem:
    """An NHWC x OHWI -> NHWC forward convolution (groups == 1); the batch N may be unknown.

    CUTLASS runs it as an implicit GEMM of M = N*P*Q, N = K, K = C*R*S. Padding is the top/left
    padding: with the output size P, Q given explicitly, reads past the bottom/right edge are
    zero-filled, so asymmetric padding needs no extra state.
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

    @property
    def element_out(self) -> str:
        return self.element

    @property
    def alignment(self) -> int:
        """Widest vector access (in elements) legal for activations (C) and output (K)."""
        return widest_vector(self.c, self.k)

    def implicit_gemm(self, n_hint: int = 1) -> GemmProblem:
        """The GEMM this convolution runs as (row-major activations x (K, CRS) filter)."""
        batch = self.n if self.n is not None else n_hint
        return GemmProblem(
            m=batch * self.p * self.q,
            n=self.k,
            k=self.c * self.r * self.s,
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
    dtypes, alignment, epilogue, tile and iterator are compiled in; the problem size (and the
    split-K slice count) arrive at run time."""

    problem: Conv2dProblem
    epilogue: Epilogue
    tile: TileConfig
    iterator: str = "optimized"  # cutlass::conv::IteratorAlgorithm: "optimized" | "analytic"
    arch: int = 80
    target: int = 80
    selected_by: str = field(default="heuristic", compare=False)
    note: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        p = self.problem
        acc = {"float32": "f32acc", "float16": "f16acc"}[p.element_accumulator]
        element = {"float16": "f16", "bfloat16": "bf16"}[p.element]
        epi = self.epilogue.describe().replace("+", "_")
        return (
            f"sm{self.arch}_conv2d_fprop_nhwc_{element}_{acc}_a{p.alignment}_{self.iterator}_"
            f"{self.tile.describe()}_{epi}"
        )


@dataclass(frozen=True)
class _Region:
    """One offloaded function: its external symbol, kernel, and the role of each runtime argument."""

    symbol: str
    kernel: GemmKernel | Conv2dKernel
    # Role of each function parameter, in order: "lhs"/"rhs" or "data"/"weight", "bias", "residual".
    arg_roles: tuple[str, ...]
    # Shapes as written in the IR (ints, or names of symbolic dims), for checks and the report.
    arg_shapes: tuple[tuple[int | str, ...], ...]
    arg_dtypes: tuple[str, ...]
    out_shape: tuple[int | str, ...]
    out_dtype: str
    composite: str
    # (role, role of the parameter that also plays it): one tensor in two roles, as the residual of
    # y = act(x @ w + b) + x is the lhs.
    role_aliases: tuple[tuple[str, str], ...] = ()

    @property
    def roles(self) -> set[str]:
        """Every role some parameter plays."""
        return set(self.arg_roles) | {alias for alias, _ in self.role_aliases}

    def _row(self, op: str, mnk: list, details: dict) -> dict:
        """The report row: what every region reports, with `details` before the kernel columns."""
        return {
            "symbol": self.symbol,
            "op": op,
            "composite": self.composite,
            "epilogue": self.kernel.epilogue.describe(),
            "shapes": {r: list(s) for r, s in zip(self.arg_roles, self.arg_shapes, strict=True)},
            "out_shape": list(self.out_shape),
            "dtypes": {r: d for r, d in zip(self.arg_roles, self.arg_dtypes, strict=True)}
            | {"out": self.out_dtype, "accumulator": self.kernel.problem.element_accumulator},
            "mnk": mnk,
            **details,
            "kernel": self.kernel.name,
            # the kernel family ("sm80": CUTLASS 2.x mma.sync, "sm90": 3.x wgmma) and the SASS it is built as
            "family": f"sm{self.kernel.arch}",
            "target": arch_name(self.kernel.target),
            "selected_by": self.kernel.selected_by,
            "note": self.kernel.note,  # why this family, where the target's own is not it
        }


@dataclass(frozen=True)
class GemmRegion(_Region):
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


@dataclass(frozen=True)
class Conv2dRegion(_Region):
    kernel: Conv2dKernel
    split_k: int = 1  # serial split-K slices (1: none), chosen for this region's shape

    @property
    def kernels(self) -> tuple[Conv2dKernel, ...]:
        return (self.kernel,)

    def report_row(self) -> dict:
        p = self.kernel.problem
        gemm = p.implicit_gemm()
        conv = {
            "kernel_size": [p.r, p.s],
            "stride": list(p.stride),
            "padding": list(p.pad),
            "dilation": list(p.dilation),
            "split_k": self.split_k,
        }
        return self._row("conv2d", [gemm.m if p.n is not None else "dynamic", gemm.n, gemm.k], {"conv": conv})


# The axes of an attention's additive bias, in the order of `AttentionProblem.bias_reads`.
BIAS_AXES = ("B", "N", "S", "T")
# What a row whose every score is -inf (every key masked) gives: "nan" (the softmax's 0/0, what
# both TVM and the kernel compute), "zero" (torch's safe softmax) or "mean" (the mean of the
# values: a finite mask value swamped the scores, the softmax of the row is uniform). The index is
# the kernel ABI's `masked_rows`.
MASKED_ROWS = ("nan", "zero", "mean")
# The kernel loads the bias 128 bits at a time (its BiasLoader), whatever its own alignment: rows
# of keys must be whole vectors of 16-bit elements.
BIAS_VECTOR = 8


@dataclass(frozen=True)
class AttentionProblem:
    """softmax(Q K^T * scale) V per (batch, head): Q is (S, H), K (T, H), V (T, V) per head.

    Sizes are ints, or None where symbolic (read from the tensors at run time). Each `*_reads`
    gives, for (batch, rows, heads, head dim), the (dimension, element factor) of that packed
    parameter which holds it: the axis's stride is the dimension's stride times the factor, so
    ((0, 1), (1, 1), (2, 1), (3, 1)) is a BSNH tensor and ((0, 1), (1, 1), (2, 64), (2, 1)) the
    (B, S, N*64) projection the heads are split from. The output is always (B, S, N, V) in memory.

    `bias_reads`, when the scores get an additive mask/bias before the softmax, gives the same
    for its (batch, heads, query rows, keys), None where it is broadcast (stride 0); the kernel
    reads it in `element`. `masked_rows` is what a row whose every score is -inf gives: "nan"
    (the softmax's 0/0), "zero" (torch's safe softmax) or "mean" (the mean of the values).
    """

    batch: int | None
    heads: int
    seq_q: int | None
    seq_kv: int | None
    head_dim: int
    head_dim_value: int
    scale: float
    element: str = "float16"
    query_reads: tuple[tuple[int, int], ...] = ((0, 1), (1, 1), (2, 1), (3, 1))
    key_reads: tuple[tuple[int, int], ...] = ((0, 1), (1, 1), (2, 1), (3, 1))
    value_reads: tuple[tuple[int, int], ...] = ((0, 1), (1, 1), (2, 1), (3, 1))
    element_accumulator: str = "float32"  # the kernel's softmax and both products run in fp32
    bias_reads: tuple[tuple[int, int] | None, ...] | None = None
    masked_rows: str = "nan"

    @property
    def alignment(self) -> int:
        """Widest vector access of q/k/v/out rows (in elements)."""
        return widest_vector(self.head_dim, self.head_dim_value)

    def flops(self) -> int | None:
        if None in (self.batch, self.seq_q, self.seq_kv):
            return None
        return 2 * self.batch * self.heads * self.seq_q * self.seq_kv * (self.head_dim + self.head_dim_value)


@dataclass(frozen=True)
class AttentionKernel:
    """One fused multi-head attention kernel (CUTLASS example 41, the xFormers forward kernel):
    a CTA takes `queries_per_block` query rows of one head and streams the keys in blocks of
    `keys_per_block`, with an online softmax. Only the dtype, the tile, the largest head dim
    (`max_head_dim`) and whether rows are 16-byte aligned are compiled in."""

    problem: AttentionProblem
    queries_per_block: int
    keys_per_block: int
    max_head_dim: int
    aligned: bool
    arch: int = 80  # the SM80 tensor-op kernel; it is also what runs on sm_90a
    target: int = 80
    epilogue: Epilogue = Epilogue()  # none: the region is the whole attention
    selected_by: str = field(default="heuristic", compare=False)
    note: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        element = {"float16": "f16", "bfloat16": "bf16"}[self.problem.element]
        return (
            f"sm{self.arch}_fmha_{element}_{'aligned' if self.aligned else 'a4'}_q{self.queries_per_block}_"
            f"k{self.keys_per_block}_maxk{self.max_head_dim}" + ("_bias" if self.bias else "")
        )

    @property
    def bias(self) -> bool:
        """Compiled with CUTLASS's attention bias (kSupportsBias): the problem adds a mask/bias."""
        return self.problem.bias_reads is not None


@dataclass(frozen=True)
class AttentionRegion(_Region):
    kernel: AttentionKernel

    @property
    def kernels(self) -> tuple[AttentionKernel, ...]:
        return (self.kernel,)

    def report_row(self) -> dict:
        p = self.kernel.problem
        attention = {
            "batch": p.batch if p.batch is not None else "dynamic",
            "heads": p.heads,
            "seq_q": p.seq_q if p.seq_q is not None else "dynamic",
            "seq_kv": p.seq_kv if p.seq_kv is not None else "dynamic",
            "head_dim": p.head_dim,
            "head_dim_value": p.head_dim_value,
            "scale": p.scale,
        }
        if p.bias_reads is not None:
            # The bias's shape as the kernel reads it: a broadcast axis shows as 1.
            attention["bias"] = "".join(a if r is not None else "1" for a, r in zip("BNST", p.bias_reads, strict=True))
            attention["masked_rows"] = p.masked_rows
        # "mnk" of one head's first product, for the report's common columns.
        mnk = [attention["seq_q"], attention["seq_kv"], p.head_dim]
        return self._row("attention", mnk, {"attention": attention, "flops": p.flops()})
