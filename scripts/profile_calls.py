"""Where a built model's inference spends its time on the GPU host: every CUDA kernel in the
process (TVM's and relax_cutlass's alike) as CUPTI records it through torch.profiler, against the
wall time of the inference. A GPU-busy sum far below the wall time means the run is bound by the
host (the VM's per-call overhead), not by the kernels.

    python scripts/profile_calls.py DIR/build bert_large_b8_s128 [--runs 5] [--json OUT]

DIR/build: the libraries and manifest of bench/gpu_suite.py --out DIR.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
import tvm
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from relax_cutlass.testing.gpu_checks import DEV, inputs_for, load


def _find_case(manifest: dict, name: str) -> dict:
    for cases in manifest.values():
        for case in cases if isinstance(cases, list) else []:
            if isinstance(case, dict) and case.get("name") == name:
                return case
    raise SystemExit(f"no case named {name!r} in the manifest")


def profile(build: Path, case: dict, variant: str, runs: int) -> dict:
    params = case["cutlass_params"] if variant == "cutlass" else case["tvm_params"]
    vm = load(build / f"{case['name']}.{variant}.so")
    values = inputs_for(case["tvm_params"], {}, 1)
    args = [tvm.runtime.tensor(values[p["name"]], DEV) for p in params]
    return {"case": case["name"], "variant": variant, **kernel_profile(vm, args, runs)}


def kernel_profile(vm, args: list, runs: int) -> dict:
    """The wall time of `vm["main"](*args)` and every CUDA kernel it runs (ms per inference)."""
    for _ in range(3):
        vm["main"](*args)
    DEV.sync()
    t0 = time.perf_counter()
    for _ in range(20):
        vm["main"](*args)
    DEV.sync()
    wall_ms = (time.perf_counter() - t0) / 20 * 1e3
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            vm["main"](*args)
        DEV.sync()
    kernels: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name].append(event.device_time / 1e3)
    rows = sorted(
        ({"kernel": k, "calls": len(t) / runs, "ms": sum(t) / runs} for k, t in kernels.items()),
        key=lambda r: -r["ms"],
    )
    return {"wall_ms": wall_ms, "gpu_busy_ms": sum(r["ms"] for r in rows), "kernels": rows}


def print_profile(title: str, r: dict, top: int) -> None:
    n = sum(k["calls"] for k in r["kernels"])
    print(f"\n== {title} wall {r['wall_ms']:.3f} ms, GPU busy {r['gpu_busy_ms']:.3f} ms, {n:.0f} kernels")
    for k in r["kernels"][:top]:
        print(f"  {k['ms']:8.4f} ms  x{k['calls']:<5.0f} {k['kernel'][:110]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", type=Path)
    ap.add_argument("names", nargs="+")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--variants", default="cutlass,tvm")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    manifest = json.loads((args.build / "manifest.json").read_text())
    out = []
    for name in args.names:
        case = _find_case(manifest, name)
        for variant in args.variants.split(","):
            r = profile(args.build, case, variant, args.runs)
            out.append(r)
            print_profile(f"{name} [{variant}]", r, args.top)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
