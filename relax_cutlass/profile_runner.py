"""Run a profiler built by `relax_cutlass.profile` on a GPU host and write tuning records.

    python -m relax_cutlass.profile_runner build/profile tuning.jsonl [--repeat 7]

Needs only the TVM runtime and numpy (torch, when present, computes the reference faster). Each
candidate first runs once on random (never zero) data and is checked against a float32 reference;
only a correct candidate's time counts. Times are the median of `repeat` CUDA-event measurements of
back-to-back launches.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from .tuning import TuningDatabase, TuningKey, TuningRecord

REL_TOLERANCE = 1e-2  # fp16 output rounding + fp16 accumulation stay well below


def _reference(a: np.ndarray, b: np.ndarray, b_transposed: bool) -> np.ndarray:
    bt = b.T if b_transposed else b
    try:
        import torch

        if torch.cuda.is_available():
            return (
                (torch.from_numpy(a).cuda().float() @ torch.from_numpy(np.ascontiguousarray(bt)).cuda().float())
                .cpu()
                .numpy()
            )
    except ImportError:
        pass
    return a.astype("float32") @ bt.astype("float32")


def _rel_error(got: np.ndarray, want: np.ndarray) -> float:
    got = got.astype("float64")
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _iterations_for(first_ms: float, target_ms: float = 2.0) -> int:
    return max(3, min(200, int(target_ms / max(first_ms, 1e-4))))


def run_profiler(directory: Path, db_path: Path, repeat: int = 7, log=print) -> list[TuningRecord]:
    import tvm

    manifest = json.loads((directory / "profile.json").read_text())
    lib = tvm.runtime.load_module(str(directory / manifest["library"]))
    dev = tvm.cuda(0)
    device_name = _device_name()
    rng = np.random.default_rng(0)
    records = []
    for number, job in enumerate(manifest["jobs"], 1):
        m, n, k, bt = job["m"], job["n"], job["k"], job["b_transposed"]
        a = rng.uniform(-1, 1, size=(m, k)).astype(job["dtype"])
        b = (rng.uniform(-1, 1, size=(n, k) if bt else (k, n)) / np.sqrt(k)).astype(job["dtype"])
        want = _reference(a, b, bt)
        ta, tb = tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev)
        if number == 1:  # an idle GPU sits at a low clock: bring it up before the first measurement
            _warm_up(lib.get_function(job["candidates"][0]["function"]), (ta, tb, m, n, k, bt), dev, job["out_dtype"])
        timings: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        for cand in job["candidates"]:
            fn = lib.get_function(cand["function"])
            td = tvm.runtime.tensor(np.full((m, n), np.nan, job["out_dtype"]), dev)
            try:
                first = fn(ta, tb, td, m, n, k, bt, 1)
                err = _rel_error(td.numpy(), want)
                if err > REL_TOLERANCE:
                    timings[cand["tile"]] = None
                    errors[cand["tile"]] = f"relative error {err:.2e} > {REL_TOLERANCE}"
                    continue
                iters = _iterations_for(first)
                timings[cand["tile"]] = statistics.median(fn(ta, tb, td, m, n, k, bt, iters) for _ in range(repeat))
            except Exception as e:  # a candidate that cannot run is recorded as failed, never chosen
                timings[cand["tile"]] = None
                errors[cand["tile"]] = f"{type(e).__name__}: {str(e)[:200]}"
        ok = {t: ms for t, ms in timings.items() if ms is not None}
        key = TuningKey.from_json(job["key"])
        status = f"[{number}/{len(manifest['jobs'])}] {key.layout} M={m} N={n} K={k} {key.element}"
        if not ok:
            log(f"{status}: no candidate passed the correctness check: {errors}")
            continue
        best = min(ok, key=ok.get)
        records.append(TuningRecord(key, best, ok[best], candidates=timings, device=device_name))
        heuristic = timings.get(job.get("heuristic_tile"))
        versus = f"; heuristic's {job.get('heuristic_tile')} {heuristic * 1e3:.1f} us" if heuristic else ""
        log(f"{status}: {best} {ok[best] * 1e3:.1f} us ({len(ok)}/{len(timings)} candidates correct{versus})")
        for tile, reason in errors.items():
            log(f"    {tile} rejected: {reason}")
    TuningDatabase(db_path).add(records)
    return records


def _warm_up(fn, args, dev, out_dtype: str, seconds: float = 3.0) -> None:
    import tvm

    ta, tb, m, n, k, bt = args
    td = tvm.runtime.tensor(np.zeros((m, n), out_dtype), dev)
    end = time.time() + seconds
    while time.time() < end:
        fn(ta, tb, td, m, n, k, bt, 20)


def _device_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # torch is optional here
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
        )
        return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown GPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m relax_cutlass.profile_runner", description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", type=Path, help="what relax_cutlass.profile built (profile.json, profiler.so)")
    ap.add_argument("database", type=Path, help="tuning database (JSON lines) to append to")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    t0 = time.time()
    records = run_profiler(args.directory, args.database, args.repeat)
    print(f"wrote {len(records)} record(s) to {args.database} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
