"""Programmatic dependent launch on and off, one built zoo library at a time, in one run.

    python bench/pdl_ab.py --zoo build/zoo --models bert_large [--builds relax_cutlass_graph] [--rounds 2]
                           [--settings 1,0,always]

Every SM90 GEMM, norm and SM90 attention kernel reads RELAX_CUTLASS_PDL once per process, so each
setting ("1": the default, PDL except inside CUDA-graph capture, where only GEMMs of at most 40
GFLOP keep it; "0": never; "always"; "always:gemm", "always:norm+attention": in graphs too for
those kinds only; "always:none": in graphs for none) is timed in
its own child process, the settings in turn for each round (clocks drift over a run),
on the same inputs (the zoo model's example, saved once). The outputs of every setting must be
identical: PDL changes when a kernel is scheduled, never what it computes. Prints a table and
writes pdl_ab.json next to the zoo's records. Needs the GPU host (the libraries of a zoo build).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def child(library: str, inputs_dir: str, out_path: str) -> int:
    import tvm

    dev = tvm.cuda(0)
    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(library), dev)
    names = sorted(Path(inputs_dir).glob("input*.npy"))
    args = [tvm.runtime.tensor(np.load(p), dev) for p in names]
    out = vm["main"](*args)
    out = out if hasattr(out, "numpy") else out[0]
    np.save(out_path, out.numpy())
    evaluator = vm.time_evaluator("main", dev, number=10, repeat=10, min_repeat_ms=0)
    ms = float(statistics.median(evaluator(*args).results)) * 1e3
    print(json.dumps({"ms": ms}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", default="build/zoo")
    ap.add_argument("--models", default="bert_large")
    ap.add_argument("--builds", default="relax_cutlass,relax_cutlass_graph")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settings", default="1,0", help="RELAX_CUTLASS_PDL values, compared with the first")
    ap.add_argument("--child", nargs=3, metavar=("LIBRARY", "INPUTS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(*args.child)

    from relax_cutlass.testing.zoo import ZOO

    entries = {e.name: e for e in ZOO}
    settings = args.settings.split(",")
    rows = []
    for name in args.models.split(","):
        record = json.loads((Path(args.zoo) / name / "record.json").read_text())
        _, example = entries[name].build()
        with tempfile.TemporaryDirectory() as tmp:
            for i, x in enumerate(example):
                np.save(Path(tmp) / f"input{i:02d}.npy", x.numpy())
            for build in args.builds.split(","):
                library = record.get("libraries", {}).get(build)
                if not library:
                    continue
                times: dict[str, list[float]] = {pdl: [] for pdl in settings}
                outputs: dict[str, np.ndarray] = {}
                for _ in range(args.rounds):
                    for pdl in settings:
                        out_path = str(Path(tmp) / f"out{pdl}.npy")
                        done = subprocess.run(
                            [sys.executable, __file__, "--child", library, tmp, out_path],
                            capture_output=True,
                            text=True,
                            env=os.environ | {"RELAX_CUTLASS_PDL": pdl},
                        )
                        if done.returncode != 0:
                            raise RuntimeError(f"{name} {build} PDL={pdl}: {done.stderr[-2000:]}")
                        times[pdl].append(json.loads(done.stdout.strip().splitlines()[-1])["ms"])
                        outputs[pdl] = np.load(out_path)
                first = settings[0]
                rows.append(
                    {
                        "model": name,
                        "build": build,
                        "ms": {pdl: statistics.median(t) for pdl, t in times.items()},
                        "runs": times,
                        "identical": all(np.array_equal(outputs[first], outputs[p], equal_nan=True) for p in settings),
                    }
                )
    print("| model | build | " + " | ".join(f"PDL={p} ms" for p in settings) + " | outputs identical |")
    print("|---|---|" + "---|" * len(settings) + "---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['build']} | "
            + " | ".join(f"{r['ms'][p]:.3f}" for p in settings)
            + f" | {r['identical']} |"
        )
    (Path(args.zoo) / "pdl_ab.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
