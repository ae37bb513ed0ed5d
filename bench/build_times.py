"""Cold and warm build times of models on this machine: the BERT-large encoder layer, ResNet-50,
and any zoo entry as `zoo:<name>` (imported from torch as bench/zoo.py does; needs torch there).

    python bench/build_times.py [--models bert_large_layer zoo:bert_large] [--arch sm_90a]
        [--tuning-db tuning.jsonl] [--out bench/results/...json]

Cold: an empty object cache (a fresh RELAX_CUTLASS_CACHE_DIR), so every distinct kernel is compiled
by nvcc; each build's compiles are logged (RELAX_CUTLASS_COMPILE_LOG) and summed per kind (kernel
family, host glue, profiler), with the slowest sources. Warm: the same build again with the cache
filled, as in a rebuild. Each build is the whole path: offload pipeline (partition, lift constants,
kernel choice, nvcc, link), then `tvm.compile` and `export_library`. Run in a fresh process per
measurement so no in-process cache helps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ONE_BUILD = r"""
import json, sys, time
t0 = time.time()
import tvm
import relax_cutlass
from relax_cutlass.testing.models import bert_encoder_layer, random_weights
from relax_cutlass.prepare import bind_float16, bind_weights
model, arch, out, db = sys.argv[1:5]
if model.startswith("zoo:"):  # a zoo entry as bench/zoo.py imports it (torch export included)
    from pathlib import Path
    from relax_cutlass.testing.zoo import ZOO
    entry = next(e for e in ZOO if e.name == model.removeprefix("zoo:"))
    torch_model, example = entry.build()
    mod = entry.import_module(torch_model, example, Path(out).parent)
elif model == "bert_large_layer":
    mod = bert_encoder_layer()
    mod = bind_weights(mod, random_weights(mod))
else:
    from relax_cutlass.testing.models.torch_models import resnet50_module
    mod, weights = resnet50_module(batch=32)
    mod = bind_float16(mod, weights)
t_import = time.time() - t0
t0 = time.time()
offloaded = relax_cutlass.offload_pipeline(arch, tuning_db=db)(mod)
t_offload = time.time() - t0
t0 = time.time()
ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm"))
ex.export_library(out)
t_compile = time.time() - t0
rows = relax_cutlass.offload_report(offloaded).offloaded
kernels = len({r["kernel"] for r in rows} | {d["kernel"] for r in rows for d in r.get("dispatch", [])})
print(json.dumps({"import_s": t_import, "offload_s": t_offload, "tvm_compile_export_s": t_compile,
                  "regions": sum(r["calls"] for r in rows), "distinct_kernels": kernels,
                  "tuned": sum(r["selected_by"] == "tuned" for r in rows)}))
"""


def compile_summary(log: Path) -> dict:
    """Where the build's compile time went, from its RELAX_CUTLASS_COMPILE_LOG lines: the sources
    compiled (not taken from the object cache) by kind, their summed seconds, and the slowest."""
    lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    compiled = [x for x in lines if not x["cached"]]
    by_kind: dict[str, dict] = {}
    for x in compiled:
        kind = by_kind.setdefault(x["kind"] + (f" {x['family']}" if x["family"] else ""), {"sources": 0, "s": 0.0})
        kind["sources"] += 1
        kind["s"] = round(kind["s"] + x["compile_s"] + x["check_s"], 2)
    slowest = sorted(compiled, key=lambda x: -x["compile_s"])[:5]
    return {
        "sources": len(lines),
        "compiled": len(compiled),
        "compile_s_summed": round(sum(x["compile_s"] + x["check_s"] for x in compiled), 2),
        "by_kind": by_kind,
        "slowest": [{"name": x["name"], "compile_s": x["compile_s"], "check_s": x["check_s"]} for x in slowest],
    }


def measure(model: str, arch: str, cache: Path, db: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "compile.jsonl"
        env = dict(os.environ, RELAX_CUTLASS_CACHE_DIR=str(cache), RELAX_CUTLASS_COMPILE_LOG=str(log))
        out = str(Path(tmp) / "model.so")
        proc = subprocess.run(
            [sys.executable, "-c", ONE_BUILD, model, arch, out, db], env=env, capture_output=True, text=True, cwd=ROOT
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-4000:])
        return json.loads(proc.stdout.strip().splitlines()[-1]) | {"compiles": compile_summary(log)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--tuning-db", default="")
    ap.add_argument("--models", nargs="+", default=["bert_large_layer", "resnet50_n32"])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"{date.today()}-build-times.json")
    args = ap.parse_args()
    results = {"arch": args.arch, "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine()}
    results["builds"] = []
    for model in args.models:
        with tempfile.TemporaryDirectory() as cache:
            for kind in ("cold", "warm"):
                t0 = time.time()
                row = measure(model, args.arch, Path(cache), args.tuning_db)
                row |= {"model": model, "cache": kind, "total_s": time.time() - t0}
                results["builds"].append(row)
                compiles = row["compiles"]
                print(
                    f"{model} {kind}: total {row['total_s']:.1f}s (offload + nvcc {row['offload_s']:.1f}s, "
                    f"tvm.compile + export {row['tvm_compile_export_s']:.1f}s, import {row['import_s']:.1f}s); "
                    f"{row['regions']} regions, {row['distinct_kernels']} distinct kernels; "
                    f"{compiles['compiled']} of {compiles['sources']} sources compiled, "
                    f"{compiles['compile_s_summed']:.1f}s summed over the cores",
                    flush=True,
                )
                for slow in compiles["slowest"][:3]:
                    print(f"  {slow['name']}: {slow['compile_s']:.1f}s (+{slow['check_s']:.1f}s SASS check)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    from publish import render  # bench/publish.py, beside this script

    render()
    print(f"wrote {args.out} and docs/results.md")


def table(results: dict, path: Path) -> str:
    lines = [
        f"Build times on this {results['cpus']}-core machine for {results['arch']} (`bench/build_times.py`, "
        "a fresh process per build): import = model construction (for ResNet-50: torch.export, "
        "from_exported_program, batch-norm folding, NHWC, fp16), offload = relax_cutlass passes + nvcc "
        "(cold: empty object cache), compile = `tvm.compile` + `export_library`.",
        "",
        "| model | cache | total s | import s | offload + nvcc s | compile s | regions | distinct kernels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["builds"]:
        lines.append(
            f"| {r['model']} | {r['cache']} | {r['total_s']:.1f} | {r['import_s']:.1f} | {r['offload_s']:.1f} "
            f"| {r['tvm_compile_export_s']:.1f} | {r['regions']} | {r['distinct_kernels']} |"
        )
    return "\n".join(lines) + f"\n\nRaw results: `{path.relative_to(ROOT)}`."


if __name__ == "__main__":
    main()
