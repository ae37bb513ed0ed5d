"""Run the GPU suite on a host with only the TVM runtime, numpy and torch (the lent GPU).

Correctness: every case's relax_cutlass library against TVM's own CUDA build of the same model and
against a float64 torch reference, on two fresh random input sets per shape. Benchmarks:
relax_cutlass vs TVM's default build vs torch eager (cuBLAS) vs torch.compile, timed in one run.

    python scripts/run_gpu_suite.py build/gpu OUT_DIR
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import tvm  # noqa: E402
from gpu_common import random_array, rel_error, shape_of, time_alternating, time_torch  # noqa: E402
from tvm.runtime.vm import VirtualMachine  # noqa: E402

DEV = tvm.cuda(0)
# torch peers get cuDNN's autotuner (what a user timing a conv net turns on): the strongest baseline.
torch.backends.cudnn.benchmark = True
TOL_VS_TVM = 1e-2
TOL_FP32_ACC = 2e-3
TOL_FP16_ACC = 1e-2


def load(path: Path) -> VirtualMachine:
    return VirtualMachine(tvm.runtime.load_module(str(path)), DEV)


def inputs_for(params: list[dict], dims: dict, seed: int) -> dict[str, np.ndarray]:
    out = {}
    for p in params:
        is_weight = p["name"] not in ("x", "residual")
        out[p["name"]] = random_array(p["name"], shape_of(p["shape"], dims), p["dtype"], 0 if is_weight else seed)
    return out


def device_args(params: list[dict], values: dict[str, np.ndarray]) -> list:
    return [tvm.runtime.tensor(values[p["name"]], DEV) for p in params]


def to_host(out) -> np.ndarray:
    if not hasattr(out, "numpy"):  # models imported from a framework return a 1-tuple
        (out,) = out
    return out.numpy()


def call(vm: VirtualMachine, args: list) -> np.ndarray:
    return to_host(vm["main"](*args))


def run(vm: VirtualMachine, params: list[dict], values: dict[str, np.ndarray]) -> np.ndarray:
    return call(vm, device_args(params, values))


ACT = {
    "identity": lambda t: t,
    "relu": torch.relu,
    "gelu": lambda t: F.gelu(t),
    "gelu_decomposed": lambda t: F.gelu(t),
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "hardswish": F.hardswish,
    "quick_gelu": lambda t: t * torch.sigmoid(1.702 * t),  # the custom activation of tutorial 02
}


def _conv2d_nchw(t: dict, spec: dict):
    """F.conv2d in the model's NCHW layout; (top, left, bottom, right) padding applied as F.pad."""
    pad = spec.get("padding", 1)
    top, left, bottom, right = (pad,) * 4 if isinstance(pad, int) else pad
    x = F.pad(t["x"], (left, right, top, bottom))
    y = F.conv2d(x, t["w"], stride=spec.get("stride", 1), dilation=spec.get("dilation", 1))
    return y + t["b"].view(1, -1, 1, 1) if spec.get("bias", True) else y


def reference_f64(spec: dict, values: dict[str, np.ndarray]) -> np.ndarray:
    """The model's math in float64 on the GPU (a dense/matmul model, or a conv2d one if `spec` has C)."""
    t = {k: torch.from_numpy(np.asarray(v, dtype="float64")).cuda() for k, v in values.items()}
    if "attention" in spec:
        return attention_f64(spec, t).cpu().numpy()
    if "c" in spec:
        y = _conv2d_nchw(t, spec)
    else:
        w = t["w"] if not spec.get("transposed", True) else t["w"].T
        y = t["x"] @ w
        if spec.get("bias", True):
            y = y + t["b"]
    y = ACT[spec.get("activation", "identity")](y)
    if spec.get("residual"):
        y = y + t["residual"]
        if spec.get("residual_relu"):
            y = torch.relu(y)
    return y.cpu().numpy()


def attention_operands(spec: dict, t: dict):
    """(q, k, v) as (B, S, N, H) views of the case's inputs: the exported form splits the heads
    of x (q) and y (k; v is y * 0.5), R.nn.attention takes them as x, y, z."""
    if spec["attention"] == "op":
        return t["x"], t["y"], t["z"]
    n, h = spec["heads"], spec["head_dim"]
    x, y = t["x"], t["y"]
    return x.view(*x.shape[:2], n, h), y.view(*y.shape[:2], n, h), (y * 0.5).view(*y.shape[:2], n, h)


def attention_f64(spec: dict, t: dict):
    q, k, v = attention_operands(spec, t)
    probs = (torch.einsum("bsnh,btnh->bnst", q, k) * spec["scale"]).softmax(-1)
    out = torch.einsum("bnst,btnv->bsnv", probs, v)
    return out if spec["attention"] == "op" else out.reshape(*out.shape[:2], -1)


def attention_bench_case(case: dict, build: Path, _use_compile: bool) -> dict:
    """The fused kernel against TVM's default build of the same graph, torch eager (the same
    math, cuBLAS batched matmuls + softmax) and torch's scaled_dot_product_attention (flash)."""
    spec = case["spec"]
    dims = case["runs"][0]
    values = inputs_for(case["tvm_params"], dims, 1)
    row = {"name": case["name"], "kernel": case["offloaded"][0]["kernel"], "dims": dims}
    row["relax_cutlass_ms"] = time_vm(load(build / f"{case['name']}.cutlass.so"), case["cutlass_params"], values)
    row["tvm_ms"] = time_vm(load(build / f"{case['name']}.tvm.so"), case["tvm_params"], values)
    t = {k: torch.from_numpy(v).cuda() for k, v in values.items()}
    q, k, v = (a.transpose(1, 2) for a in attention_operands(spec, t))  # (B, N, S, H)
    scale = spec["scale"]

    def eager():
        probs = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1, dtype=torch.float32).to(q.dtype)
        return (probs @ v).transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    row["torch_eager_ms"] = time_torch(eager)
    row["torch_sdpa_ms"] = time_torch(sdpa)
    row["vs_tvm"] = row["tvm_ms"] / row["relax_cutlass_ms"]
    row["vs_torch_eager"] = row["torch_eager_ms"] / row["relax_cutlass_ms"]
    row["vs_torch_sdpa"] = row["torch_sdpa_ms"] / row["relax_cutlass_ms"]
    return row


def family_build(case: dict, build: Path, family: str) -> tuple[VirtualMachine, str]:
    """One kernel family's library of a check case ("auto": the target's native kernels), and the
    kernel it runs (or why the region stayed in TVM)."""
    suffix = "cutlass" if family == "auto" else f"cutlass_{family}"
    if not case["offloaded"]:
        kernel = "stays in TVM: " + "; ".join(case["left_in_tvm"][0]["reasons"])
    else:
        kernel = case["offloaded"][0]["kernel"] if family == "auto" else case["sm80_kernels"][0]
    return load(build / f"{case['name']}.{suffix}.so"), kernel


def check_case(case: dict, build: Path) -> list[dict]:
    """Each kernel family's library against TVM's build and float64, on two input sets per shape."""
    vm_t = load(build / f"{case['name']}.tvm.so")
    spec = case.get("spec", {})
    acc = spec.get("options", {}).get("accumulator", "float32")
    rows = []
    for family in case.get("families", ["auto"]):
        vm_c, kernel = family_build(case, build, family)
        for dims in case["runs"]:
            for seed in (1, 2):  # two input sets: stale or unwritten output cannot pass both
                values = inputs_for(case["tvm_params"], dims, seed)
                got = run(vm_c, case["cutlass_params"], values)
                ref = run(vm_t, case["tvm_params"], values)
                row = {
                    "case": case["name"],
                    "kernel": kernel,
                    "dims": dims,
                    "seed": seed,
                    "shape": list(got.shape),
                    "dtype": str(got.dtype),
                    "err_vs_tvm": rel_error(got, ref),
                }
                # TVM's default build accumulates a bf16 matmul in bf16: it is itself ~2e-2 from float64
                # there, so bf16 is held to float64 (below) and to TVM only within 3e-2.
                tol_tvm = TOL_VS_TVM if spec.get("dtype", "float16") == "float16" else 3e-2
                ok = got.shape == ref.shape and got.dtype == ref.dtype and row["err_vs_tvm"] <= tol_tvm
                if "spec" in case:
                    row["err_vs_f64"] = rel_error(got, reference_f64(spec, values))
                    # bf16 keeps 8 mantissa bits: its output rounding alone is ~3e-3.
                    precise = acc == "float32" and spec.get("dtype", "float16") == "float16"
                    ok &= row["err_vs_f64"] <= (TOL_FP32_ACC if precise else TOL_FP16_ACC)
                row["ok"] = bool(ok)
                rows.append(row)
    return rows


def check_back_to_back(manifest: dict, build: Path, calls: int = 16) -> list[dict]:
    """Chains of SM90 kernels, which launch as programmatic dependents (PDL), called `calls` times
    back to back with no synchronization in between, each call on its own input set: every output
    must still be TVM's. A kernel that touched its input before the kernel writing it had finished
    would fail here; a check that synchronizes after each call can hide such a race."""
    rows = []
    for case in manifest.get("graphs", []) + manifest.get("frontends", []):
        if sum(r["kernel"].startswith("sm90_") for r in case["offloaded"]) < 2:
            continue
        (vm_c, _), vm_t = family_build(case, build, "auto"), load(build / f"{case['name']}.tvm.so")
        for dims in case["runs"]:
            inputs = [inputs_for(case["tvm_params"], dims, seed) for seed in range(10, 10 + calls)]
            args = [device_args(case["cutlass_params"], values) for values in inputs]
            outputs = [vm_c["main"](*a) for a in args]  # queued back to back; each output kept alive
            expected = [run(vm_t, case["tvm_params"], values) for values in inputs]
            errors = [rel_error(to_host(o), e) for o, e in zip(outputs, expected, strict=True)]
            rows.append(
                {"case": case["name"], "dims": dims, "calls": calls, "max_err_vs_tvm": max(errors),
                 "ok": max(errors) <= TOL_VS_TVM}
            )  # fmt: skip
    return rows


GLUE_CASE = "dense_nk_bias_gelu_unbound"  # weights unbound: the extern takes (x, w, b, out)


def check_glue_errors(manifest: dict, build: Path) -> list[dict]:
    """Call one region's exported function directly with bad arguments: each must raise an error
    that names the problem (the VM's own shape checks would stop most of these earlier)."""
    case = next(c for c in manifest["tests"] if c["name"] == GLUE_CASE)
    region = case["offloaded"][0]
    lib = tvm.runtime.load_module(str(build / f"{GLUE_CASE}.cutlass.so"))
    fn = lib.get_function(region["symbol"], query_imports=True)
    shapes = {role: shape_of(shape, {}) for role, shape in region["shapes"].items()}
    m, n = shapes["lhs"][0], shapes["bias"][0]

    def args(lhs_shape=None, lhs_dtype="float16", lhs_dev=DEV):
        arrays = {r: random_array(r, s, "float16", 3) for r, s in shapes.items()}
        arrays["lhs"] = random_array("lhs", lhs_shape or shapes["lhs"], lhs_dtype, 3)
        out = tvm.runtime.tensor(np.zeros((m, n), "float16"), DEV)
        devs = {"lhs": lhs_dev}
        return [tvm.runtime.tensor(arrays[r], devs.get(r, DEV)) for r in region["shapes"]] + [out], arrays

    rows = []
    good, arrays = args()
    fn(*good)
    expected = np.asarray(reference_f64(case["spec"], {"x": arrays["lhs"], "w": arrays["rhs"], "b": arrays["bias"]}))
    rows.append({"check": "valid call", "ok": rel_error(good[-1].numpy(), expected) <= TOL_FP32_ACC})
    bad_calls = {
        "wrong dtype": (dict(lhs_dtype="float32"), "wrong dtype"),
        "wrong K": (dict(lhs_shape=[m, shapes["lhs"][1] + 8]), "lhs inner dim K"),
        "host tensor": (dict(lhs_dev=tvm.cpu()), "must be on a CUDA device"),
    }
    return rows + _expect_errors(lambda **kwargs: fn(*args(**kwargs)[0]), bad_calls)


GELU_CASE = "dense_bias_gelu_every_fp16"


def check_gelu_every_fp16(manifest: dict, build: Path) -> list[dict]:
    """The 16-bit GELU on the GPU through each kernel family's library: x @ I + 0 with every finite
    fp16 value in x must be within 1 fp16 ulp of the correctly rounded gelu (the bound
    tests/test_gelu16.py proves for the CPU emulation of the same arithmetic)."""
    from fit_gelu16 import finite_fp16, fp16_ulps, gelu_exact

    case = next((c for c in manifest.get("tests", []) if c["name"] == GELU_CASE), None)
    if case is None:
        return []
    x = finite_fp16()
    values = {"x": x.astype("float16").reshape(-1, 8), "w": np.eye(8, dtype="float16"), "b": np.zeros(8, "float16")}
    exact = gelu_exact(x).astype("float16")
    rows = []
    for family in case.get("families", ["auto"]):
        vm, kernel = family_build(case, build, family)
        ulps = fp16_ulps(run(vm, case["cutlass_params"], values).reshape(-1), exact)
        rows.append(
            {
                "check": f"gelu of every fp16 value ({kernel})",
                "ok": bool(ulps.max() <= 1),
                "max_ulps": int(ulps.max()),
                "differing": int(np.count_nonzero(ulps)),
                "inputs": int(x.size),
            }
        )
    return rows


CONV_GLUE_CASE = "conv2d_bias_residual_relu_unbound"


def check_conv_glue_errors(manifest: dict, build: Path) -> list[dict]:
    """The conv2d region's exported function called directly: a valid call, then bad arguments
    that must each raise an error naming the problem."""
    case = next(c for c in manifest.get("conv", []) if c["name"] == CONV_GLUE_CASE)
    region = case["offloaded"][0]
    lib = tvm.runtime.load_module(str(build / f"{CONV_GLUE_CASE}.cutlass.so"))
    fn = lib.get_function(region["symbol"], query_imports=True)
    shapes = {role: shape_of(shape, {}) for role, shape in region["shapes"].items()}

    def call(data_shape=None, data_dtype="float16", data_dev=DEV):
        arrays = {r: random_array(r, s, "float16", 5) for r, s in shapes.items()}
        arrays["data"] = random_array("data", data_shape or shapes["data"], data_dtype, 5)
        out = tvm.runtime.tensor(np.zeros(region["out_shape"], "float16"), DEV)
        args = [tvm.runtime.tensor(arrays[r], data_dev if r == "data" else DEV) for r in region["shapes"]]
        fn(*args, out)
        return out

    rows = [{"check": "conv valid call", "ok": bool(np.isfinite(call().numpy()).all())}]
    data = shapes["data"]
    bad_calls = {
        "conv wrong dtype": (dict(data_dtype="float32"), "wrong dtype"),
        "conv wrong C": (dict(data_shape=[*data[:3], data[3] + 8]), "data C"),
        "conv host tensor": (dict(data_dev=tvm.cpu()), "must be on a CUDA device"),
    }
    return rows + _expect_errors(call, bad_calls)


def _expect_errors(call, bad_calls: dict) -> list[dict]:
    """Each bad call must raise an error whose message names the problem."""
    rows = []
    for name, (kwargs, expected_message) in bad_calls.items():
        try:
            call(**kwargs)
            rows.append({"check": name, "ok": False, "error": "no error raised"})
        except Exception as e:  # the FFI error type varies; the message is what users read
            rows.append({"check": name, "ok": expected_message in str(e), "message": str(e)[:300]})
    return rows


def time_vm(vm: VirtualMachine, params: list[dict], values: dict[str, np.ndarray]) -> float:
    """Median ms over repeats (each the mean of `number` back-to-back calls), after warm-up."""
    return time_args(vm, device_args(params, values))


def time_args(vm: VirtualMachine, args: list) -> float:
    """time_vm on device tensors the caller keeps (a CUDA-graph build needs the same weights)."""
    vm["main"](*args)
    timer = vm.time_evaluator("main", DEV, number=20, repeat=15, min_repeat_ms=0)
    return float(np.median(timer(*args).results)) * 1e3


def torch_linear_fns(case: dict, values: dict[str, np.ndarray]):
    t = {k: torch.from_numpy(v).cuda() for k, v in values.items()}
    x, w, b = t["x"], t["w"], t["b"]
    if case["epilogue"] == "bias_gelu":

        def eager():
            return F.gelu(F.linear(x, w, b))
    else:
        r = t["residual"]

        def eager():
            return F.linear(x, w, b) + r

    def matmul_only():
        return x @ w.T

    return eager, matmul_only


def warm_up_gpu(seconds: float = 3.0) -> None:
    """Bring the clocks up before timing (an idle H100 sits at 345 MHz; the first timed case would
    otherwise run slow)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


BENCH_ROUNDS = [3]  # --rounds


def bench_case(case: dict, build: Path, use_compile: bool) -> dict:
    values = inputs_for(case["tvm_params"], {}, 1)
    vm_c, vm_t = load(build / f"{case['name']}.cutlass.so"), load(build / f"{case['name']}.tvm.so")
    got, ref = run(vm_c, case["cutlass_params"], values), run(vm_t, case["tvm_params"], values)
    row = {k: case[k] for k in ("name", "epilogue", "m", "n", "k", "flops")}
    row["kernel"] = case["offloaded"][0]["kernel"] if case["offloaded"] else None
    row["err_vs_tvm"] = rel_error(got, ref)
    # The ratios the benchmark reports (vs cuBLAS, vs eager, tuned vs heuristic) come from
    # measurements taken in alternation.
    args = device_args(case["cutlass_params"], values)
    eager, matmul_only = torch_linear_fns(case, values)
    timers = {
        "relax_cutlass_ms": lambda: time_args(vm_c, args),
        "cublas_matmul_only_ms": lambda: time_torch(matmul_only),
        "torch_eager_ms": lambda: time_torch(eager),
    }
    if "tuned" in case.get("families", []):
        vm_tuned = load(build / f"{case['name']}.cutlass_tuned.so")
        timers["relax_cutlass_tuned_ms"] = lambda: time_args(vm_tuned, args)
    row |= time_alternating(timers, rounds=BENCH_ROUNDS[0])
    if "tuned" in case.get("families", []):
        row["relax_cutlass_heuristic_alternating_ms"] = row["relax_cutlass_ms"]
        _tuned_fields(row, case, vm_tuned)
    if "sm80" in case.get("families", []):
        vm_80 = load(build / f"{case['name']}.cutlass_sm80.so")
        row["err_sm80_vs_tvm"] = rel_error(run(vm_80, case["cutlass_params"], values), ref)
        row["sm80_kernel"] = case["sm80_kernels"][0]
        row["relax_cutlass_sm80_ms"] = time_vm(vm_80, case["cutlass_params"], values)
    row["tvm_default_ms"] = time_vm(vm_t, case["tvm_params"], values)
    if use_compile:
        compiled = torch.compile(eager)
        row["torch_compile_ms"] = time_torch(compiled)
    # Judged against torch (cuBLAS, fp32 accumulation). TVM's default build accumulates an fp16
    # matmul in fp16, which alone is ~1e-2 off at K=8192; its error is kept for information.
    torch_out = eager().float().cpu().numpy()
    row["err_vs_torch"] = rel_error(got, torch_out)
    if "sm80" in case.get("families", []):
        row["err_sm80_vs_torch"] = rel_error(run(vm_80, case["cutlass_params"], values), torch_out)
    row["ok"] = row["err_vs_torch"] <= TOL_VS_TVM and row.get("err_sm80_vs_torch", 0) <= TOL_VS_TVM
    _check_tuned(row, case, values, torch_out, "torch")
    row["relax_cutlass_tflops"] = case["flops"] / row["relax_cutlass_ms"] / 1e9
    row["cublas_tflops"] = case["flops"] / row["cublas_matmul_only_ms"] / 1e9
    row["vs_cublas_matmul"] = row["cublas_matmul_only_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_torch_eager"] = row["torch_eager_ms"] / row["relax_cutlass_ms"]
    return row


def _time_tuned(row: dict, case: dict, build: Path, values: dict) -> None:
    """The same model built with the tuning database's kernels against the heuristic's build,
    timed in alternation (gpu_common.time_alternating)."""
    vm = load(build / f"{case['name']}.cutlass_tuned.so")
    heuristic_vm = load(build / f"{case['name']}.cutlass.so")
    args = device_args(case["cutlass_params"], values)
    times = time_alternating({"heuristic": lambda: time_args(heuristic_vm, args), "tuned": lambda: time_args(vm, args)})
    row["relax_cutlass_tuned_ms"] = times["tuned"]
    row["relax_cutlass_heuristic_alternating_ms"] = times["heuristic"]
    _tuned_fields(row, case, vm)


def _tuned_fields(row: dict, case: dict, vm: VirtualMachine) -> None:
    """What the tuned build changed, and its speedup over the heuristic's (both timed alternately)."""
    row["_vm_tuned"] = vm
    row["tuned_kernels"] = case["tuned_kernels"]
    row["tuned_same_kernels"] = sorted(k for k, _ in case["tuned_kernels"]) == sorted(
        o["kernel"] for o in case["offloaded"]
    )
    row["tuned_vs_heuristic"] = row["relax_cutlass_heuristic_alternating_ms"] / row["relax_cutlass_tuned_ms"]


def _check_tuned(row: dict, case: dict, values: dict, reference: np.ndarray, against: str) -> None:
    """The tuned build's (timed by _time_tuned) error against `reference`, counted in row["ok"]."""
    if "_vm_tuned" not in row:
        return
    error = rel_error(run(row.pop("_vm_tuned"), case["cutlass_params"], values), reference)
    row[f"err_tuned_vs_{against}"] = error
    row["ok"] &= error <= TOL_VS_TVM


SWEEP_M = (1024, 4096, 8192)


def sweep(manifest: dict, build: Path) -> list[dict]:
    """Time every pinned SM90 configuration at each M, with cuBLAS's plain matmul alongside."""
    rows = []
    for case in manifest.get("sweep", []):
        vm = load(build / f"{case['name']}.cutlass.so")
        for m in SWEEP_M:
            values = inputs_for(case["cutlass_params"], {"m": m}, 1)
            ms = time_vm(vm, case["cutlass_params"], values)
            rows.append(
                {
                    "k": case["k"],
                    "n": case["n"],
                    "m": m,
                    "tile": case["tile"],
                    "ms": ms,
                    "tflops": 2 * m * case["n"] * case["k"] / ms / 1e9,
                }
            )
    for k, n, m in sorted({(r["k"], r["n"], r["m"]) for r in rows}):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        ms = time_torch(lambda x=x, w=w: x @ w.T)
        rows.append(
            {"k": k, "n": n, "m": m, "tile": "cublas_matmul_only", "ms": ms, "tflops": 2 * m * n * k / ms / 1e9}
        )
    return rows


def torch_bert_layer(values: dict[str, np.ndarray], heads: int = 16):
    t = {k: torch.from_numpy(v).cuda() for k, v in values.items()}
    x = t["x"]
    bsz, seq, hidden = x.shape
    hd = hidden // heads

    def lin(inp, n):
        return F.linear(inp, t[f"{n}_w"], t[f"{n}_b"])

    def layer():
        q, k, v = (lin(x, n).view(bsz, seq, heads, hd).transpose(1, 2) for n in ("q", "k", "v"))
        probs = torch.softmax((q @ k.transpose(-1, -2)) * (1 / math.sqrt(hd)), dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(bsz, seq, hidden)
        h = F.layer_norm(lin(ctx, "o") + x, (hidden,), t["ln1_g"], t["ln1_b"])
        y = lin(F.gelu(lin(h, "ffn1")), "ffn2") + h
        return F.layer_norm(y, (hidden,), t["ln2_g"], t["ln2_b"])

    return layer


def model_case(case: dict, build: Path, use_compile: bool) -> dict:
    values = inputs_for(case["tvm_params"], {}, 1)
    vm_c, vm_t = load(build / f"{case['name']}.cutlass.so"), load(build / f"{case['name']}.tvm.so")
    got, ref = run(vm_c, case["cutlass_params"], values), run(vm_t, case["tvm_params"], values)
    layer = torch_bert_layer(values)
    row = {
        "name": case["name"],
        "offloaded_regions": len(case["offloaded"]),
        "left_in_tvm": len(case["left_in_tvm"]),
        "err_vs_tvm": rel_error(got, ref),
        "err_vs_torch": rel_error(got, layer().float().cpu().numpy()),
    }
    row["ok"] = row["err_vs_tvm"] <= TOL_VS_TVM
    row["relax_cutlass_ms"] = time_vm(vm_c, case["cutlass_params"], values)
    if "tuned" in case.get("families", []):
        _time_tuned(row, case, build, values)
        _check_tuned(row, case, values, ref, "tvm")
    row["tvm_default_ms"] = time_vm(vm_t, case["tvm_params"], values)
    if case.get("cuda_graph"):
        _time_cuda_graphs(row, case, build, values)
    row["torch_eager_ms"] = time_torch(layer, repeat=10, number=10)
    if use_compile:
        row["torch_compile_ms"] = time_torch(torch.compile(layer), repeat=10, number=10)
    row["speedup_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_torch_eager"] = row["torch_eager_ms"] / row["relax_cutlass_ms"]
    return row


def bench_conv_case(case: dict, build: Path, use_compile: bool) -> dict:
    """One NHWC 3x3 conv + bias + relu: relax_cutlass vs TVM's build vs cuDNN (torch channels_last)."""
    values = inputs_for(case["tvm_params"], {}, 1)
    vm_c, vm_t = load(build / f"{case['name']}.cutlass.so"), load(build / f"{case['name']}.tvm.so")
    got, ref = run(vm_c, case["cutlass_params"], values), run(vm_t, case["tvm_params"], values)
    t = {k: torch.from_numpy(v).cuda() for k, v in values.items()}
    x = t["x"].permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    w = t["w"].permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    b = t["b"]

    def eager():
        return torch.relu(F.conv2d(x, w, b, padding=1))

    row = {k: case[k] for k in ("name", "batch", "hw", "c", "flops")}
    row["kernel"] = case["offloaded"][0]["kernel"]
    row["split_k"] = case["offloaded"][0]["conv"]["split_k"]
    torch_out = eager().permute(0, 2, 3, 1).float().cpu().numpy()
    row["err_vs_tvm"] = rel_error(got, ref)
    row["err_vs_torch"] = rel_error(got, torch_out)
    row["ok"] = row["err_vs_tvm"] <= TOL_VS_TVM and row["err_vs_torch"] <= TOL_VS_TVM
    row["relax_cutlass_ms"] = time_vm(vm_c, case["cutlass_params"], values)
    if "tuned" in case.get("families", []):
        _time_tuned(row, case, build, values)
        _check_tuned(row, case, values, torch_out, "torch")
    row["tvm_default_ms"] = time_vm(vm_t, case["tvm_params"], values)
    row["torch_eager_ms"] = time_torch(eager)
    if use_compile:
        row["torch_compile_ms"] = time_torch(torch.compile(eager))
    row["relax_cutlass_tflops"] = case["flops"] / row["relax_cutlass_ms"] / 1e9
    row["speedup_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_torch_eager"] = row["torch_eager_ms"] / row["relax_cutlass_ms"]
    return row


@functools.cache
def _torch_models():
    """The PyTorch model builders of relax_cutlass.models (resnet50, bert_encoder_torch), imported
    from the repository root: the GPU host has the whole TVM (../shared/gpu/make-full-bundle), and
    the builders now live in a package whose modules import each other."""
    import types

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from relax_cutlass.models import torch_models, torch_transformers

    builders = {"resnet50": torch_models.resnet50, "bert_encoder_torch": torch_transformers.bert_encoder_torch}
    return types.SimpleNamespace(**builders)


def _end_to_end(case: dict, build: Path, use_compile: bool, details: dict, torch_peer) -> dict:
    """A whole model: relax_cutlass vs TVM's build of the same graph with the same weights (error,
    then times, tuned kernels too when built), vs `torch_peer(values) -> (module, input)` in torch
    eager and torch.compile."""
    values = inputs_for(case["tvm_params"], {}, 1)
    vm_c, vm_t = load(build / f"{case['name']}.cutlass.so"), load(build / f"{case['name']}.tvm.so")
    got, ref = run(vm_c, case["cutlass_params"], values), run(vm_t, case["tvm_params"], values)
    row = {"name": case["name"], **details, "err_vs_tvm": rel_error(got, ref)}
    row["ok"] = row["err_vs_tvm"] <= TOL_VS_TVM
    row["relax_cutlass_ms"] = time_vm(vm_c, case["cutlass_params"], values)
    if "tuned" in case.get("families", []):
        _time_tuned(row, case, build, values)
        _check_tuned(row, case, values, ref, "tvm")
    row["tvm_default_ms"] = time_vm(vm_t, case["tvm_params"], values)
    if case.get("cuda_graph"):
        _time_cuda_graphs(row, case, build, values)
    model, x = torch_peer(values)
    with torch.no_grad():
        row["torch_eager_ms"] = time_torch(lambda: model(x), repeat=10, number=10)
        if use_compile:
            compiled = torch.compile(model)
            row["torch_compile_ms"] = time_torch(lambda: compiled(x), repeat=10, number=10)
    if "flops" in case:
        row["relax_cutlass_tflops"] = case["flops"] / row["relax_cutlass_ms"] / 1e9
    row["speedup_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_torch_eager"] = row["torch_eager_ms"] / row["relax_cutlass_ms"]
    if "torch_compile_ms" in row:
        row["speedup_vs_torch_compile"] = row["torch_compile_ms"] / row["relax_cutlass_ms"]
    return row


def _time_cuda_graphs(row: dict, case: dict, build: Path, values: dict) -> None:
    """Both builds again with TVM's CUDA-graph rewrite, checked and timed. A captured graph keeps
    the addresses of the weights (the parameters after `num_input`), so, as in deployment, the
    weight tensors are made once and reused; the input changes after capture (a replay must read
    the new one) and the result is checked against TVM's plain build."""
    ref_vm = load(build / f"{case['name']}.tvm.so")
    fresh = inputs_for(case["tvm_params"], {}, 2)
    for variant, params, key in (
        ("cutlass_graph", case["cutlass_params"], "relax_cutlass_graph_ms"),
        ("tvm_graph", case["tvm_params"], "tvm_graph_ms"),
    ):
        vm = load(build / f"{case['name']}.{variant}.so")
        args = device_args(params, values)
        call(vm, args)  # captures
        args[0] = tvm.runtime.tensor(fresh[params[0]["name"]], DEV)  # the model input; the rest are weights
        row[f"err_{variant}_vs_tvm"] = rel_error(call(vm, args), run(ref_vm, case["tvm_params"], fresh))
        row["ok"] = row["ok"] and row[f"err_{variant}_vs_tvm"] <= TOL_VS_TVM
        row[key] = time_args(vm, args)
    row["speedup_graph_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_graph_ms"]
    row["speedup_graph_vs_tvm_graph"] = row["tvm_graph_ms"] / row["relax_cutlass_graph_ms"]


def resnet_case(case: dict, build: Path, use_compile: bool) -> dict:
    """ResNet-50 end to end; torch runs the same architecture in fp16 channels_last."""
    convs = [r for r in case["offloaded"] if r["op"] == "conv2d"]
    details = {
        "batch": case["batch"],
        # Counted by call site: with weights as parameters, same-shaped convs share one function.
        "offloaded_regions": sum(r["calls"] for r in case["offloaded"]),
        "offloaded_convs": sum(r["calls"] for r in convs),
        "convs_with_fused_residual": sum(r["calls"] for r in convs if "residual" in r["epilogue"]),
        "convs_with_split_k": sum(r["calls"] for r in convs if r["conv"]["split_k"] > 1),
        "left_in_tvm": [r["op"] + ": " + "; ".join(r["reasons"]) for r in case["left_in_tvm"]],
    }

    def peer(values):
        model = _torch_models().resnet50().half().cuda().to(memory_format=torch.channels_last)
        return model, torch.from_numpy(values["x"]).cuda().half().contiguous(memory_format=torch.channels_last)

    return _end_to_end(case, build, use_compile, details, peer)


def bert_case(case: dict, build: Path, use_compile: bool) -> dict:
    """The transformers BERT-large encoder end to end; torch runs transformers' BertEncoder (written
    in plain torch, since this host has no transformers; tests/test_models.py checks it is the same
    computation) in fp16 with its default sdpa attention."""
    details = {
        "batch": case["batch"],
        "seq": case["seq"],
        "layers": case["layers"],
        "offloaded_regions": sum(r["calls"] for r in case["offloaded"]),
        "regions_with_fused_gelu": sum(r["calls"] for r in case["offloaded"] if "gelu" in r["epilogue"]),
        "left_in_tvm": len(case["left_in_tvm"]),
        "offloaded_flop_fraction": case["offloaded_flops"] / case["flops"],
    }

    def peer(values):
        model = _torch_models().bert_encoder_torch(layers=case["layers"]).half().cuda()
        return model, torch.from_numpy(values[case["tvm_params"][0]["name"]]).cuda().half()

    return _end_to_end(case, build, use_compile, details, peer)


# (header, key, format) of the summary table printed last.
COLUMNS = [
    ("case", "name", "36s"),
    ("cutlass ms", "relax_cutlass_ms", "10.4f"),
    ("tuned ms", "relax_cutlass_tuned_ms", "9.4f"),
    ("tuned x", "tuned_vs_heuristic", "7.2f"),
    ("TFLOP/s", "relax_cutlass_tflops", "8.1f"),
    ("sm80 ms", "relax_cutlass_sm80_ms", "8.4f"),
    ("tvm ms", "tvm_default_ms", "8.3f"),
    ("graph ms", "relax_cutlass_graph_ms", "8.4f"),
    ("eager ms", "torch_eager_ms", "8.4f"),
    ("compile ms", "torch_compile_ms", "10.4f"),
    ("cublas mm", "cublas_matmul_only_ms", "9.4f"),
    ("x tvm", "speedup_vs_tvm", "6.1f"),
    ("x eager", "speedup_vs_torch_eager", "7.2f"),
    ("x cublas", "vs_cublas_matmul", "8.2f"),
]


def print_summary(results: dict) -> None:
    tests = results["tests"] + [r for key in CHECKED if key != "tests" for r in results.get(key, [])]
    print(f"\n{results['device']}  arch {results['arch']}  torch {results['torch']}")
    print(
        f"correctness: {sum(r['ok'] for r in tests)}/{len(tests)} checks ok, "
        f"max err vs TVM {max((r.get('err_vs_tvm', math.inf) for r in tests), default=0):.2e}, "
        f"max err vs f64 {max((r.get('err_vs_f64', 0) for r in tests), default=0):.2e}"
    )
    print(" ".join(f"{h:>{f.split('.')[0].rstrip('sf')}}" for h, _, f in COLUMNS))
    rows = results["bench"] + results.get("conv_bench", [])
    rows += [r for key in ("model", "resnet", "bert") for r in results.get(key, []) if "error" not in r]
    for row in rows:
        cells = []
        for _, key, fmt in COLUMNS:
            value = row.get(key)
            width = fmt.split(".")[0].rstrip("sf")
            cells.append(format(value, fmt) if value is not None else f"{'-':>{width}}")
        print(" ".join(cells))


SECTIONS = (
    "tests",
    "conv",
    "graphs",
    "frontends",
    "attention",
    "bench",
    "conv_bench",
    "sweep",
    "model",
    "resnet",
    "bert",
)
CHECKED = ("tests", "conv", "graphs", "frontends", "attention")  # correctness sections (check_case)


def _guarded(results: dict, key: str, case: dict, fn, *args) -> None:
    """Run one case, recording an error row instead of stopping the suite."""
    try:
        out = fn(case, *args)
        results[key] += out if isinstance(out, list) else [out]
    except Exception as e:  # report every case, never stop at the first failure
        results[key].append(
            {"case": case["name"], "name": case["name"], "ok": False, "error": f"{type(e).__name__}: {e}"}
        )


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("build", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile peers")
    ap.add_argument("--only", choices=SECTIONS, action="append", help="run only these sections")
    ap.add_argument("--match", default="", help="run only the cases whose name matches this regex")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per benchmark case")
    args = ap.parse_args()
    BENCH_ROUNDS[0] = args.rounds
    build, out, use_compile = args.build, args.out, not args.no_compile
    only = set(args.only or SECTIONS)
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((build / "manifest.json").read_text())
    if args.match:
        manifest = {k: [c for c in v if re.search(args.match, c["name"])] if isinstance(v, list) else v
                    for k, v in manifest.items()}  # fmt: skip
    results = (
        {
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "arch": manifest["arch"],
            "bench_rounds": args.rounds,
        }
        | {key: [] for key in SECTIONS}
        | {"attention_bench": []}
    )
    t0 = time.time()

    def save():  # partial results survive a timeout
        (out / "gpu_results.json").write_text(json.dumps(results, indent=1))

    for key in CHECKED:
        for case in manifest.get(key, []) if key in only else []:
            _guarded(results, key, case, check_case, build)
            ok = all(r["ok"] for r in results[key] if r["case"] == case["name"])
            print(f"{key} {case['name']}: {'ok' if ok else 'FAIL'}", flush=True)
    if "conv" in only and manifest.get("conv"):
        results["conv_glue"] = check_conv_glue_errors(manifest, build)
        print(f"conv glue argument checks: {'ok' if all(r['ok'] for r in results['conv_glue']) else 'FAIL'}")
    if "graphs" in only or "frontends" in only:
        results["back_to_back"] = check_back_to_back(manifest, build)
        for row in results["back_to_back"]:
            print(f"back to back {row['case']} {row['dims']}: {'ok' if row['ok'] else 'FAIL'}", flush=True)
    if "tests" in only:
        results["glue"] = check_glue_errors(manifest, build)
        print(f"glue argument checks: {'ok' if all(r['ok'] for r in results['glue']) else 'FAIL'}", flush=True)
        results["gelu16"] = check_gelu_every_fp16(manifest, build)
        for row in results["gelu16"]:
            print(f"{row['check']}: max {row['max_ulps']} ulp, {row['differing']}/{row['inputs']} differ", flush=True)
    save()
    warm_up_gpu()
    for key, fn in (("bench", bench_case), ("conv_bench", bench_conv_case)):
        for case in manifest.get(key, []) if key in only else []:
            _guarded(results, key, case, fn, build, use_compile)
            save()
            print(f"{key} {case['name']} done ({time.time() - t0:.0f}s)", flush=True)
    for case in manifest.get("attention", []) if "attention" in only else []:
        if case["spec"].get("bench"):
            _guarded(results, "attention_bench", case, attention_bench_case, build, use_compile)
            save()
            row = results["attention_bench"][-1]
            if "error" not in row:
                print(
                    f"attention {case['name']}: relax_cutlass {row['relax_cutlass_ms']:.4f} ms, "
                    f"TVM {row['tvm_ms']:.4f}, "
                    f"torch eager {row['torch_eager_ms']:.4f}, torch sdpa {row['torch_sdpa_ms']:.4f}",
                    flush=True,
                )
    if manifest.get("sweep") and "sweep" in only:
        results["sweep"] = sweep(manifest, build)
        save()
        for key in sorted({(r["k"], r["n"], r["m"]) for r in results["sweep"]}):
            rows = sorted((r for r in results["sweep"] if (r["k"], r["n"], r["m"]) == key), key=lambda r: r["ms"])
            print(
                f"sweep k={key[0]} n={key[1]} m={key[2]}: "
                + ", ".join(f"{r['tile']} {r['tflops']:.0f}" for r in rows[:4])
            )
    for key, fn in (("model", model_case), ("resnet", resnet_case), ("bert", bert_case)):
        for case in manifest.get(key, []) if key in only else []:
            _guarded(results, key, case, fn, build, use_compile)
            save()
            print(f"{key} {case['name']} done ({time.time() - t0:.0f}s)", flush=True)
    save()

    tuning = out / "tuning.jsonl"  # written by `tune run` in gpu_suite.sh before this script
    if tuning.exists():
        results["tuning"] = [json.loads(line) for line in tuning.read_text().splitlines() if line.strip()]
        save()
    failed = [
        r for key in (*SECTIONS, "attention_bench") if key != "sweep" for r in results[key] if not r.get("ok", True)
    ]
    checks = ("glue", "conv_glue", "gelu16", "back_to_back")
    failed += [r for key in checks for r in results.get(key, []) if not r["ok"]]
    for r in failed:
        print("FAILED:", json.dumps(r))
    print_summary(results)
    print("PASS" if not failed else f"FAIL ({len(failed)} failed)")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
