"""The fused attention kernel: its family (sm_90a: CUTLASS examples/88's Hopper kernel where it can
run the problem, else examples/41's SM80 kernel, with the reason) and tile (queries x keys per CTA),
chosen by head dim and occupancy, or by the tuning database."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext

from ...arch import family_note, native_family, resolve_family
from .. import PlanError
from ..gemm.select import stage_record, under_fills
from .emit_sm90 import SM90_BIAS_SCHEDULES
from .records import AttentionKernel, AttentionProblem, attention_key

ATTENTION_TILES = ((64, 64), (32, 128))  # (queries, keys) per CTA: xFormers' forward configurations


def attention_tiles(problem: AttentionProblem) -> list[tuple[int, int]]:
    """The (queries, keys) tiles that can run `problem`: 64 x 64 keeps at most 64 value columns
    in registers, so wider heads have only 32 x 128."""
    return [t for t in ATTENTION_TILES if problem.head_dim_value <= 64 or t[1] == 128]


# CUTLASS examples/88 (Hopper FMHA forward, fp16/bf16): the warp-specialized CTA tiles
# (queries, keys) per head dim (q/k and v alike), the heuristic's first. At head dim 128 the
# runner's 128 x 128; at head dim 64 FlashAttention 3's 128 x 128 (half the softmax rescales per
# key) before the runner's 128 x 64; at head dim 256 (Gemma) the runner's one tile, 128 x 64 (its
# 128 x 128 is built for FP8 only). Its head dim 32 is not taken (32 runs padded to 64, measured).
SM90_ATTENTION_TILES = {64: ((128, 128), (128, 64)), 128: ((128, 128),), 256: ((128, 64),)}
# Head dims with SM90 tiles of their own that the heuristic does not yet run on the SM90 kernel:
# the SM80 kernel, with the SM90 candidates timed beside it when profiling (as for the padded head
# dims outside SM90_PADDED_FIRST), until measured faster. None now: head dim 256's cooperative
# 128 x 64 kernel ran 3.9-4.7x the SM80 kernel on the H200 (fp16, seq 1024-4096, causal and not:
# 422-695 TFLOP/s, 0.92-0.99x torch's sdpa, against 130-153 TFLOP/s, 0.21-0.29x;
# bench/results/2026-12-02-attention-sdpa-h256-nvidia-h200.json).
SM90_UNMEASURED_HEAD_DIMS: set[int] = set()
# emit_sm90.SM90_SCHEDULES' names; profiling times them all
SM90_ATTENTION_SCHEDULES = ("cooperative", "pingpong", "cooperative_locked", "pingpong_locked")
# The heuristic's schedule per head dim, as measured on the H100 (fp16, seq 4096 and 8192, causal
# and not, bench/results/2026-11-27-attention-sdpa-candidates-nvidia-h100.json): at
# head dim 64 pingpong 128 x 128 ran at 366-425 TFLOP/s against cooperative 128 x 64's 312-358
# (0.85-0.98x torch's sdpa instead of 0.73-0.84x); at head dim 128 cooperative stays first
# (569 TFLOP/s causal at 4096 against pingpong's 506).
SM90_ATTENTION_FIRST_SCHEDULE = {64: "pingpong", 128: "cooperative"}


# The schedules a head dim's kernel fits in shared memory with: at head dim 256 only the
# cooperative ones (as examples/88 builds it); its ping-pong kernels need more than the 227 KiB a
# CTA may opt in to on an H100/H200 (cudaFuncSetAttribute fails, measured on the H200).
SM90_HEAD_DIM_SCHEDULES = {256: ("cooperative", "cooperative_locked")}


def _schedules(head_dim: int) -> tuple[str, ...]:
    """The head dim's schedules that fit, the heuristic's (or the forced) first."""
    fits = SM90_HEAD_DIM_SCHEDULES.get(head_dim, SM90_ATTENTION_SCHEDULES)
    first = SM90_ATTENTION_FIRST_SCHEDULE.get(head_dim, fits[0])
    ordered = (first, *(s for s in SM90_ATTENTION_SCHEDULES if s != first))
    return tuple(s for s in ordered if s in fits)


@contextmanager
def sm90_candidate_first(
    schedule: str,
    tile: tuple[int, int] | None = None,
    padded_head_dims: Iterable[int] = (),
    bias_head_dims: Iterable[int] = (),
    measured_head_dims: Iterable[int] = (),
) -> Iterator[None]:
    """Within the block, `schedule` (one of SM90_ATTENTION_SCHEDULES, at every head dim) and `tile`
    (at the head dims that have it; elsewhere the heuristic's tile) come first among the SM90
    candidates, so the heuristic takes them, `padded_head_dims` run on the SM90 kernel padded
    (as if in SM90_PADDED_FIRST), attention with a bias at `bias_head_dims` on the SM90 kernel
    (as if in SM90_BIAS_FIRST, at any number of queries) and the head dims `measured_head_dims` on
    their own SM90 tiles (as if out of SM90_UNMEASURED_HEAD_DIMS): how the GPU tests and
    bench/attention_sdpa.py run one candidate without profiling."""
    firsts, tiles = dict(SM90_ATTENTION_FIRST_SCHEDULE), dict(SM90_ATTENTION_TILES)
    padded, unmeasured = set(SM90_PADDED_FIRST), set(SM90_UNMEASURED_HEAD_DIMS)
    SM90_ATTENTION_FIRST_SCHEDULE.update({hd: schedule for hd in tiles})
    SM90_PADDED_FIRST.update(padded_head_dims)
    SM90_UNMEASURED_HEAD_DIMS.difference_update(measured_head_dims)
    if tile is not None:
        SM90_ATTENTION_TILES.update({hd: tuple(sorted(ts, key=lambda t: t != tile)) for hd, ts in tiles.items()})
    bias_head_dims = set(bias_head_dims)
    biased = sm90_bias_head_dims(SM90_BIAS_FIRST | bias_head_dims, 0) if bias_head_dims else nullcontext()
    try:
        with biased:
            yield
    finally:
        SM90_ATTENTION_FIRST_SCHEDULE.clear()
        SM90_ATTENTION_FIRST_SCHEDULE.update(firsts)
        SM90_ATTENTION_TILES.update(tiles)
        SM90_PADDED_FIRST.clear()
        SM90_PADDED_FIRST.update(padded)
        SM90_UNMEASURED_HEAD_DIMS.clear()
        SM90_UNMEASURED_HEAD_DIMS.update(unmeasured)


@contextmanager
def sm90_bias_head_dims(head_dims: Iterable[int], min_queries: int | None = None) -> Iterator[None]:
    """Within the block, the heuristic runs attention with a mask/bias on the SM90 kernel at the
    kernel head dims `head_dims` only (none: the SM80 kernel runs every one), as SM90_BIAS_FIRST
    would, and from `min_queries` queries on (as SM90_BIAS_MIN_QUERIES; 0: any number): how the
    GPU tests check both kernels on one graph."""
    global SM90_BIAS_MIN_QUERIES
    saved, saved_min = set(SM90_BIAS_FIRST), SM90_BIAS_MIN_QUERIES
    SM90_BIAS_FIRST.clear()
    SM90_BIAS_FIRST.update(head_dims)
    if min_queries is not None:
        SM90_BIAS_MIN_QUERIES = min_queries
    try:
        yield
    finally:
        SM90_BIAS_FIRST.clear()
        SM90_BIAS_FIRST.update(saved)
        SM90_BIAS_MIN_QUERIES = saved_min


# Head dims without an SM90 kernel of their own that the heuristic runs on the next wider one,
# padded (`sm90_padded_head_dim`), as measured on the H100 (fp16, bench/attention_sdpa.py, seq 512
# to 4096, causal and not; bench/results/2026-11-27-attention-sdpa-padded-nvidia-h100.json):
#   96 (Phi-3) on the head-dim-128 cooperative kernel: 178-473 TFLOP/s (0.66-1.03x torch's sdpa),
#      the SM80 kernel 110-153 (0.30-0.41x);
#   80 (Phi-2) likewise: 157-401 TFLOP/s (0.67-1.08x sdpa), the SM80 kernel 91-127;
#   32 on the head-dim-64 ping-pong kernel: 111-227 TFLOP/s (0.80-0.94x sdpa), the SM80 kernel 62-85.
# Every other head dim keeps the SM80 kernel as the heuristic's choice until measured, and profiling
# times the padded SM90 kernels beside it, each checked against the reference before it can win.
SM90_PADDED_FIRST: set[int] = {96, 80, 32}

# Kernel head dims (64, 128) at which the heuristic runs attention with an additive mask/bias on the
# SM90 kernel (a head dim it runs padded counts as its kernel's). Measured on the H200 (fp16, a
# (B, 1, 1, T) padding mask, seq 512-8192, causal and not,
# bench/results/2026-11-28-attention-sdpa-padding-nvidia-h200.json): 2.0-3.3x the SM80 kernel in
# every case (0.69-0.97x torch's sdpa without a causal mask, 1.08-2.18x with one; the SM80 kernel
# 0.32-0.83x). Checked on the H200 (bench/results/*-gpu-tests-nvidia-h200.json): fully masked rows
# (left-padded GPT-2 in float16 and bfloat16), padding masks, per-query masks, per-head biases off
# 16-byte rows, grouped- and multi-query attention with a padding mask, BLOOM's ALiBi beside the
# causal mask. In the zoo on the H200 (2026-11-28) the left-padded Llama batch (4 x 512) went from
# 2.46 to 1.66 ms and the padded BERT-base (8 x 128) from 0.91 to 0.81 ms, within their error bounds.
# Head dim 256 (Gemma) since its SM90 kernel is the default without a bias (above): its bias kernel
# is the soft-capped one's score step without the tanh, checked on the H200 by transformers' Gemma-2
# through sdpa (sliding-window band masks and left and right padding; tests/test_gpu_softcap.py).
# Emptied, the SM80 kernel runs every mask (the GPU tests check each kernel with sm90_bias_head_dims).
SM90_BIAS_FIRST: set[int] = {64, 128, 256}
# ... for at least this many queries (a whole query tile of the SM90 kernel's): with fewer, the
# SM80 kernel's 64-query tile wastes less. Measured on the H200 (zoo, 2026-11-28): Swin-T's
# 49-token windows with their position bias (head dim 32) took 5.67 ms on the SM90 bias kernel
# against 5.12 ms on the SM80 kernel; BERT-base's 128 padded tokens 0.807 ms against 0.911.
SM90_BIAS_MIN_QUERIES = 128


def sm90_padded_head_dim(problem: AttentionProblem) -> int | None:
    """The head dim of the SM90 kernel that runs `problem` padded, where the problem's own head dim
    has none (Phi-3's 96, Phi-2's 80): the next wider one. examples/88 runs a head dim below its
    tile's (its can_implement asks for at most the tile's, in whole 16-byte vectors): the TMA loads
    of Q, K and V zero-fill the columns past it, which add nothing to either product, and the TMA
    store of O stops at it. q/k and v head dims alike, as the kernel has one."""
    d = problem.head_dim
    if d != problem.head_dim_value or d in SM90_ATTENTION_TILES or d % 8:
        return None
    return min((h for h in SM90_ATTENTION_TILES if h > d), default=None)


# Whether the heuristic runs a causal problem beside a (B|1, N|1, 1, T) mask whose fully masked rows
# give the mean of all the values (a left-padded decoder batch under eager attention's finite mask)
# on the SM90 kernel with its fix-up after it, where the SM80 kernel (its own fix-up averaging every
# key) could run it too. False: the SM80 kernel runs those (`sm90_mean_rows_fixup` switches it).
# Checked on the H200 (tests/test_gpu_attention_sm90.py's left-padded eager Llama, every row against
# torch; memcheck of the soft-capped, left-padded Gemma-2, bench/results/2026-12-02-*-nvidia-h200.json).
# Preferred as SM90_BIAS_FIRST's measurements prefer the SM90 bias kernel; the fix-up adds a CTA per
# (batch, head) that reads one mask row, and writes only the fully masked rows.
SM90_MEAN_ROWS_FIXUP = True


@contextmanager
def sm90_mean_rows_fixup(enabled: bool) -> Iterator[None]:
    """Within the block, SM90_MEAN_ROWS_FIXUP is `enabled`: how the GPU tests check both kernels
    on a left-padded batch."""
    global SM90_MEAN_ROWS_FIXUP
    saved, SM90_MEAN_ROWS_FIXUP = SM90_MEAN_ROWS_FIXUP, enabled
    try:
        yield
    finally:
        SM90_MEAN_ROWS_FIXUP = saved


def _sm90_blocker(problem: AttentionProblem) -> str | None:
    """Why the SM90 kernel cannot run `problem` at any head dim, or None."""
    if not problem.scale > 0:
        return f"scale {problem.scale:g}: the SM90 attention kernel's softmax needs a positive scale: SM80 kernel"
    if problem.causal is not None and problem.bias_reads is not None and problem.masked_rows == "mean":
        # its masked rows take the mean of the keys its loop visits, which a causal mask stops at
        # the diagonal; the SM80 kernel's fix-up averages every key. The SM90 kernel's own fix-up
        # (emit_sm90.MEAN_ROWS_FUNCTION) runs where the mask is one row of keys per sequence:
        # always for soft-capped scores (nothing else soft-caps), else as SM90_MEAN_ROWS_FIXUP says.
        fixed = sm90_fixes_causal_mean_rows(problem) and (problem.softcap is not None or SM90_MEAN_ROWS_FIXUP)
        if not fixed:
            return (
                "a causal mask beside a mask/bias whose fully masked rows give the mean of all the values: "
                "the SM90 attention kernel's causal loop stops at the diagonal: SM80 kernel"
            )
    return None


def sm90_fixes_causal_mean_rows(problem: AttentionProblem) -> bool:
    """The SM90 kernel can give `problem`'s fully masked rows the mean of all the values beside its
    causal mask: the mask is one row of keys per (batch, head) (a padded batch's (B, 1, 1, T)), so a
    fix-up after the kernel finds those rows from the mask's first unmasked key alone."""
    return problem.bias_reads is not None and problem.bias_reads[2] is None


def sm90_attention_fallback_reason(problem: AttentionProblem) -> str | None:
    """Why sm_90a's examples/88 kernel cannot run `problem` (it then runs on examples/41's SM80
    kernel), or None. Strides and alignment are checked again at run time (every layout
    `layout_problems` accepts has strides that are multiples of the head dim)."""
    p = problem
    blocker = _sm90_blocker(p)
    if blocker:
        return blocker
    kernel_head_dim = sm90_kernel_head_dim(p)  # the problem's own, or the one it runs padded on
    if p.softcap is not None and kernel_head_dim is not None:
        # no other kernel soft-caps: the measured preferences below weigh the SM90 kernel against
        # the SM80 one, which cannot run this problem at all
        return None
    if p.bias_reads is not None and p.seq_q is not None and p.seq_q < SM90_BIAS_MIN_QUERIES:
        return (
            f"additive mask/bias on {p.seq_q} queries, fewer than the SM90 attention kernel's "
            f"{SM90_BIAS_MIN_QUERIES}-query tile (select.SM90_BIAS_MIN_QUERIES): SM80 kernel"
        )
    if p.bias_reads is not None and kernel_head_dim is not None and kernel_head_dim not in SM90_BIAS_FIRST:
        return (
            f"additive mask/bias: the SM90 attention kernel with a bias is not the default at head dim "
            f"{kernel_head_dim} (select.SM90_BIAS_FIRST): SM80 kernel"
        )
    if kernel_head_dim == p.head_dim and p.head_dim in SM90_UNMEASURED_HEAD_DIMS:
        return (
            f"head dim {p.head_dim}: the SM90 attention kernel's tiles for it are not yet measured faster "
            "(profiling times both): SM80 kernel"
        )
    if kernel_head_dim == p.head_dim or (kernel_head_dim is not None and p.head_dim in SM90_PADDED_FIRST):
        return None
    dims = "/".join(str(d) for d in SM90_ATTENTION_TILES)
    reason = (
        f"head dims {p.head_dim}/{p.head_dim_value}: the SM90 attention kernel (CUTLASS examples/88) is "
        f"built for q/k and v head dims both {dims}"
    )
    if kernel_head_dim is not None:
        reason += f"; it runs this one padded to {kernel_head_dim}, not yet measured faster (profiling times both)"
    return reason + ": SM80 kernel"


def attention_family(problem: AttentionProblem, arch: int, family: str = "auto") -> int:
    """90 (CUTLASS examples/88) on sm_90a where it can run `problem` and `family` allows, else 80."""
    if native_family(arch) != 90 or resolve_family(family, arch) != "auto":
        return 80
    return 80 if sm90_attention_fallback_reason(problem) else 90


def attention_note(problem: AttentionProblem, arch: int, family: str = "auto") -> str:
    """Why `problem` gets the attention family it gets on `arch`, for the report."""
    if native_family(arch) != 90:
        return family_note(arch, 80)
    if resolve_family(family, arch) != "auto":
        return "SM80 kernel requested (family='sm80')"
    return sm90_attention_fallback_reason(problem) or ""


def sm90_kernel_head_dim(problem: AttentionProblem) -> int | None:
    """The head dim of the SM90 kernel that runs `problem`: its own, or the wider one it runs
    padded on (`sm90_padded_head_dim`); None where there is none."""
    if problem.head_dim == problem.head_dim_value and problem.head_dim in SM90_ATTENTION_TILES:
        return problem.head_dim
    return sm90_padded_head_dim(problem)


def sm90_attention_kernels(problem: AttentionProblem, arch: int) -> list[AttentionKernel]:
    """The SM90 candidates of `problem`: every tile with every schedule of the kernel's head dim,
    the heuristic's (the head dim's first tile and schedule) first."""
    head_dim = sm90_kernel_head_dim(problem)
    if head_dim is None:
        return []
    note = f"head dim {problem.head_dim} padded to {head_dim}" if head_dim != problem.head_dim else ""
    # a bias is read by the CTA's (batch, head): one block per CTA (emit_sm90.SM90_BIAS_SCHEDULES),
    # as every kernel with the score step runs (soft-capping too)
    schedules = [s for s in _schedules(head_dim) if not problem.modifies_scores or s in SM90_BIAS_SCHEDULES]
    return [
        AttentionKernel(problem, queries, keys, head_dim, True, arch=90, target=arch, schedule=schedule, note=note)
        for queries, keys in SM90_ATTENTION_TILES[head_dim]
        for schedule in schedules
    ]


def sm90_unmeasured_kernels(problem: AttentionProblem, arch: int, family: str = "auto") -> list[AttentionKernel]:
    """The SM90 kernels profiling times beside the SM80 kernel's tiles where the heuristic keeps the
    SM80 kernel although the SM90 one can run the problem, at a head dim it runs padded (not in
    `SM90_PADDED_FIRST`) or one of SM90_UNMEASURED_HEAD_DIMS; on sm_90a with the family free. Not
    for a problem with a bias: the profiler calls kernels without one, which would time the SM90
    bias kernel without its cost."""
    if native_family(arch) != 90 or resolve_family(family, arch) != "auto" or _sm90_blocker(problem):
        return []
    if problem.bias_reads is not None:
        return []
    if attention_family(problem, arch, family) == 90 or sm90_kernel_head_dim(problem) is None:
        return []
    return sm90_attention_kernels(problem, arch)


def _noted(kernel: AttentionKernel, why: str) -> str:
    """`kernel`'s note (why its family, or its padding), then `why` (how the tuning chose)."""
    return "; ".join(filter(None, [kernel.note, why]))


def _choose_sm90(problem: AttentionProblem, arch: int, db) -> AttentionKernel:
    """The head dim's measured first tile and schedule (SM90_ATTENTION_FIRST_SCHEDULE), or the
    tuning database's measured candidate for a static problem."""
    kernels = sm90_attention_kernels(problem, arch)
    kernel = kernels[0]
    if db is None:
        return kernel

    if None in (problem.batch, problem.seq_q, problem.seq_kv):
        return dataclasses.replace(kernel, note=_noted(kernel, "symbolic sizes: heuristic"))
    record, choice, tuned_note = stage_record(db, attention_key(problem, arch, 90))
    by_label = {attention_label(k.queries_per_block, k.keys_per_block, k.schedule): k for k in kernels}
    why = _unusable(record, choice, by_label, next(iter(by_label)))
    if why:
        return dataclasses.replace(kernel, note=_noted(kernel, f"{why}: heuristic"))
    chosen = by_label[choice[0]]
    return dataclasses.replace(chosen, selected_by="tuned", note=_noted(chosen, tuned_note))


def _unusable(record, choice, candidates: dict, heuristic: str) -> str | None:
    """Why the tuning record cannot choose among `candidates` (labels), or None. A record that never
    timed the heuristic's candidate (measured before it was one) cannot show that its winner beats
    it, so the heuristic stands until profiling re-times the problem (profile.retime_reason), as
    for GEMMs."""
    if record is None:
        return "no tuning record"
    if choice[0] not in candidates:
        return f"tuning record names {choice[0]!r}"
    if record.candidates and heuristic not in record.candidates:
        return f"tuning record never timed {heuristic} (re-tune)"
    return None


def choose_attention_kernel(problem: AttentionProblem, arch: int, db=None, family: str = "auto") -> AttentionKernel:
    """The fused attention kernel for `problem`. On sm_90a, CUTLASS examples/88's kernel where
    `attention_family` takes it (`_choose_sm90`). Else examples/41's: the tuning database's measured tile when `db`
    has a record for it (static sizes), else xFormers' (and TVM's) tile rule. Head dims up to 64
    take 64 queries x 64 keys per CTA; wider heads 32 x 128, so that V's rows (up to 128) stay in
    registers across the key loop. A known problem whose 64-query CTAs would leave more than half
    of the SMs idle (BERT at batch 1: 32 CTAs) also takes 32 x 128, for twice the CTAs. The SM80
    kernel serves sm_90a too where the SM90 one cannot run the problem (the report says why)."""
    if attention_family(problem, arch, family) == 90:
        return _choose_sm90(problem, arch, db)
    if problem.softcap is not None:
        raise PlanError(soft_cap_refusal(problem, arch, family))
    widest = max(problem.head_dim, problem.head_dim_value)
    queries, keys = (64, 64) if problem.head_dim_value <= 64 else (32, 128)
    known = problem.batch is not None and problem.seq_q is not None
    # The kernel's grid: blocks of 64 query rows x (batch x heads).
    if (
        queries == 64
        and known
        and widest <= 128
        and under_fills(problem.seq_q, problem.batch * problem.heads, (64, 1), arch)
    ):
        queries, keys = 32, 128
    aligned = problem.alignment == 8
    note = attention_note(problem, arch, family)
    kernel = AttentionKernel(problem, queries, keys, widest, aligned, arch=80, target=arch, note=note)
    if db is None:
        return kernel
    unmeasured = sm90_unmeasured_kernels(problem, arch, family)
    if len(attention_tiles(problem)) < 2 and not unmeasured:
        return kernel
    if not known or problem.seq_kv is None:
        return dataclasses.replace(kernel, note=_noted(kernel, "symbolic sizes: heuristic"))
    record, choice, tuned_note = stage_record(db, attention_key(problem, arch))
    candidates = {
        attention_label(q, k): dataclasses.replace(kernel, queries_per_block=q, keys_per_block=k)
        for q, k in attention_tiles(problem)
    }
    candidates |= {attention_label(k.queries_per_block, k.keys_per_block, k.schedule): k for k in unmeasured}
    why = _unusable(record, choice, candidates, attention_label(queries, keys))
    if why:
        return dataclasses.replace(kernel, note=_noted(kernel, f"{why}: heuristic"))
    chosen = candidates[choice[0]]  # an SM80 tile (its note the family's), or an unmeasured SM90 kernel
    return dataclasses.replace(chosen, selected_by="tuned", note=_noted(chosen, tuned_note))


def soft_cap_refusal(problem: AttentionProblem, arch: int, family: str = "auto") -> str:
    """Why soft-capped attention stays in TVM on `arch`: only the SM90 kernel computes the tanh."""
    if native_family(arch) != 90:
        why = f"the target is sm_{arch}"
    elif resolve_family(family, arch) != "auto":
        why = attention_note(problem, arch, family)
    else:
        why = (sm90_attention_fallback_reason(problem) or "").removesuffix(": SM80 kernel")
    return (
        f"soft-capped scores (c * tanh(scores / c), c = {problem.softcap:g}) are computed by the SM90 "
        f"attention kernel only (sm_90a){'; ' + why if why else ''}: the attention stays in TVM"
    )


def attention_label(queries: int, keys: int, schedule: str = "") -> str:
    """An attention tile's name in profile manifests and tuning records (SM90: with its schedule)."""
    return f"{schedule + '_' if schedule else ''}q{queries}_k{keys}"
