"""Where a zoo model's relax_cutlass build spends its time on the GPU host (run after
`bench/zoo.py --phase build`): every CUDA kernel of one inference, relax_cutlass's and TVM's, as
CUPTI records it, summed by who ran it, then the top kernels.

    python scripts/profile_zoo.py build/zoo convnext_tiny [resnet50 ...] [--top 25] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import tvm
from profile_calls import DEV, kernel_profile, print_profile

from relax_cutlass.testing.zoo import ZOO


def owner(kernel: str) -> str:
    """Who launched a kernel: relax_cutlass's CUTLASS kernels and glue, or TVM's build."""
    cutlass = ("cutlass", "Kernel", "relax_cutlass", "fmha", "attention", "conv", "gemm", "device_kernel")
    return "relax_cutlass" if any(word in kernel for word in cutlass) else "tvm"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("zoo_dir", type=Path)
    ap.add_argument("names", nargs="+")
    ap.add_argument("--library", default="relax_cutlass")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    entries = {e.name: e for e in ZOO}
    out = []
    for name in args.names:
        record = json.loads((args.zoo_dir / name / "record.json").read_text())
        _, example = entries[name].build()
        vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(record["libraries"][args.library]), DEV)
        r = {"model": name, **kernel_profile(vm, [tvm.runtime.tensor(x.numpy(), DEV) for x in example], args.runs)}
        r["by_owner"] = {}
        for k in r["kernels"]:
            r["by_owner"][owner(k["kernel"])] = r["by_owner"].get(owner(k["kernel"]), 0.0) + k["ms"]
        out.append(r)
        print_profile(f"{name} [{args.library}]", r, args.top)
        print("  by owner: " + ", ".join(f"{o} {ms:.3f} ms" for o, ms in sorted(r["by_owner"].items())))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
