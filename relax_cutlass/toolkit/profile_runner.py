"""Run a profiler built by `relax_cutlass.stages.profile` on a GPU host and write tuning records.

    python -m relax_cutlass.toolkit.profile_runner build/profile tuning.jsonl [--repeat 7]

Needs only the TVM runtime and numpy (torch, when present, computes the reference faster). Each
candidate first runs once on random (never zero) data and is checked against a float32 reference,
its epilogue (bias, activation, residual) included; only a correct candidate's time counts. Times
are the median of `repeat` CUDA-event measurements of back-to-back launches.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from .tuning import TuningDatabase, TuningKey, TuningRecord

REL_TOLERANCE = 1e-2  # fp16 output rounding + fp16 accumulation stay well below


def reference_error(got: np.ndarray, want) -> float:
    """Relative L2 error of `got` against `want`: the whole reference, or (index, values), a
    reference computed at part of the output (`got[index]`; the attention kind's long sequences)."""
    if isinstance(want, tuple):
        index, want = want
        got = got[index]
    got = got.astype("float64")
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _iterations_for(first_ms: float, target_ms: float = 2.0) -> int:
    return max(3, min(200, int(target_ms / max(first_ms, 1e-4))))


def _problem(job: dict, rng: np.random.Generator, tvm, dev):
    """-> (output shape, float32 reference (or (index, values) of part of the output), call(fn, out,
    split_k, iterations)), from the `reference` module of the job's kind, which the manifest names
    (numpy only, like this module). Inputs are random, never zero."""
    reference = importlib.import_module(job["reference"])
    return reference.problem(job, rng, tvm, dev)


def run_profiler(directory: Path, db_path: Path, repeat: int = 7, log=print) -> list[TuningRecord]:
    import tvm

    manifest = json.loads((directory / "profile.json").read_text())
    lib = tvm.runtime.load_module(str(directory / manifest["library"]))
    dev = tvm.cuda(0)
    device = device_name() or "unknown GPU"
    rng = np.random.default_rng(0)
    records = []
    for number, job in enumerate(manifest["jobs"], 1):
        out_shape, want, call = _problem(job, rng, tvm, dev)
        if number == 1:  # an idle GPU sits at a low clock: bring it up before the first measurement
            first = job["candidates"][0]
            fn = lib.get_function(first["function"])
            _warm_up(lambda out, fn=fn, call=call, split=first["split_k"]: call(fn, out, split, 20), out_shape, dev)
        timings: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        for cand in job["candidates"]:
            fn, label = lib.get_function(cand["function"]), cand["label"]
            out = tvm.runtime.tensor(np.full(out_shape, np.nan, job["out_dtype"]), dev)
            try:
                first_ms = call(fn, out, cand["split_k"], 1)
                err = reference_error(out.numpy(), want)
                if err > REL_TOLERANCE:
                    timings[label], errors[label] = None, f"relative error {err:.2e} > {REL_TOLERANCE}"
                    continue
                iters = _iterations_for(first_ms)
                timings[label] = statistics.median(call(fn, out, cand["split_k"], iters) for _ in range(repeat))
            except Exception as e:  # a candidate that cannot run is recorded as failed, never chosen
                timings[label], errors[label] = None, f"{type(e).__name__}: {str(e)[:200]}"
        key = TuningKey.from_json(job["key"])
        stage = f" +{key.epilogue}" if key.epilogue else ""
        status = f"[{number}/{len(manifest['jobs'])}] {key.op} {key.layout} {list(key.shape)} {key.element}{stage}"
        ok = {label: ms for label, ms in timings.items() if ms is not None}
        if not ok:
            log(f"{status}: no candidate passed the correctness check: {errors}")
            continue
        best = min(ok, key=ok.get)
        cand = next(c for c in job["candidates"] if c["label"] == best)
        records.append(
            TuningRecord(
                key,
                cand["tile"],
                ok[best],
                split_k=cand["split_k"],
                candidates=timings,
                device=device,
                heuristic=job["heuristic"],
            )
        )
        heuristic = timings.get(job["heuristic"])
        versus = f"; heuristic's {job['heuristic']} {heuristic * 1e3:.1f} us" if heuristic else ""
        log(f"{status}: {best} {ok[best] * 1e3:.1f} us ({len(ok)}/{len(timings)} candidates correct{versus})")
        for label, reason in errors.items():
            log(f"    {label} rejected: {reason}")
    TuningDatabase(db_path).add(records)
    return records


def _warm_up(launch, out_shape, dev, seconds: float = 3.0) -> None:
    import tvm

    out = tvm.runtime.tensor(np.zeros(out_shape, "float16"), dev)
    end = time.time() + seconds
    while time.time() < end:
        launch(out)


def device_name() -> str:
    """The local GPU's model name, as tuning records store it ("" where none can be read)."""
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # torch is optional here
        import subprocess

        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
            ).stdout.strip()
        except OSError:
            return ""
        return out.splitlines()[0] if out else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m relax_cutlass.toolkit.profile_runner", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("directory", type=Path, help="what relax_cutlass.stages.profile built (profile.json, profiler.so)")
    ap.add_argument("database", type=Path, help="tuning database (JSON lines) to append to")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    t0 = time.time()
    records = run_profiler(args.directory, args.database, args.repeat)
    print(f"wrote {len(records)} record(s) to {args.database} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
