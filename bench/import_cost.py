"""Where the CPU time of importing and offloading a large model goes (no kernels compiled): a
Llama-family decoder of `--hidden` / `--intermediate` / `--layers` (random init), through
`from_torch` and `offload_pipeline(compile=False)`, each TVM pattern rewrite (`rewrite_call`) timed
by the relax_cutlass line that calls it, with TVM's structural hash of the imported function (what
hashing every weight costs).

    python bench/import_cost.py [--hidden 4096 --intermediate 14336 --layers 1] [--out cost.json]

Runs on any machine (CPU only); the JSON goes under bench/results as <date>-import-cost-cpu.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import time
import traceback
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=Path("import_cost.json"))
    args = ap.parse_args()

    import torch
    import transformers
    import tvm_ffi
    from tvm.relax import dpl
    from tvm.relax.dpl import rewrite as dpl_rewrite

    original = dpl_rewrite.rewrite_call
    by_caller: dict[str, list[float]] = collections.defaultdict(list)

    def timed(*call_args, **kwargs):
        start = time.perf_counter()
        result = original(*call_args, **kwargs)
        frames = [f for f in traceback.extract_stack()[:-1] if "relax_cutlass" in f.filename]
        where = f"{frames[-1].filename.split('relax_cutlass/')[-1]}:{frames[-1].lineno}" if frames else "other"
        by_caller[where].append(time.perf_counter() - start)
        return result

    # before relax_cutlass imports it (`from tvm.relax.dpl import rewrite_call`), so every caller is timed
    dpl.rewrite_call = dpl_rewrite.rewrite_call = timed
    import relax_cutlass

    config = transformers.LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, num_hidden_layers=args.layers, vocab_size=32000,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 32000, (1, args.seq))
    t0 = time.perf_counter()
    imported = relax_cutlass.from_torch(model, (ids,))
    t1 = time.perf_counter()
    relax_cutlass.offload_pipeline("sm_90a", compile=False)(imported)
    t2 = time.perf_counter()
    tvm_ffi.structural_hash(imported["main"])
    t3 = time.perf_counter()
    rows = sorted(
        ({"caller": k, "calls": len(v), "s": round(sum(v), 3)} for k, v in by_caller.items()), key=lambda r: -r["s"]
    )
    result = dict(
        what="from_torch then offload_pipeline('sm_90a', compile=False) of a random-init Llama-family decoder "
        "on this CPU; rewrite_call seconds by the relax_cutlass line that calls it; the structural hash of the "
        "imported main (TVM hashes every constant's bytes)",
        machine=platform.machine(), cpus=os.cpu_count(), config=vars(args) | {"out": None},
        parameters_b=round(sum(p.numel() for p in model.parameters()) / 1e9, 3),
        from_torch_s=round(t1 - t0, 2), offload_s=round(t2 - t1, 2), structural_hash_s=round(t3 - t2, 2),
        rewrite_call_s=round(sum(r["s"] for r in rows), 2), rewrite_calls=rows,
    )  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rewrite_calls"}, indent=1))
    for r in rows[:12]:
        print(f"{r['s']:7.2f} s  {r['calls']:3d} calls  {r['caller']}")


if __name__ == "__main__":
    main()
