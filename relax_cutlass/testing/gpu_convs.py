"""What the GPU conv tests share (tests/test_gpu_depthwise.py, tests/test_gpu_grouped.py): one conv
case (N, H=W, C, K, groups, R, stride, dilation, bias, activation) emitted into a Relax module as a
user's NHWC conv [+ bias] [-> activation], its torch float64 reference, and the check of a built
module's outputs against those references. Importing it skips the importing test module without a
GPU, torch or TVM's compiler."""

from __future__ import annotations

import numpy as np
import pytest

from .harness import gpu_available

if not gpu_available():
    pytest.skip("no NVIDIA GPU visible", allow_module_level=True)

torch = pytest.importorskip("torch")
tvm = pytest.importorskip("tvm")
relax = pytest.importorskip("tvm.relax")

from relax_cutlass.arch import local_gpu_arch  # noqa: E402

from .errors import rel_error  # noqa: E402


def _hardswish(x):
    three, six = relax.const(3.0, "float16"), relax.const(6.0, "float16")
    return relax.op.multiply(x, relax.op.divide(relax.op.clip(relax.op.add(x, three), 0, 6), six))


# name -> (Relax op, torch op)
ACTIVATIONS = {
    "identity": (None, lambda t: t),
    "relu": (relax.op.nn.relu, torch.relu),
    "silu": (relax.op.nn.silu, torch.nn.functional.silu),
    "gelu": (relax.op.nn.gelu, torch.nn.functional.gelu),
    "hardswish": (_hardswish, torch.nn.functional.hardswish),
}


def cuda_target() -> tvm.target.Target:
    sm = local_gpu_arch()
    return tvm.target.Target({"kind": "cuda", "arch": f"sm_{sm}{'a' if sm == 90 else ''}"}, host="llvm")


def emit_conv(bb, x, case, rng, filter_param=None):
    """Emit `case`'s conv (NHWC/OHWI, "same" padding) [+ bias] [-> activation] on `x`, with random
    fp16 weights (the filter bound, or `filter_param` where given: a filter passed at run time);
    -> (output, filter, bias)."""
    _, _, c, k, groups, r, stride, dilation, bias, activation = case
    w = (rng.uniform(-1, 1, (k, r, r, c // groups)) / np.sqrt(r * r * c // groups)).astype("float16")
    b = rng.uniform(-1, 1, (k,)).astype("float16")
    y = bb.emit(
        relax.op.nn.conv2d(
            x, relax.const(w) if filter_param is None else filter_param, strides=stride,
            padding=dilation * (r // 2), dilation=dilation, groups=groups,
            data_layout="NHWC", kernel_layout="OHWI", out_dtype="float16",
        )
    )  # fmt: skip
    if bias:
        y = bb.emit(relax.op.add(y, relax.const(b)))
    relax_act = ACTIVATIONS[activation][0]
    return (bb.emit(relax_act(y)) if relax_act is not None else y), w, b


def torch_reference(data: np.ndarray, w: np.ndarray, b: np.ndarray, case) -> np.ndarray:
    """`case`'s conv in torch float64 (NCHW), back to NHWC."""
    _, _, _, _, groups, r, stride, dilation, bias, activation = case
    t = torch.nn.functional.conv2d(
        torch.from_numpy(data).double().permute(0, 3, 1, 2),
        torch.from_numpy(w).double().permute(0, 3, 1, 2),
        torch.from_numpy(b).double() if bias else None,
        stride=stride, padding=dilation * (r // 2), dilation=dilation, groups=groups,
    )  # fmt: skip
    return ACTIVATIONS[activation][1](t).permute(0, 2, 3, 1).numpy()


def module_and_references(cases, seed: int = 0, runtime_filters: bool = False):
    """One module computing every case on its own input: (module, inputs, torch float64 outputs).
    With `runtime_filters` the filters are parameters too (after the inputs), as an unbound model's."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    params, inputs, expected, filters = [], [], [], []
    for i, (n, hw, c, *_) in enumerate(cases):
        params.append(relax.Var(f"x{i}", relax.TensorType((n, hw, hw, c), "float16")))
        inputs.append(rng.uniform(-1, 1, (n, hw, hw, c)).astype("float16"))
    filter_params = [
        relax.Var(f"w{i}", relax.TensorType((k, r, r, c // groups), "float16"))
        for i, (_, _, c, k, groups, r, *_) in enumerate(cases)
    ]
    with bb.function("main", params + (filter_params if runtime_filters else [])):
        with bb.dataflow():
            outs = []
            for i, (x, case, data) in enumerate(zip(params, cases, inputs, strict=True)):
                y, w, b = emit_conv(bb, x, case, rng, filter_params[i] if runtime_filters else None)
                outs.append(y)
                filters.append(w)
                expected.append(torch_reference(data, w, b, case))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get(), inputs + (filters if runtime_filters else []), expected


def assert_outputs_match(offloaded: tvm.IRModule, cases, inputs, expected, tolerance: float = 5e-3) -> None:
    """Build `offloaded` for this GPU, run it, and compare each case's output with torch's."""
    vm = relax.VirtualMachine(tvm.compile(offloaded, cuda_target()), tvm.cuda(0))
    outs = vm["main"](*[tvm.runtime.tensor(x, tvm.cuda(0)) for x in inputs])
    errors = {case: rel_error(got, want) for case, got, want in zip(cases, outs, expected, strict=True)}
    bad = {case: f"{err:.2e}" for case, err in errors.items() if not err < tolerance}  # NaN fails too
    assert not bad, f"relative errors over {tolerance}: {bad}"


def symbolic_batch_module(case, seed: int = 1):
    """`case` with a symbolic batch: (module, a function of a batch size giving (input, reference))."""
    _, hw, c, *_ = case
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, hw, hw, c), "float16"))
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y, w, b = emit_conv(bb, x, case, rng)
            out = bb.emit_output(y)
        bb.emit_func_output(out)

    def sample(batch: int):
        data = rng.uniform(-1, 1, (batch, hw, hw, c)).astype("float16")
        return data, torch_reference(data, w, b, case)

    return bb.get(), sample


def assert_symbolic_batch_runs(offloaded: tvm.IRModule, sample, batches=(3, 32)) -> None:
    """One library, run at each batch size, against torch float64."""
    vm = relax.VirtualMachine(tvm.compile(offloaded, cuda_target()), tvm.cuda(0))
    for batch in batches:
        data, want = sample(batch)
        err = rel_error(vm["main"](tvm.runtime.tensor(data, tvm.cuda(0))), want)
        assert err < 5e-3, f"batch {batch}: relative error {err:.2e}"
