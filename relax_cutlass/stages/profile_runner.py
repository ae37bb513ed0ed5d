"""Run a profiler built by `relax_cutlass.stages.profile` on a GPU host and write tuning records.

    python -m relax_cutlass.stages.profile_runner build/profile tuning.jsonl [--repeat 7]

Needs only the TVM runtime and numpy (torch, when present, computes the reference faster). Each
candidate first runs once on random (never zero) data and is checked against a float32 reference,
its epilogue (bias, activation, residual) included; only a correct candidate's time counts. Times
are the median of `repeat` CUDA-event measurements of back-to-back launches.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import tvm_ffi

from .tuning import TuningDatabase, TuningKey, TuningRecord

REL_TOLERANCE = 1e-2  # fp16 output rounding + fp16 accumulation stay well below


def _gemm_reference(a: np.ndarray, b: np.ndarray, b_transposed: bool) -> np.ndarray:
    bt = b.T if b_transposed else b
    torch = _torch_cuda()
    if torch is not None:
        ta, tb = torch.from_numpy(a).cuda().float(), torch.from_numpy(np.ascontiguousarray(bt)).cuda().float()
        return (ta @ tb).cpu().numpy()
    return a.astype("float32") @ bt.astype("float32")


def _conv2d_reference(x: np.ndarray, w: np.ndarray, geometry: list[int]) -> np.ndarray:
    """NHWC x OHWI -> NHWC in float32 (torch on the GPU when available, else numpy im2col)."""
    n, h, wd, c, k, r, s, p, q, pad_h, pad_w, sh, sw, dh, dw = geometry
    torch = _torch_cuda()
    if torch is not None:
        import torch.nn.functional as F

        tx = torch.from_numpy(x).cuda().float().permute(0, 3, 1, 2)
        tw = torch.from_numpy(w).cuda().float().permute(0, 3, 1, 2)
        # Padding as (top, left) with the output size P, Q given: pad the far side enough, crop.
        tx = F.pad(tx, (pad_w, max(0, (q - 1) * sw + (s - 1) * dw + 1 - wd - pad_w),
                        pad_h, max(0, (p - 1) * sh + (r - 1) * dh + 1 - h - pad_h)))  # fmt: skip
        y = F.conv2d(tx, tw, stride=(sh, sw), dilation=(dh, dw))[:, :, :p, :q]
        return y.permute(0, 2, 3, 1).contiguous().cpu().numpy()
    xp = np.zeros((n, h + 2 * pad_h + (r - 1) * dh + p * sh, wd + 2 * pad_w + (s - 1) * dw + q * sw, c), "float32")
    xp[:, pad_h : pad_h + h, pad_w : pad_w + wd] = x
    out = np.zeros((n, p, q, k), "float32")
    for i in range(r):
        for j in range(s):
            patch = xp[:, i * dh : i * dh + p * sh : sh, j * dw : j * dw + q * sw : sw][:, :p, :q]
            out += patch @ w[:, i, j, :].astype("float32").T
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.5e-7 (Abramowitz & Stegun 7.1.26): numpy has none, and the check's tolerance is 1e-2."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


# The epilogue activations (kernel_spec.ACTIVATIONS' built-in ones) in numpy, float32.
ACTIVATION_REFERENCE = {
    "identity": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
}


def _with_epilogue(acc: np.ndarray, epilogue: dict, bias: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """D = post(act(acc + bias) + residual), as kernel_spec.Epilogue defines it (float32)."""
    y = acc + bias.astype("float32") if epilogue.get("bias") else acc
    y = ACTIVATION_REFERENCE[epilogue.get("activation", "identity")](y)
    if epilogue.get("residual"):
        y = ACTIVATION_REFERENCE[epilogue.get("residual_activation", "identity")](y + residual.astype("float32"))
    return y


def _torch_cuda():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def _rel_error(got: np.ndarray, want: np.ndarray) -> float:
    got = got.astype("float64")
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _iterations_for(first_ms: float, target_ms: float = 2.0) -> int:
    return max(3, min(200, int(target_ms / max(first_ms, 1e-4))))


def _problem(job: dict, rng: np.random.Generator, tvm, dev):
    """-> (output shape, float32 reference, call(fn, out, split_k, iterations)). Inputs are random,
    never zero; bias and residual are stand-ins of one element unless the epilogue reads them."""
    dtype = job["dtype"]
    epilogue = job.get("epilogue", {})
    if job["op"] == "attention":
        return _attention_problem(job, rng, tvm, dev)
    if job["op"] == "conv2d":
        g = job["conv"]
        n, h, wd, c, k, r, s, p, q = g[:9]
        x = rng.uniform(-1, 1, size=(n, h, wd, c)).astype(dtype)
        w = (rng.uniform(-1, 1, size=(k, r, s, c)) / np.sqrt(r * s * c)).astype(dtype)
        inputs, acc, out_shape = (x, w), _conv2d_reference(x, w, g), (n, p, q, k)
        extra = (tvm_ffi.Shape(g),)
    else:
        m, n, k, bt = job["m"], job["n"], job["k"], job["b_transposed"]
        a = rng.uniform(-1, 1, size=(m, k)).astype(dtype)
        b = (rng.uniform(-1, 1, size=(n, k) if bt else (k, n)) / np.sqrt(k)).astype(dtype)
        inputs, acc, out_shape = (a, b), _gemm_reference(a, b, bt), (m, n)
        extra = (m, n, k, bt)
    bias = rng.uniform(-1, 1, size=out_shape[-1] if epilogue.get("bias") else 1).astype(dtype)
    residual = rng.uniform(-1, 1, size=out_shape if epilogue.get("residual") else 1).astype(dtype)
    want = _with_epilogue(acc, epilogue, bias, residual)
    tensors = [tvm.runtime.tensor(v, dev) for v in (*inputs, bias, residual)]

    def call(fn, out, split_k, iterations):
        if job["op"] == "conv2d":
            return fn(*tensors, out, *extra, split_k, iterations)
        return fn(*tensors, out, *extra, iterations)

    return out_shape, want, call


def _attention_problem(job: dict, rng: np.random.Generator, tvm, dev):
    """q, k, v as packed BSNH tensors; the reference is softmax(q k^T * scale) v per head (float32)."""
    b, s, t, n, h, dv = job["attention"]
    q = rng.uniform(-1, 1, size=(b, s, n, h)).astype(job["dtype"])
    k = rng.uniform(-1, 1, size=(b, t, n, h)).astype(job["dtype"])
    v = rng.uniform(-1, 1, size=(b, t, n, dv)).astype(job["dtype"])
    scores = np.einsum("bsnh,btnh->bnst", q.astype("float32"), k.astype("float32")) * job["scale"]
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = np.einsum("bnst,btnv->bsnv", probs, v.astype("float32"))
    tensors = [tvm.runtime.tensor(x, dev) for x in (q, k, v)]
    shape = tvm_ffi.Shape(job["attention"])

    def call(fn, out, _split_k, iterations):
        return fn(*tensors, out, shape, float(job["scale"]), iterations)

    return (b, s, n, dv), want, call


def run_profiler(directory: Path, db_path: Path, repeat: int = 7, log=print) -> list[TuningRecord]:
    import tvm

    manifest = json.loads((directory / "profile.json").read_text())
    lib = tvm.runtime.load_module(str(directory / manifest["library"]))
    dev = tvm.cuda(0)
    device_name = _device_name()
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
                err = _rel_error(out.numpy(), want)
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
                device=device_name,
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
    ap = argparse.ArgumentParser(
        prog="python -m relax_cutlass.stages.profile_runner", description=__doc__.split("\n\n")[0]
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
