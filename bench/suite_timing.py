"""Timing the GPU suite's benchmark cases (bench/gpu_suite.py): relax_cutlass against TVM's default
build of the same model, torch eager (cuBLAS / cuDNN) and torch.compile, each case's libraries
built by relax_cutlass/testing/gpu_build.py. Speed is only ever a ratio against peers timed in the same run.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tvm.runtime.vm import VirtualMachine

from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.gpu_checks import (
    DEV,
    TOL_VS_TVM,
    attention_operands,
    device_args,
    inputs_for,
    load,
    run,
)
from relax_cutlass.testing.gpu_common import time_alternating, time_torch


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
    check_tuned(row, case, values, torch_out, "torch")
    row["relax_cutlass_tflops"] = case["flops"] / row["relax_cutlass_ms"] / 1e9
    row["cublas_tflops"] = case["flops"] / row["cublas_matmul_only_ms"] / 1e9
    row["vs_cublas_matmul"] = row["cublas_matmul_only_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_torch_eager"] = row["torch_eager_ms"] / row["relax_cutlass_ms"]
    return row


def time_tuned(row: dict, case: dict, build: Path, values: dict) -> None:
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


def check_tuned(row: dict, case: dict, values: dict, reference: np.ndarray, against: str) -> None:
    """The tuned build's (timed by time_tuned) error against `reference`, counted in row["ok"]."""
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
        time_tuned(row, case, build, values)
        check_tuned(row, case, values, torch_out, "torch")
    row["tvm_default_ms"] = time_vm(vm_t, case["tvm_params"], values)
    row["torch_eager_ms"] = time_torch(eager)
    if use_compile:
        row["torch_compile_ms"] = time_torch(torch.compile(eager))
    row["relax_cutlass_tflops"] = case["flops"] / row["relax_cutlass_ms"] / 1e9
    row["speedup_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_torch_eager"] = row["torch_eager_ms"] / row["relax_cutlass_ms"]
    return row
