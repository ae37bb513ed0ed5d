"""The model zoo: real models nobody here wrote, imported as users import them, offloaded, built,
checked and timed against PyTorch and TVM's own build on the GPU host.

    python bench/zoo.py [--models resnet50,bert_base,...] [--out DIR] [--torch-compile] [--jobs N]
                        [--phase all|build|time]

Two phases, every model in its own child process in each, so a crash (or a process abort inside a
library) is a row of the table, not the end of the run:

1. build (N models at a time, `--jobs`): torchvision / transformers construction with random init
   (no download), `relax_cutlass.from_torch` (fp32 export -> bound fp16 module; `<model>_onnx` entries:
   a torch.onnx export, then `relax_cutlass.from_onnx`), the offload
   report's summary, the offloaded build and TVM's default build of the same module (each also
   with TVM's CUDA-graph build), each exported as a library under DIR/NAME/; with --torch-compile,
   torch.compile in its default and "reduce-overhead" modes is run once to fill Inductor's caches.
   Imports, TVM builds, nvcc and Inductor are CPU work, so they share the host's cores.
2. time (one model at a time, nothing else running): the libraries loaded, the relative error of
   each against torch float64 on the GPU, and the median time of each against torch eager (fp16,
   cudnn.benchmark, channels_last for conv nets) and torch.compile (its compile now a cache hit).

JSON per model under DIR and a table last. Needs a GPU, torch, torchvision and transformers (the
GPU host). The phases can run in separate calls on the same machine (`--phase build`, then
`--phase time`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.gpu_common import calls_per_sample, time_torch
from relax_cutlass.testing.zoo import BUILDS, ZOO, ZooModel, error_bound, float64_reference, profile_for, table


def _weights_checksum(model) -> float:
    """Sum of |every parameter and buffer| in float64: the time phase rebuilds the model and must
    find the weights the build phase bound into the libraries."""
    return float(sum(t.double().abs().sum() for t in model.state_dict().values() if t.is_floating_point()))


def _torch_model_in_dtype(model, entry: ZooModel, example, torch):
    """torch's 16-bit model (the entry's dtype) and inputs on the GPU, channels_last for conv nets
    (the fast layout)."""
    memory_format = torch.channels_last if entry.family == "vision" else torch.contiguous_format
    dtype = getattr(torch, entry.dtype)
    half = model.cuda().to(dtype).to(memory_format=memory_format)
    inputs = tuple(
        x.cuda().to(dtype).to(memory_format=memory_format) if x.is_floating_point() else x.cuda() for x in example
    )
    return half, inputs


def build_one(entry: ZooModel, out: Path, torch_compile: bool, arch: str, profile: str, builds_wanted) -> dict:
    """Phase 1 for one model, in this process: import, offload, build and export; returns the JSON
    record (the time phase adds to it)."""
    import torch
    import tvm

    import relax_cutlass
    from relax_cutlass.prepare import tvm_baseline
    from relax_cutlass.stages.launches import launches_or_none

    record: dict = {"model": entry.name, "batch": entry.batch, "seq": entry.seq, "dtype": entry.dtype, "steps": {}}
    steps = record["steps"]
    model, example = entry.build()
    record["weights_checksum"] = _weights_checksum(model)

    t0 = time.time()
    mod = entry.import_module(model, example, out)
    steps["import_s"] = round(time.time() - t0, 1)
    # The imported graph as this host's torch exports it (weights omitted), to reproduce on another
    # machine what this one's torch/torchvision/transformers versions produce
    (out / "imported.relax.py").write_text(mod.script(show_meta=False))

    t0 = time.time()
    offloaded = relax_cutlass.offload_pipeline(arch, profile=profile)(mod)
    steps["offload_s"] = round(time.time() - t0, 1)
    report = relax_cutlass.offload_report(offloaded)
    # TVM's own build of the same module; tvm_baseline makes the one rewrite TVM 0.27's CUDA build
    # needs for squeeze-excitation blocks (a broadcast out of a conv's kernel), values unchanged.
    baseline = tvm_baseline(mod)
    record["report"] = {
        "offloaded_regions": len(report.offloaded),
        "offloaded_calls": sum(r.get("calls", 1) for r in report.offloaded),
        "left_in_tvm": len(report.left_in_tvm),
        "flop_fraction": report.offloaded_flop_fraction,
        "kinds": sorted({r["op"] for r in report.offloaded}),
        "in_tvm_reasons": sorted({r["reasons"][0] for r in report.left_in_tvm}),
        "text": str(report),
        # kernels per forward: the offloaded module's and TVM's own build's
        "launches_per_forward": report.launches,
        "tvm_default_launches_per_forward": launches_or_none(baseline),
    }
    print(report, flush=True)

    sm = relax_cutlass.arch.parse_arch(arch)
    target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{sm}{'a' if sm == 90 else ''}"}, host="llvm")
    record["libraries"] = {}
    for name, module in (("relax_cutlass", offloaded), ("tvm_default", baseline)):
        for graph in (False, True):
            key = name + ("_graph" if graph else "")
            if key not in builds_wanted:
                continue
            t0 = time.time()
            config = {"relax.backend.use_cuda_graph": True} if graph else {}
            try:
                with tvm.transform.PassContext(opt_level=3, config=config):
                    ex = tvm.compile(module, target)
                path = out / f"{key}.so"
                ex.export_library(str(path))
                record["libraries"][key] = str(path)
            except Exception as err:  # a baseline TVM cannot build is recorded, not fatal
                record.setdefault("build_errors", {})[key] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                print(f"{entry.name}: {key} build failed: {err}", flush=True)
                if name == "relax_cutlass":
                    raise
            steps[f"build_{key}_s"] = round(time.time() - t0, 1)

    if torch_compile:  # fill Inductor's caches now, while the other models build beside this one
        half, inputs = _torch_model_in_dtype(model, entry, example, torch)
        for mode in ("default", "reduce-overhead"):
            t0 = time.time()
            try:
                compiled = torch.compile(half, mode=mode)
                with torch.no_grad():
                    for _ in range(3):
                        compiled(*inputs)
                torch.cuda.synchronize()
            except Exception as err:
                record.setdefault("build_errors", {})[f"torch_compile_{mode}"] = f"{type(err).__name__}: {err}"[:300]
            steps[f"torch_compile_{mode}_s"] = round(time.time() - t0, 1)
            torch._dynamo.reset()
    return record


def time_one(entry: ZooModel, record: dict, torch_compile: bool) -> dict:
    """Phase 2 for one model, alone on the machine: load the libraries, check and time them beside
    torch."""
    import numpy as np
    import torch
    import tvm

    steps = record["steps"]
    torch.backends.cudnn.benchmark = True
    model, example = entry.build()
    checksum = _weights_checksum(model)
    if abs(checksum - record["weights_checksum"]) > 1e-6 * abs(checksum):
        raise RuntimeError(f"rebuilt weights differ from the built ones: {checksum} vs {record['weights_checksum']}")
    inputs_np = [x.numpy() for x in example]
    dev = tvm.cuda(0)
    example_gpu = tuple(x.cuda() for x in example)
    ref64 = float64_reference(model, example_gpu)
    with torch.no_grad():
        half, half_inputs = _torch_model_in_dtype(model, entry, example, torch)
        ref16 = half(*half_inputs).float().cpu().numpy()
    record["error"] = {"torch_fp16_vs_fp64": rel_error(ref16, ref64)}

    timers = {}
    # each library loaded in a child process first (one that kills its loader is a recorded
    # failure, not the row's end), all at once
    with concurrent.futures.ThreadPoolExecutor() as pool:
        problems = dict(zip(record["libraries"], pool.map(_load_problem, record["libraries"].values()), strict=True))
    for key, path in record["libraries"].items():
        problem = problems[key]
        if problem:  # one library that kills its loader is a recorded failure, not the row's end
            record.setdefault("load_errors", {})[key] = problem
            print(f"{entry.name}: {key}: {problem}", flush=True)
            continue
        vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(path), dev)
        args = [tvm.runtime.tensor(a, dev) for a in inputs_np]
        out = vm["main"](*args)
        out = out if hasattr(out, "numpy") else out[0]
        record["error"][f"{key}_vs_torch_fp64"] = rel_error(out.numpy(), ref64)
        probe = vm.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=0)
        number = calls_per_sample(min(probe(*args).results) * 1e3)
        evaluator = vm.time_evaluator("main", dev, number=number, repeat=10, min_repeat_ms=0)
        timers[key] = lambda e=evaluator, a=args: float(statistics.median(e(*a).results)) * 1e3

    def torch_timer(fn):
        with torch.no_grad():
            number = calls_per_sample(time_torch(fn, repeat=3, number=1))

        def run():
            with torch.no_grad():
                return time_torch(fn, repeat=10, number=number)

        return run

    timers["torch_eager"] = torch_timer(lambda: half(*half_inputs))
    if torch_compile:
        for mode in ("default", "reduce-overhead"):
            t0 = time.time()
            try:
                compiled = torch.compile(half, mode=mode)
                with torch.no_grad():
                    for _ in range(3):
                        compiled(*half_inputs)
                torch.cuda.synchronize()
            except Exception as err:
                record.setdefault("build_errors", {})[f"torch_compile_{mode}"] = f"{type(err).__name__}: {err}"[:300]
                continue
            steps[f"torch_compile_{mode}_cached_s"] = round(time.time() - t0, 1)
            timers[f"torch_compile_{mode}"] = torch_timer(lambda c=compiled: c(*half_inputs))

    times: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(3):  # rounds in turn: clocks drift over a run
        for key, timer in timers.items():
            times[key].append(timer())
    record["ms"] = {k: statistics.median(v) for k, v in times.items()}
    ours = [v for k, v in record["error"].items() if k.startswith("relax_cutlass")]
    record["error_bound"] = error_bound(record["error"]["torch_fp16_vs_fp64"])
    record["ok"] = bool(np.isfinite(ref64).all()) and bool(ours) and max(ours) <= record["error_bound"]
    return record


def _load_problem(path: str) -> str:
    """'' if a child process loads the library at `path`, else what went wrong (a signal too)."""
    code = "import sys, tvm; tvm.runtime.load_module(sys.argv[1])"
    try:
        done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "loading took over 300 s"
    if done.returncode == 0:
        return ""
    # the whole native backtrace TVM prints on a signal: where in the loader it died
    frames = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
    return f"load_module failed (exit {done.returncode}): {' | '.join(frames)[-4000:]}"


def _child(args) -> int:
    entry = next(e for e in ZOO if e.name == args.one)
    folder = Path(args.out) / entry.name
    path = folder / "record.json"
    try:
        if args.phase == "build":
            folder.mkdir(parents=True, exist_ok=True)
            builds = tuple(args.builds.split(","))
            profile = profile_for(entry.name, args.profile)
            record = build_one(entry, folder, args.torch_compile, args.arch, profile, builds)
            record["profile"] = profile
        else:
            record = time_one(entry, json.loads(path.read_text()), args.torch_compile)
    except Exception as err:
        record = json.loads(path.read_text()) if args.phase == "time" and path.exists() else {"model": entry.name}
        record["failed"] = f"{args.phase}: {type(err).__name__}: {str(err)[:2000]}"
        traceback.print_exc()
    path.write_text(json.dumps(record, indent=1, default=str))
    return 0


def _child_command(args, name: str, phase: str) -> list[str]:
    cmd = [sys.executable, __file__, "--one", name, "--phase", phase, "--out", args.out, "--arch", args.arch]
    cmd += ["--profile", args.profile, "--builds", args.builds]
    return cmd + (["--torch-compile"] if args.torch_compile else [])


def _finish(name: str, path: Path, code, wall_s: float, phase: str) -> dict:
    if path.exists():
        record = json.loads(path.read_text())
    else:
        record = {"model": name}
    finished = "libraries" in record if phase == "build" else "ms" in record
    if "failed" not in record and not finished:
        record["failed"] = f"{phase}: process ended without a result (exit {code})"
    record.setdefault("wall_s", {})[phase] = round(wall_s, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str))
    status = "FAILED " + record["failed"][:300] if "failed" in record else "done"
    print(f"=== {phase} {name}: {status} ({wall_s:.0f} s)", flush=True)
    return record


def run_build_phase(args, names: list[str]) -> None:
    """Every model's build in its own process, `--jobs` at a time, the cores shared between them."""
    jobs = max(1, args.jobs)
    env = dict(os.environ)
    per_job = max(2, (os.cpu_count() or 2) // jobs)
    env.setdefault("RELAX_CUTLASS_JOBS", str(per_job))
    env.setdefault("OMP_NUM_THREADS", str(per_job))
    pending, running = list(names), {}
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            path = Path(args.out) / name / "record.json"
            path.unlink(missing_ok=True)
            log = open(Path(args.out) / f"{name}.build.log", "w")  # noqa: SIM115  (closed below)
            proc = subprocess.Popen(_child_command(args, name, "build"), env=env, stdout=log, stderr=subprocess.STDOUT)
            running[name] = (proc, time.time(), log)
            print(f"=== build {name} started", flush=True)
        time.sleep(1)
        for name, (proc, t0, log) in list(running.items()):
            code = proc.poll()
            if code is None and time.time() - t0 < args.timeout:
                continue
            if code is None:
                proc.kill()
                proc.wait()
                code = "timeout"
            log.close()
            del running[name]
            _finish(name, Path(args.out) / name / "record.json", code, time.time() - t0, "build")


def run_time_phase(args, names: list[str]) -> list[dict]:
    records = []
    for name in names:
        path = Path(args.out) / name / "record.json"
        record = json.loads(path.read_text()) if path.exists() else {"model": name, "failed": "build: no record"}
        if "failed" in record:
            records.append(record)
            continue
        t0 = time.time()
        print(f"=== time {name}", flush=True)
        try:
            code = subprocess.run(_child_command(args, name, "time"), timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        records.append(_finish(name, path, code, time.time() - t0, "time"))
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(e.name for e in ZOO))
    ap.add_argument("--out", default=os.environ.get("OUT", "build/zoo"))
    ap.add_argument("--arch", default="auto")
    ap.add_argument(
        "--profile", default="never", help="relax_cutlass profile= (auto tunes on this GPU; auto:a+b: models a, b only)"
    )
    ap.add_argument("--torch-compile", action="store_true", help="also time torch.compile (default, reduce-overhead)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per model and phase")
    ap.add_argument("--jobs", type=int, default=1, help="models built at once in the build phase")
    ap.add_argument("--phase", choices=("all", "build", "time"), default="all")
    ap.add_argument("--builds", default=",".join(BUILDS), help="which TVM builds to make and time")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out = str(Path(args.out).resolve())
    if args.one:
        return _child(args)
    names = args.models.split(",")
    unknown = sorted(set(names) - {e.name for e in ZOO})
    if unknown:
        ap.error(f"unknown models {unknown}; the zoo has {[e.name for e in ZOO]}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.phase in ("all", "build"):
        run_build_phase(args, names)
    if args.phase in ("all", "time"):
        records = run_time_phase(args, names)
        (Path(args.out) / "zoo.json").write_text(json.dumps(records, indent=1, default=str))
        print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
