"""Sweep small random-init Hugging Face models of many families through relax_cutlass on the CPU:
from_torch -> offload_pipeline (externs served by their regions' llvm-built composites) -> the
offloaded module against torch float32 and TVM's own build, and both modules through TVM's CUDA
build (compile only: no GPU needed, nvcc is not called). It finds the crashes, wrong results and
unfused attention a new user of a family would meet, without a GPU.

    python scripts/hf_sweep.py [--families mistral,qwen2,...] [--seq 24] [--batch 1] [--symbolic]
                               [--dtype float16|bfloat16] [--float32-weights] [--json F]

The families: decoders and encoders on token ids (`tiny_families`), and vision and speech models on
pixels, a waveform or mel features of a fixed example shape (`tiny_input_families`; --symbolic
makes only the token models' sequence length symbolic). Each model's weights are rounded to the
compute dtype first (float16, or bfloat16 with --dtype), as a checkpoint in it holds them, unless
--float32-weights keeps them as a float32 checkpoint holds them; the bound on the error against
torch float32 is the dtype's (2e-2, bfloat16 5e-2).

Prints one line per family: the stage that failed (import / offload / run / cuda build) with its
error, or the relative errors, the offloaded attention count against the model's softmaxes, and the
ops left in TVM with the report's first reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from relax_cutlass.testing.models.torch_transformers import (
    TINY_VOCAB,
    tiny_families,
    tiny_input_families,
    tiny_input_model,
    tiny_model,
)


def sweep_one(
    family: str, batch: int, seq: int, symbolic: bool = False, dtype: str = "float16", round_weights: bool = True
) -> dict:
    import numpy as np
    import torch
    import transformers
    import tvm

    import relax_cutlass
    from relax_cutlass.prepare import tvm_baseline
    from relax_cutlass.testing.errors import rel_error
    from relax_cutlass.testing.harness import build_cpu, offload_pipeline_on_cpu, op_names, run_vm

    row: dict = {"family": family, "dtype": dtype, "weights": dtype if round_weights else "float32"}
    stage = "model"
    t0 = time.time()
    try:
        torch.manual_seed(0)
        tokens = family not in tiny_input_families(transformers)
        if tokens:
            model = tiny_model(family, torch, transformers)
        else:  # pixels, a waveform or mel features: their own example shape, static
            model, shape = tiny_input_model(family, torch, transformers)
        if round_weights:  # weights as a checkpoint in `dtype` holds them
            model = model.to(getattr(torch, dtype)).float()
        ids = torch.randint(3, TINY_VOCAB, (batch, seq)) if tokens else torch.randn(*shape)
        with torch.no_grad():
            expected = model(ids).float().numpy()
        stage = "import"
        dynamic = None
        if symbolic and tokens:  # the sequence length symbolic, checked at `seq` and at a shorter, odd length
            dynamic = {"input_ids": {1: torch.export.Dim("seq", min=2, max=max(64, seq))}}
        mod = relax_cutlass.from_torch(model, (ids,), dynamic_shapes=dynamic, dtype=dtype)
        row["softmaxes"] = op_names(mod).count("relax.nn.softmax")  # its attentions (Swin's: one per block)
        stage = "offload"
        offloaded = offload_pipeline_on_cpu(mod, "sm_90a", profile="never")
        report = relax_cutlass.offload_report(offloaded)
        row["attention"] = sum(r.get("calls", 1) for r in report.offloaded if r["op"] == "attention")
        row["offloaded_calls"] = sum(r.get("calls", 1) for r in report.offloaded)
        row["in_tvm"] = [f"{r['op']}: {r['reasons'][0]}" for r in report.left_in_tvm]
        stage = "run"
        got = run_vm(build_cpu(offloaded), [ids.numpy()])
        tvm_own = run_vm(build_cpu(mod), [ids.numpy()])
        row["err_vs_torch"] = rel_error(got, expected)
        row["err_vs_tvm"] = rel_error(got, tvm_own)
        row["tvm_err_vs_torch"] = rel_error(tvm_own, expected)
        row["finite"] = bool(np.isfinite(got).all())
        if symbolic and tokens:
            short = torch.randint(3, TINY_VOCAB, (batch, seq // 2 + 1))
            with torch.no_grad():
                want = model(short).float().numpy()
            row["err_short_vs_torch"] = rel_error(run_vm(build_cpu(offloaded), [short.numpy()]), want)
            row["err_vs_torch"] = max(row["err_vs_torch"], row["err_short_vs_torch"])
        stage = "cuda build"
        cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")
        # TVM's own build of the model as bench/zoo.py makes it (tvm_baseline: the one rewrite TVM
        # 0.27's CUDA build needs for a squeeze-excitation scale, values unchanged)
        baseline = tvm_baseline(mod)
        for name, m in (("tvm", baseline), ("offloaded", relax_cutlass.offload_pipeline("sm_90a", compile=False)(mod))):
            with tvm.transform.PassContext(opt_level=3):
                tvm.compile(m, cuda)
            row[f"cuda_{name}"] = "ok"
        stage = "done"
    except Exception as err:  # a sweep reports every failure and goes on
        row["failed"] = stage
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
        row["trace"] = traceback.format_exc()[-2000:]
    row["seconds"] = round(time.time() - t0, 1)
    return row


# the error against torch float32 a family passes at, per dtype
BOUND = {"float16": 2e-2, "bfloat16": 5e-2}


def _line(row: dict) -> str:
    if "failed" in row:
        return f"{row['family']:12s} FAILED at {row['failed']}: {row['error']}"
    flags = "" if row["finite"] else " NON-FINITE"
    bad = " WRONG" if not row["err_vs_torch"] < BOUND[row["dtype"]] else ""
    left = "; ".join(sorted(set(row["in_tvm"])))[:300] or "-"
    return (
        f"{row['family']:12s} err {row['err_vs_torch']:.1e} (tvm {row['tvm_err_vs_torch']:.1e}){bad}{flags} "
        f"attention {row['attention']}/{row['softmaxes']} calls {row['offloaded_calls']} in TVM: {left} "
        f"({row['seconds']} s)"
    )


def main() -> int:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    every = [*tiny_families(transformers), *tiny_input_families(transformers)]
    ap.add_argument("--families", default=",".join(every))
    ap.add_argument("--seq", type=int, default=24)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--symbolic", action="store_true", help="export with a symbolic sequence length")
    ap.add_argument("--dtype", default="float16", choices=sorted(BOUND))
    ap.add_argument(
        "--float32-weights",
        action="store_true",
        help="keep the random float32 weights (a float32 checkpoint) instead of rounding them to --dtype",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for family in args.families.split(","):
        row = sweep_one(family, args.batch, args.seq, args.symbolic, args.dtype, not args.float32_weights)
        rows.append(row)
        print(_line(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if any("failed" in r or not r.get("err_vs_torch", 1) < BOUND[r["dtype"]] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
