"""One inference of each zoo model's relax_cutlass library under `compute-sanitizer --tool memcheck`
(run after `bench/zoo.py --phase build`): every out-of-bounds or misaligned access, of our kernels
and TVM's, counted; a model's row is ok when the sanitizer reports 0 errors and the output is finite.

    python scripts/memcheck_zoo.py build/zoo bert_base gpt2 ... [--json OUT] [--library relax_cutlass]

The example inputs are made here (the zoo's deterministic builders), saved beside the library, and
read back by a bare child process (`--run`: TVM's runtime and numpy only) that the sanitizer runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _sanitizer() -> str:
    found = shutil.which("compute-sanitizer")
    for candidate in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        path = Path(candidate) / "bin" / "compute-sanitizer"
        if not found and candidate and path.exists():
            found = str(path)
    if not found:
        raise SystemExit("compute-sanitizer not found: put the CUDA toolkit's bin on PATH or set CUDA_HOME")
    return found


def run_once(library: str, inputs: str) -> None:
    """The sanitized child: load the library, run main once on the saved inputs, report the output."""
    import numpy as np
    import tvm

    dev = tvm.cuda(0)
    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(library), dev)
    arrays = np.load(inputs)
    out = vm["main"](*[tvm.runtime.tensor(arrays[f"a{i}"], dev) for i in range(len(arrays.files))])
    while not hasattr(out, "numpy"):
        out = out[0]
    dev.sync()
    values = out.numpy().astype("float64")
    print(f"output {values.shape} finite={bool(np.isfinite(values).all())}", flush=True)


def check(name: str, zoo_dir: Path, library: str, timeout: int) -> dict:
    from relax_cutlass.testing.zoo import ZOO

    record_path = zoo_dir / name / "record.json"
    if not record_path.is_file():  # a model the build stage did not reach, or a misspelled name
        return {"model": name, "ok": False, "problem": f"no build record {record_path} (bench/zoo.py --phase build)"}
    record = json.loads(record_path.read_text())
    path = record.get("libraries", {}).get(library)
    if path is None:
        return {"model": name, "ok": False, "problem": f"no {library} library in {zoo_dir / name}"}
    _, example = {e.name: e for e in ZOO}[name].build()
    inputs = zoo_dir / name / "memcheck_inputs.npz"
    import numpy as np

    np.savez(inputs, **{f"a{i}": x.numpy() for i, x in enumerate(example)})
    command = [
        _sanitizer(),
        "--tool",
        "memcheck",
        "--print-limit",
        "20",
        sys.executable,
        __file__,
        "--run",
        path,
        str(inputs),
    ]
    t0 = time.time()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "ok": False, "problem": f"timed out after {timeout} s"}
    log = proc.stdout + proc.stderr
    summary = re.search(r"ERROR SUMMARY: (\d+) error", log)
    errors = int(summary.group(1)) if summary else None
    finite = "finite=True" in log
    first = next(
        (line for line in log.splitlines() if "=========" in line and ("Invalid" in line or "Error" in line)), ""
    )
    return {
        "model": name,
        "errors": errors,
        "output_finite": finite,
        "exit_code": proc.returncode,
        "seconds": round(time.time() - t0, 1),
        "first_error": first.strip(),
        "ok": errors == 0 and finite and proc.returncode == 0,
        "log_tail": log[-1500:] if errors != 0 or proc.returncode else "",
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--run":
        run_once(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("zoo_dir", type=Path)
    ap.add_argument("names", nargs="+", help="zoo entries (separate words, or comma-separated)")
    ap.add_argument("--library", default="relax_cutlass")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per model")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for name in [n for word in args.names for n in word.split(",") if n]:
        row = check(name, args.zoo_dir, args.library, args.timeout)
        rows.append(row)
        verdict = "ok" if row["ok"] else "FAILED " + (row.get("problem") or row["first_error"])
        print(f"{name:22s} errors={row.get('errors')} finite={row.get('output_finite')} {verdict}", flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
    print(f"memcheck: {sum(r['ok'] for r in rows)} of {len(rows)} models with 0 errors")


if __name__ == "__main__":
    main()
