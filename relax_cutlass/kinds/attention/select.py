"""The fused attention kernel's tile (queries x keys per CTA), chosen by head dim and occupancy, or by
the tuning database."""

from __future__ import annotations

import dataclasses

from ...arch import family_note
from ..gemm.select import _stage_record, under_fills
from .records import AttentionKernel, AttentionProblem, attention_key

ATTENTION_TILES = ((64, 64), (32, 128))  # (queries, keys) per CTA: xFormers' forward configurations


def attention_tiles(problem: AttentionProblem) -> list[tuple[int, int]]:
    """The (queries, keys) tiles that can run `problem`: 64 x 64 keeps at most 64 value columns
    in registers, so wider heads have only 32 x 128."""
    return [t for t in ATTENTION_TILES if problem.head_dim_value <= 64 or t[1] == 128]


def choose_attention_kernel(problem: AttentionProblem, arch: int, db=None) -> AttentionKernel:
    """The fused attention kernel for `problem`: the tuning database's measured tile when `db`
    has a record for it (static sizes), else xFormers' (and TVM's) tile rule. Head dims up to 64
    take 64 queries x 64 keys per CTA; wider heads 32 x 128, so that V's rows (up to 128) stay in
    registers across the key loop. A known problem whose 64-query CTAs would leave more than half
    of the SMs idle (BERT at batch 1: 32 CTAs) also takes 32 x 128, for twice the CTAs. The SM80
    kernel serves sm_90a too (the report says so)."""
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
    note = "SM80 fused attention kernel (no SM90 one yet)" if arch == 90 else family_note(arch, 80)
    kernel = AttentionKernel(problem, queries, keys, widest, aligned, arch=80, target=arch, note=note)
    if db is None or len(attention_tiles(problem)) < 2:
        return kernel
    if not known or problem.seq_kv is None:
        return dataclasses.replace(kernel, note="; ".join(filter(None, [note, "symbolic sizes: heuristic"])))
    record, choice, tuned_note = _stage_record(db, attention_key(problem, arch))
    tiles = {attention_label(*t): t for t in attention_tiles(problem)}
    if record is None or choice[0] not in tiles:
        why = "no tuning record" if record is None else f"tuning record names {choice[0]!r}"
        return dataclasses.replace(kernel, note="; ".join(filter(None, [note, f"{why}: heuristic"])))
    queries, keys = tiles[choice[0]]
    return dataclasses.replace(
        kernel,
        queries_per_block=queries,
        keys_per_block=keys,
        selected_by="tuned",
        note="; ".join(filter(None, [note, tuned_note])),
    )


def attention_label(queries: int, keys: int) -> str:
    """An attention tile's name in profile manifests and tuning records."""
    return f"q{queries}_k{keys}"
