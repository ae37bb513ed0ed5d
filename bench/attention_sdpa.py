"""Attention alone: relax_cutlass's fused attention kernel (an offloaded R.nn.attention, built with
tvm.compile for the local GPU) against torch's scaled_dot_product_attention (whichever backend
torch picks: flash / cuDNN / memory-efficient), fp16, head dims 64 and 128, sequence lengths
512..8192, causal and not.

    python bench/attention_sdpa.py [--seqs 512,1024,2048,4096,8192] [--head-dims 64,128]
                                   [--families auto,sm80] [--mask none|padding] [--out DIR]

Each case has 16384 tokens per head (batch = 16384 / seq) and 2048 / head_dim heads (as CUTLASS
examples/88's runner sizes its problems): batch x heads is 32..1024. q, k and v are BSNH (the
layout R.nn.attention takes); torch gets the same tensors as (B, N, S, H) views. "auto" is
relax_cutlass's heuristic choice for the GPU (on sm_90a: the SM90 kernel, CUTLASS examples/88:
ping-pong 128 x 128 at head dim 64, cooperative 128 x 128 at 128; with a mask the SM80 kernel),
a schedule name ("pingpong",
"cooperative_locked", ...; with ":128x64" or ":128x128" a tile too, else the heuristic's tile)
that SM90 candidate (at a head dim without an SM90 kernel of its own, e.g. `--head-dims 96`, the
next wider head dim's, run padded; at one the heuristic does not yet run on its own SM90 tile,
`--head-dims 256`, that tile), "tuned" the build with profile="auto" (every candidate timed on
this GPU, the fastest used: what a user's build here does),
"sm80" the SM80 kernel (CUTLASS examples/41) on the same GPU. Each output is checked against torch's (relative
error). FLOPs: 4 * B * N * S * T * H (two GEMMs), half of that for causal attention (TVM's TopLeft
mask; torch's is_causal). ms are medians of `vm.time_evaluator` (relax_cutlass; includes the VM
call, a few microseconds) and of CUDA events around 20 back-to-back calls (torch). JSON under DIR.
`--mask padding`: each sequence of the batch has its last keys padded (a quarter of them over the
batch, from none to a half), as a (B, 1, 1, T) float16 additive mask of 0 / -inf: relax_cutlass
gets it as R.nn.attention's bias, torch's sdpa as its attn_mask (with the causal mask added to it,
as sdpa takes no attn_mask with is_causal); FLOPs count the whole (padded) problem.
Needs a GPU, torch and TVM's compiler (the GPU host with the full bundle); about 2-4 minutes on an
H200, most of it nvcc.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.gpu_common import time_torch

TOKENS = 16384  # batch x seq per case
HEAD_ELEMENTS = 2048  # heads x head dim


def cases(seqs, head_dims) -> list[dict]:
    return [
        {"head_dim": hd, "seq": s, "batch": max(1, TOKENS // s), "heads": HEAD_ELEMENTS // hd, "causal": causal}
        for hd in head_dims
        for s in seqs
        for causal in (False, True)
    ]


def flops(case: dict) -> float:
    total = 4.0 * case["batch"] * case["heads"] * case["seq"] * case["seq"] * case["head_dim"]
    return total / 2 if case["causal"] else total


def padding_mask(batch: int, seq: int) -> np.ndarray:
    """(B, 1, 1, T) float16, 0 for a kept key, -inf for a padded one: sequence b keeps its first
    seq - pad(b) keys, the pads spread evenly from 0 to half the keys (a quarter on average)."""
    mask = np.zeros((batch, 1, 1, seq), dtype="float16")
    for b in range(batch):
        pad = (seq // 2) * b // max(1, batch - 1)
        mask[b, ..., seq - pad :] = -np.inf
    return mask


def _module(rows: list[dict], masked: bool = False):
    """One function per case: R.nn.attention on BSNH fp16 q, k, v (TVM's TopLeft causal mask), with
    a (B, 1, 1, T) bias where `masked`."""
    from tvm import relax

    bb = relax.BlockBuilder()
    for i, c in enumerate(rows):
        shape = (c["batch"], c["seq"], c["heads"], c["head_dim"])
        params = [relax.Var(name, relax.TensorType(shape, "float16")) for name in "qkv"]
        if masked:
            params.append(relax.Var("bias", relax.TensorType((c["batch"], 1, 1, c["seq"]), "float16")))
        with bb.function(f"f{i}", params):
            with bb.dataflow():
                causal = "TopLeft" if c["causal"] else None
                out = bb.emit_output(relax.op.nn.attention(*params, causal_mask=causal))
            bb.emit_func_output(out)
    return bb.get()


def run(rows: list[dict], families: list[str], masked: bool = False) -> None:
    import torch
    import tvm
    from tvm import relax

    import relax_cutlass
    from relax_cutlass.arch import arch_name, local_gpu_arch

    arch = arch_name(local_gpu_arch())
    dev = tvm.cuda(0)
    target = tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")
    rng = np.random.default_rng(0)
    arrays = [
        [rng.uniform(-1, 1, size=(c["batch"], c["seq"], c["heads"], c["head_dim"])).astype("float16") for _ in "qkv"]
        + ([padding_mask(c["batch"], c["seq"])] if masked else [])
        for c in rows
    ]
    # torch first: its outputs are the references
    for c, qkv in zip(rows, arrays, strict=True):
        qt, kt, vt = (torch.from_numpy(x).cuda().transpose(1, 2) for x in qkv[:3])  # (B, N, S, H) views of BSNH
        mask = None
        if masked:
            mask = torch.from_numpy(qkv[3]).cuda()
            if c["causal"]:  # sdpa takes no attn_mask with is_causal: TVM's TopLeft mask added to it
                mask = mask + torch.full((c["seq"], c["seq"]), float("-inf"), device="cuda").triu(1).half()

        def sdpa(qt=qt, kt=kt, vt=vt, causal=c["causal"] and not masked, mask=mask):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal)

        with torch.no_grad():
            c["want"] = sdpa().transpose(1, 2).float().cpu().numpy()
            c["sdpa_ms"] = time_torch(sdpa, repeat=5, number=20)
        c["sdpa_tflops"] = flops(c) / c["sdpa_ms"] / 1e9
        del qt, kt, vt
    torch.cuda.empty_cache()
    from relax_cutlass.kinds.attention import select

    for family in families:
        t0 = time.time()
        # an SM90 schedule ("pingpong", "cooperative_locked", ...), optionally with a tile
        # ("cooperative_locked:128x128"): that candidate first, so the heuristic takes it where the
        # head dim has it; "tuned": profile="auto" (what a user's build on this GPU does: every
        # candidate timed, the fastest recorded and used)
        schedule, _, tile = family.partition(":")
        sm90 = schedule in select.SM90_ATTENTION_SCHEDULES
        option = "auto" if sm90 or family == "tuned" else family
        profile = "auto" if family == "tuned" else "never"
        # (a head dim without an SM90 kernel of its own, e.g. 96, then runs on the next wider one, padded)
        # (and with --mask, the SM90 kernel with the bias, which the heuristic does not take yet)
        forced = select.sm90_candidate_first(
            schedule,
            tuple(int(x) for x in tile.split("x")) if tile else None,
            {c["head_dim"] for c in rows},
            bias_head_dims=tuple(select.SM90_ATTENTION_TILES),
            measured_head_dims={c["head_dim"] for c in rows},
        )
        with forced if sm90 else contextlib.nullcontext():
            offloaded = relax_cutlass.offload_pipeline(arch, family=option, profile=profile)(_module(rows, masked))
        report = relax_cutlass.offload_report(offloaded)
        vm = relax.VirtualMachine(tvm.compile(offloaded, target), dev)
        print(f"{family}: built in {time.time() - t0:.0f} s", flush=True)
        # each case is one attention region, told apart by its q shape and mask
        kernels = {
            (tuple(r["shapes"]["query"]), r["attention"].get("causal")): (r["kernel"], r.get("note", ""))
            for r in report.offloaded
        }
        for i, (c, qkv) in enumerate(zip(rows, arrays, strict=True)):
            args = [tvm.runtime.tensor(x, dev) for x in qkv]
            got = vm[f"f{i}"](*args).numpy().astype("float32")
            ms = vm.time_evaluator(f"f{i}", dev, number=20, repeat=5)(*args).median * 1e3
            shape = (c["batch"], c["seq"], c["heads"], c["head_dim"])
            kernel, note = kernels.get((shape, "TopLeft" if c["causal"] else None), ("in TVM", ""))
            c[family] = {
                "ms": ms,
                "tflops": flops(c) / ms / 1e9,
                "vs_sdpa": c["sdpa_ms"] / ms,  # > 1: relax_cutlass is faster
                "rel_err": rel_error(got, c["want"]),
                "kernel": kernel,
                "note": note,
            }
            del args
    for c in rows:
        del c["want"]


def print_table(rows: list[dict], families: list[str]) -> None:
    head = " | ".join(f"{f} ms | {f} TFLOP/s | sdpa/{f} | {f} err" for f in families)
    print(f"| H | S | B x N | causal | sdpa ms | sdpa TFLOP/s | {head} |")
    print("|---" * (6 + 4 * len(families)) + "|")
    for c in rows:
        cols = " | ".join(
            f"{c[f]['ms']:.3f} | {c[f]['tflops']:.0f} | {c[f]['vs_sdpa']:.2f} | {c[f]['rel_err']:.1e}" for f in families
        )
        print(
            f"| {c['head_dim']} | {c['seq']} | {c['batch']} x {c['heads']} | {'yes' if c['causal'] else 'no'} "
            f"| {c['sdpa_ms']:.3f} | {c['sdpa_tflops']:.0f} | {cols} |"
        )
    for f in families:
        print(f"{f} kernels: " + ", ".join(sorted({c[f]["kernel"] for c in rows})))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--families", default="auto,sm80")
    ap.add_argument("--mask", choices=("none", "padding"), default="none")
    ap.add_argument("--out", default=os.environ.get("OUT", "build/attention_sdpa"))
    args = ap.parse_args()
    families = args.families.split(",")
    rows = cases([int(s) for s in args.seqs.split(",")], [int(h) for h in args.head_dims.split(",")])
    for c in rows:
        c["mask"] = args.mask
    run(rows, families, masked=args.mask == "padding")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "attention_sdpa.json" if args.mask == "none" else f"attention_sdpa_{args.mask}.json"
    (out / name).write_text(json.dumps(rows, indent=1))
    print_table(rows, families)
    bad = [c for c in rows for f in families if not c[f]["rel_err"] < 1e-2]
    if bad:
        print(f"{len(bad)} results differ from sdpa by 1% or more", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
