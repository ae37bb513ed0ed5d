"""Depthwise conv2d kernels on the GPU, built in-process as a user on a GPU machine builds them (the
GPU host with the full TVM bundle): every filter size, stride, dilation and epilogue the kind
takes, odd shapes included, against torch float64 on the same fp16 inputs.

Skipped without a GPU or without TVM's compiler."""

from __future__ import annotations

import numpy as np
import pytest
from harness import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available():
    pytest.skip("no NVIDIA GPU visible", allow_module_level=True)

tvm = pytest.importorskip("tvm")
relax = pytest.importorskip("tvm.relax")
torch = pytest.importorskip("torch")

import relax_cutlass  # noqa: E402
from relax_cutlass.arch import local_gpu_arch  # noqa: E402

# (N, H=W, C, R, stride, dilation, bias, activation): MobileNetV3's 3x3/5x5 (s1, s2) with relu or
# hardswish, ConvNeXt's 7x7 + bias, a dilated one (run-time stride kernel), odd sizes, C = 8
CASES = [
    (4, 56, 64, 3, 1, 1, True, "relu"),
    (4, 28, 72, 5, 2, 1, True, "hardswish"),
    (2, 56, 96, 7, 1, 1, True, "identity"),
    (2, 15, 24, 3, 2, 1, False, "silu"),
    (1, 17, 8, 3, 1, 2, True, "gelu"),
    (3, 7, 768, 7, 1, 1, True, "identity"),
    (1, 33, 40, 5, 1, 1, True, "relu"),
    # MobileNetV3-Large's at batch 32, where CTAs take several tiles each (its 3x3 stride-1 ones
    # must not: one tile per CTA, DirectConvTile.one_tile_per_cta; they gave inf before)
    (32, 112, 16, 3, 1, 1, True, "relu"),
    (32, 14, 200, 3, 1, 1, True, "hardswish"),
    (32, 56, 64, 3, 2, 1, True, "relu"),
    (32, 28, 120, 5, 1, 1, True, "relu"),
    (32, 14, 672, 5, 2, 1, True, "hardswish"),
    (8, 56, 96, 7, 1, 1, True, "identity"),
]
ACTIVATIONS = {
    "identity": (None, lambda t: t),
    "relu": (relax.op.nn.relu, torch.relu),
    "silu": (relax.op.nn.silu, torch.nn.functional.silu),
    "gelu": (relax.op.nn.gelu, torch.nn.functional.gelu),
    "hardswish": (
        lambda x: relax.op.multiply(
            x,
            relax.op.divide(
                relax.op.clip(relax.op.add(x, relax.const(3.0, "float16")), 0, 6), relax.const(6.0, "float16")
            ),
        ),
        torch.nn.functional.hardswish,
    ),  # noqa: E501
}


def _module_and_references():
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    params, inputs, expected = [], [], []
    for i, (n, hw, c, *_) in enumerate(CASES):
        params.append(relax.Var(f"x{i}", relax.TensorType((n, hw, hw, c), "float16")))
        inputs.append(rng.uniform(-1, 1, (n, hw, hw, c)).astype("float16"))
    with bb.function("main", params):
        with bb.dataflow():
            outs = []
            for x, (_, _, c, r, stride, dilation, bias, activation), data in zip(params, CASES, inputs, strict=True):
                w = (rng.uniform(-1, 1, (c, r, r, 1)) / r).astype("float16")
                b = rng.uniform(-1, 1, (c,)).astype("float16")
                pad = dilation * (r // 2)
                y = bb.emit(
                    relax.op.nn.conv2d(
                        x, relax.const(w), strides=stride, padding=pad, dilation=dilation, groups=c,
                        data_layout="NHWC", kernel_layout="OHWI", out_dtype="float16",
                    )
                )  # fmt: skip
                if bias:
                    y = bb.emit(relax.op.add(y, relax.const(b)))
                relax_act, torch_act = ACTIVATIONS[activation]
                if relax_act is not None:
                    y = bb.emit(relax_act(y))
                outs.append(y)
                t = torch.nn.functional.conv2d(
                    torch.from_numpy(data).double().permute(0, 3, 1, 2),
                    torch.from_numpy(w).double().permute(0, 3, 1, 2),
                    torch.from_numpy(b).double() if bias else None,
                    stride=stride, padding=pad, dilation=dilation, groups=c,
                )  # fmt: skip
                expected.append(torch_act(t).permute(0, 2, 3, 1).numpy())
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get(), inputs, expected


def test_depthwise_kernels_match_torch_float64():
    mod, inputs, expected = _module_and_references()
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    report = relax_cutlass.offload_report(offloaded)
    assert len(report.offloaded) == len(CASES) and not report.left_in_tvm, str(report)
    sm = local_gpu_arch()
    target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{sm}{'a' if sm == 90 else ''}"}, host="llvm")
    vm = relax.VirtualMachine(tvm.compile(offloaded, target), tvm.cuda(0))
    outs = vm["main"](*[tvm.runtime.tensor(x, tvm.cuda(0)) for x in inputs])
    errors = {}
    for case, got, want in zip(CASES, outs, expected, strict=True):
        got = got.numpy().astype("float64")
        errors[case] = np.linalg.norm(got - want) / np.linalg.norm(want)
    bad = {case: f"{err:.2e}" for case, err in errors.items() if not err < 5e-3}  # NaN fails too
    assert not bad, f"relative errors over 5e-3: {bad}"


def test_symbolic_batch_launches_every_tile():
    """A 3x3 stride-1 conv (one tile per CTA) with a symbolic batch: the glue counts the tiles at
    run time, at batch 3 and at batch 32 from one library."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 56, 56, 24), "float16"))
    rng = np.random.default_rng(1)
    w = (rng.uniform(-1, 1, (24, 3, 3, 1)) / 3).astype("float16")
    b = rng.uniform(-1, 1, (24,)).astype("float16")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x, relax.const(w), padding=1, groups=24, data_layout="NHWC", kernel_layout="OHWI",
                    out_dtype="float16",
                )
            )  # fmt: skip
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.add(y, relax.const(b)))))
        bb.emit_func_output(out)
    offloaded = relax_cutlass.offload_pipeline("auto")(bb.get())
    assert [r["op"] for r in relax_cutlass.offload_report(offloaded).offloaded] == ["dwconv2d"]
    sm = local_gpu_arch()
    target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{sm}{'a' if sm == 90 else ''}"}, host="llvm")
    vm = relax.VirtualMachine(tvm.compile(offloaded, target), tvm.cuda(0))
    for batch in (3, 32):
        data = rng.uniform(-1, 1, (batch, 56, 56, 24)).astype("float16")
        got = vm["main"](tvm.runtime.tensor(data, tvm.cuda(0))).numpy().astype("float64")
        want = torch.relu(
            torch.nn.functional.conv2d(
                torch.from_numpy(data).double().permute(0, 3, 1, 2),
                torch.from_numpy(w).double().permute(0, 3, 1, 2),
                torch.from_numpy(b).double(), padding=1, groups=24,
            )
        ).permute(0, 2, 3, 1).numpy()  # fmt: skip
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 5e-3, f"batch {batch}: relative error {err:.2e}"
