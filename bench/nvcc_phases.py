"""Where nvcc's time goes in a cold build: each distinct kernel of the BERT-large encoder layer (the
main job's model) compiled alone, with relax_cutlass's own command and `nvcc --time`, one after
another on this machine, and the seconds of each phase (preprocessing, cudafe++ and the host
compiler for the host side; cicc and ptxas for the device side) written to JSON.

    python bench/nvcc_phases.py [--arch sm_90a] [--out bench/results/<date>-nvcc-phases-<machine>.json]

No GPU needed. A kernel's phases run one after another inside nvcc, so a cold build on as many
cores as kernels takes about its slowest kernel's sum; the split says which phase a change must
shorten (parsing CUTLASS's headers twice, host and device, or optimizing the device code).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import tempfile
import time
from datetime import date
from pathlib import Path

from relax_cutlass.arch import parse_arch
from relax_cutlass.prepare import bind_weights
from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
from relax_cutlass.stages.constants import offloaded_functions
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.stages.partition import partition_as_offloaded
from relax_cutlass.testing.models import bert_encoder_layer, random_weights
from relax_cutlass.toolkit.compile import compile_command
from relax_cutlass.toolkit.toolchain import toolchain

ROOT = Path(__file__).resolve().parent.parent


def kernel_sources(arch: str) -> list:
    """The distinct kernel sources of the BERT-large layer for `arch` (heuristic kernels)."""
    mod = bert_encoder_layer()
    part = partition_as_offloaded(bind_weights(mod, random_weights(mod)), arch)
    regions = plan_regions([f for _, f in offloaded_functions(part)], CodegenOptions.create(arch, profile="never"))
    kernels = {k.name: k for r in regions for k in r.kernels}
    return [emit_kernel(k) for k in kernels.values()]


def phases(source, arch: int, folder: Path) -> dict:
    """nvcc --time's phases of one source: {phase: seconds}, and the wall time."""
    src = folder / f"{source.name}.cu"
    src.write_text(source.text)
    timing = folder / f"{source.name}.csv"
    command = compile_command(toolchain(), source, arch, src, folder / f"{source.name}.o") + ["--time", str(timing)]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - start
    seconds: dict[str, float] = {}
    with open(timing) as f:
        for row in list(csv.reader(f))[1:]:
            name, value = row[1].strip(), float(row[6])
            seconds[name] = round(seconds.get(name, 0.0) + value / 1000, 2)
    return {"kernel": source.name, "wall_s": round(wall, 2), "phases_s": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    arch = parse_arch(args.arch)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for source in kernel_sources(args.arch):
            row = phases(source, arch, Path(tmp))
            rows.append(row)
            split = ", ".join(f"{k} {v:.1f}" for k, v in row["phases_s"].items() if v >= 0.1)
            print(f"{row['kernel']}: {row['wall_s']:.1f} s ({split})", flush=True)
    totals: dict[str, float] = {}
    for row in rows:
        for name, value in row["phases_s"].items():
            totals[name] = round(totals.get(name, 0.0) + value, 2)
    result = {
        "what": "nvcc --time per phase for each distinct kernel of the BERT-large encoder layer, compiled alone, "
        "one after another (bench/nvcc_phases.py)",
        "arch": args.arch,
        "cpus": os.cpu_count(),
        "nvcc": toolchain().nvcc_version,
        "kernels": rows,
        "phase_totals_s": totals,
    }
    out = args.out or ROOT / "bench" / "results" / f"{date.today()}-nvcc-phases-cpu.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"phase totals: {totals}\nwrote {out}")


if __name__ == "__main__":
    main()
