"""What a fused attention region computes (problem, kernel, region records), its tuning key and its
report line."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...toolkit.dtypes import DTYPE_SHORT
from ...toolkit.tuning import TuningKey
from ..epilogue import Epilogue, widest_vector
from ..region import Region, calls_suffix

# The axes of an attention's additive bias, in the order of `AttentionProblem.bias_reads`.
BIAS_AXES = ("B", "N", "S", "T")


# What a row whose every score is -inf (every key masked) gives: "nan" (the softmax's 0/0, what
# both TVM and the kernel compute), "zero" (torch's safe softmax) or "mean" (the mean of the
# values: a finite mask value swamped the scores, the softmax of the row is uniform). The index is
# the kernel ABI's `masked_rows`.
MASKED_ROWS = ("nan", "zero", "mean")


# TVM's causal masks as the kernel ABI's `causal` (0: none).
CAUSAL_CODE = {None: 0, "TopLeft": 1, "BottomRight": 2}


@dataclass(frozen=True)
class AttentionProblem:
    """softmax(Q K^T * scale) V per (batch, head): Q is (S, H), K (T, H), V (T, V) per head.

    Sizes are ints, or None where symbolic (read from the tensors at run time). Each `*_reads`
    gives, for (batch, rows, heads, head dim), the (dimension, element factor) of that packed
    parameter which holds it: the axis's stride is the dimension's stride times the factor, so
    ((0, 1), (1, 1), (2, 1), (3, 1)) is a BSNH tensor and ((0, 1), (1, 1), (2, 64), (2, 1)) the
    (B, S, N*64) projection the heads are split from. The output is always (B, S, N, V) in memory.

    `causal` is TVM's causal mask (see the field).

    `kv_group` is G of grouped-query attention: `heads` query heads share each of heads / G key
    and value heads, query head n reading kv head n // G (1: every head has its own). `key_reads`
    and `value_reads` then give the kv heads' axis for the heads.

    `slices` gives, for an operand that is a part of a larger parameter (q, k and v sliced out
    of one packed projection), (role, dimension, first element, the dimension's whole size): the
    kernel reads that dimension from its `first` element on, the other reads unchanged.

    `bias_reads`, when the scores get an additive mask/bias before the softmax, gives the same
    for its (batch, heads, query rows, keys), None where it is broadcast (stride 0); the kernel
    reads it in `element`. `masked_rows` is what a row whose every score is -inf gives: "nan"
    (the softmax's 0/0), "zero" (torch's safe softmax) or "mean" (the mean of the values).

    `softcap`, when the scores are soft-capped (Gemma-2, Grok: `cap * tanh(scores / cap)` before
    the mask), is c of `c * tanh(scale * q.k)`: the scale is then the tanh's, and the softmax takes
    the capped scores (plus any bias) unscaled.
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
    # TVM's causal mask of relax.nn.attention: None, "TopLeft" or "BottomRight". Query i sees key
    # j iff j <= i + offset, offset 0 (TopLeft) or |seq_q - seq_kv| (BottomRight; TVM's
    # legalization, which differs from flash-attention's bottom-right alignment when seq_q > seq_kv).
    causal: str | None = None
    kv_group: int = 1
    slices: tuple[tuple[str, int, int, int], ...] = ()
    softcap: float | None = None

    @property
    def kv_heads(self) -> int:
        return self.heads // self.kv_group

    @property
    def modifies_scores(self) -> bool:
        """A bias is added to the scores, or they are soft-capped, or both: on the SM90 kernel every
        key tile's scores go through its score step (emit_sm90's bias mainloop)."""
        return self.bias_reads is not None or self.softcap is not None

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
    """One fused multi-head attention kernel: a CTA takes `queries_per_block` query rows of one
    head and streams the keys in blocks of `keys_per_block`, with an online softmax.

    `arch` 80: CUTLASS example 41 (the xFormers forward kernel, mma.sync); only the dtype, the
    tile, the largest head dim (`max_head_dim`) and whether rows are 16-byte aligned are compiled
    in (a causal mask is a run-time argument). `arch` 90: CUTLASS example 88 (Hopper: TMA +
    wgmma, warp-specialized, `schedule` one of emit_sm90.SM90_SCHEDULES), compiled for one head dim
    (`max_head_dim`, q/k and v alike), one causal mask (the problem's) and with or without an
    additive bias (`bias`)."""

    problem: AttentionProblem
    queries_per_block: int
    keys_per_block: int
    max_head_dim: int
    aligned: bool
    arch: int = 80  # the kernel family: 80 (examples/41) or 90 (examples/88, sm_90a only)
    target: int = 80
    schedule: str = ""  # SM90: a key of emit_sm90.SM90_SCHEDULES
    epilogue: Epilogue = Epilogue()  # none: the region is the whole attention
    selected_by: str = field(default="heuristic", compare=False)
    note: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        element = DTYPE_SHORT[self.problem.element]
        if self.arch == 90:
            causal = {None: "", "TopLeft": "_causal_tl", "BottomRight": "_causal_br"}[self.problem.causal]
            grouped = "_gqa" if self.problem.kv_group > 1 else ""
            return (
                f"sm90_fmha_{element}_{self.schedule}_q{self.queries_per_block}_k{self.keys_per_block}_"
                f"h{self.max_head_dim}{causal}{grouped}"
                + ("_bias" if self.bias else "")
                + (f"_softcap{softcap_spelling(self.problem.softcap)}" if self.problem.softcap is not None else "")
            )
        return (
            f"sm{self.arch}_fmha_{element}_{'aligned' if self.aligned else 'a4'}_q{self.queries_per_block}_"
            f"k{self.keys_per_block}_maxk{self.max_head_dim}" + ("_bias" if self.bias else "")
        )

    @property
    def bias(self) -> bool:
        """Compiled with CUTLASS's attention bias (kSupportsBias): the problem adds a mask/bias."""
        return self.problem.bias_reads is not None


def softcap_spelling(cap: float) -> str:
    """A soft-cap value as a part of a C identifier (kernel names): 50 -> "50", 0.5 -> "0p5"."""
    return f"{float(np.float32(cap)):g}".replace(".", "p").replace("-", "m").replace("+", "")


@dataclass(frozen=True)
class AttentionRegion(Region):
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
        if p.causal is not None:
            attention["causal"] = p.causal
        if p.kv_group > 1:
            attention["kv_heads"] = p.kv_heads
        if p.softcap is not None:
            attention["softcap"] = p.softcap
        if p.slices:
            # q, k and v read in place out of one packed projection: role -> (dim, first, whole)
            attention["packed"] = {role: [dim, first, whole] for role, dim, first, whole in p.slices}
        # "mnk" of one head's first product, for the report's common columns.
        mnk = [attention["seq_q"], attention["seq_kv"], p.head_dim]
        return self._row("attention", mnk, {"attention": attention, "flops": p.flops()})


def report_line(r: dict) -> str:
    a = r["attention"]
    return (
        f"  [offloaded] attention B={a['batch']} N={a['heads']} "
        + (f"N_kv={a['kv_heads']} " if "kv_heads" in a else "")
        + f"S={a['seq_q']} S_kv={a['seq_kv']} "
        f"H={a['head_dim']}/{a['head_dim_value']} scale={a['scale']:.6g} "
        + (f"bias={a['bias']} masked_rows={a['masked_rows']} " if "bias" in a else "")
        + (f"causal={a['causal']} " if "causal" in a else "")
        + (f"softcap={a['softcap']:g} " if "softcap" in a else "")
        + f"{r['dtypes']['query']}->"
        f"{r['dtypes']['out']} (acc {r['dtypes']['accumulator']}) kernel={r['kernel']} "
        f"({r['selected_by']}{'; ' + r['note'] if r.get('note') else ''})" + calls_suffix(r)
    )


def attention_key(problem: AttentionProblem, arch: int, family: int = 80) -> TuningKey:
    """The key of a fused attention problem with static sizes on one kernel family (80: examples/41,
    90: examples/88). The kernels read q, k and v through strides, so one timing on BSNH tensors
    serves every layout; a causal mask is part of the geometry (it halves the work), and grouped-query
    keys/values of the layout (G query heads read each), as is soft-capping (a kernel of its own)."""
    p = problem
    layout = "bsnh" if p.kv_group == 1 else f"bsnh_kv_group{p.kv_group}"
    if p.softcap is not None:
        layout += f"_softcap{softcap_spelling(p.softcap)}"
    return TuningKey(
        arch=arch,
        op="attention",
        shape=(p.batch, p.seq_q, p.seq_kv, p.heads, p.head_dim, p.head_dim_value),
        geometry=() if p.causal is None else (CAUSAL_CODE[p.causal],),
        layout=layout,
        element=p.element,
        element_out=p.element,
        accumulator=p.element_accumulator,
        alignment=p.alignment,
        family=family,
    )
