"""The GPU suite's checks, on built libraries (TVM runtime, numpy and torch; no TVM compiler):
each kernel family's library of a case against TVM's own CUDA build of the same model and against a
float64 torch reference, on two input seeds per shape; the glue's argument errors; the 16-bit GELU
on every finite fp16 value; chains of SM90 kernels called back to back.

A case is its manifest entry (gpu_build.build_pair, gpu_build.build_case) and the folder holding
its libraries, which tests/test_gpu_suite.py and bench/gpu_suite.py build in-process on the GPU
host.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import tvm
from tvm.runtime.vm import VirtualMachine

from .errors import rel_error
from .gpu_common import random_array, shape_of

DEV = tvm.cuda(0)
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
    from .gelu16 import finite_fp16, fp16_ulps, gelu_exact

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
