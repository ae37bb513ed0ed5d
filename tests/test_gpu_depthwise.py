"""Depthwise conv2d kernels on the GPU, built in-process as a user on a GPU machine builds them (the
GPU host with the full TVM bundle): every filter size, stride, dilation and epilogue the kind
takes, odd shapes included, on both kernel families -- relax_cutlass's blocked direct kernel (the
default where it applies) and CUTLASS's direct convolution (forced here for every case) -- against
torch float64 on the same fp16 inputs and against TVM's own CUDA build of the same module.

    python -m pytest -q tests/test_gpu_depthwise.py   (on the GPU host: scripts/gpu_run.sh check)
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

import relax_cutlass  # noqa: E402
from relax_cutlass.kinds.depthwise_conv2d import patterns, select  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)

torch, tvm, relax = gpu_convs.torch, gpu_convs.tvm, gpu_convs.relax

# (N, H=W, C, R, stride, dilation, bias, activation); groups == C == K: MobileNetV3's 3x3/5x5 (s1, s2) with relu or
# hardswish, ConvNeXt's 7x7 + bias, a dilated one (CUTLASS's run-time stride kernel), odd sizes, C = 8
CASES = [
    (4, 56, 64, 3, 1, 1, True, "relu"),
    (4, 28, 72, 5, 2, 1, True, "hardswish"),
    (2, 56, 96, 7, 1, 1, True, "identity"),
    (2, 15, 24, 3, 2, 1, False, "silu"),
    (1, 17, 8, 3, 1, 2, True, "gelu"),
    (3, 7, 768, 7, 1, 1, True, "identity"),
    (1, 33, 40, 5, 1, 1, True, "relu"),
    # MobileNetV3-Large's at batch 32, where CUTLASS's CTAs once took several tiles each: a race in its
    # mainloop (DirectConvTile.one_tile_per_cta) gave inf (3x3 stride 1) and 7.2e-3 (5x5 stride 1, C = 120)
    (32, 112, 16, 3, 1, 1, True, "relu"),
    (32, 14, 200, 3, 1, 1, True, "hardswish"),
    (32, 56, 64, 3, 2, 1, True, "relu"),
    (32, 28, 120, 5, 1, 1, True, "relu"),
    (32, 14, 672, 5, 2, 1, True, "hardswish"),
    (8, 56, 96, 7, 1, 1, True, "identity"),
    # ConvNeXt-tiny's four 7x7 stride-1 convs at batch 2, and odd sizes (13x13, C = 24, stride 2)
    (2, 28, 192, 7, 1, 1, True, "identity"),
    (2, 14, 384, 7, 1, 1, True, "gelu"),
    (2, 7, 768, 7, 1, 1, True, "identity"),
    (2, 13, 24, 3, 2, 1, True, "relu"),
    (3, 13, 24, 5, 2, 1, True, "hardswish"),
    (2, 13, 24, 7, 2, 1, False, "identity"),
]
# as gpu_convs' cases: (N, H=W, C, K, groups, R, stride, dilation, bias, activation)
CONVS = [(n, hw, c, c, c, *rest) for n, hw, c, *rest in CASES]


@pytest.fixture(params=["default", "cutlass"])
def family(request, monkeypatch):
    """ "default": the kind's choice (the blocked direct kernel but for dilation != 1);
    "cutlass": CUTLASS's direct convolution for every case."""
    if request.param == "cutlass":

        def forced(_problem):
            return ["CUTLASS forced by tests/test_gpu_depthwise.py"]

        monkeypatch.setattr(select, "direct_problems", forced)
        monkeypatch.setattr(patterns, "direct_problems", forced)
    return request.param


def _check_kernels(report, family: str, count: int) -> None:
    assert len(report.offloaded) == count and not report.left_in_tvm, str(report)
    for row in report.offloaded:
        dilated = row["conv"]["dilation"] != [1, 1]
        assert ("_direct_p" in row["kernel"]) == (family == "default" and not dilated), row["kernel"]


def _tvm_outputs(mod, inputs):
    """TVM's own CUDA build of the module (no offload)."""
    vm = relax.VirtualMachine(tvm.compile(mod, gpu_convs.cuda_target()), tvm.cuda(0))
    outs = vm["main"](*[tvm.runtime.tensor(x, tvm.cuda(0)) for x in inputs])
    return [o.numpy().astype("float64") for o in ([outs] if hasattr(outs, "numpy") else list(outs))]


def test_depthwise_kernels_match_torch_float64_and_tvm(family):
    mod, inputs, expected = gpu_convs.module_and_references(CONVS)
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    _check_kernels(relax_cutlass.offload_report(offloaded), family, len(CASES))
    gpu_convs.assert_outputs_match(offloaded, CONVS, inputs, expected)
    if family == "default":  # TVM's build is the same for both families: compared once
        vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), tvm.cuda(0))
        ours = vm["main"](*[tvm.runtime.tensor(x, tvm.cuda(0)) for x in inputs])
        for case, got, want in zip(CASES, ours, _tvm_outputs(mod, inputs), strict=True):
            err = np.linalg.norm(got.numpy().astype("float64") - want) / np.linalg.norm(want)
            assert err < 1e-2, f"{case}: relative error against TVM's build {err:.2e}"


def test_symbolic_batch_launches_every_tile(family):
    """A 3x3 stride-1 conv with a symbolic batch: the glue (CUTLASS: one tile per CTA) or the kernel
    (blocked direct) counts the tiles at run time, at batch 3 and at batch 32 from one library."""
    mod, sample = gpu_convs.symbolic_batch_module((None, 56, 24, 24, 24, 3, 1, 1, True, "relu"))
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    report = relax_cutlass.offload_report(offloaded)
    _check_kernels(report, family, 1)
    gpu_convs.assert_symbolic_batch_runs(offloaded, sample)


def asymmetric_module(dtype: str):
    """x (n, 13, 13, 24) with n symbolic -> depthwise 3x3 stride 2, padding (top, left, bottom,
    right) = (1, 0, 0, 1), + bias -> relu; -> (module, filter, bias) as numpy arrays of `dtype`."""
    import ml_dtypes

    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    rng = np.random.default_rng(3)
    w = (rng.uniform(-1, 1, (24, 3, 3, 1)) / 3).astype(np_dtype)
    b = rng.uniform(-1, 1, (24,)).astype(np_dtype)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((tvm.tirx.Var("n", "int64"), 13, 13, 24), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x, relax.const(w), strides=2, padding=(1, 0, 0, 1), groups=24,
                    data_layout="NHWC", kernel_layout="OHWI", out_dtype=dtype,
                )
            )  # fmt: skip
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(b))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), w, b


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_direct_kernel_asymmetric_padding_odd_sizes_and_bfloat16(dtype):
    """13x13, C = 24, stride 2 with (top, left, bottom, right) = (1, 0, 0, 1) padding and a symbolic
    batch; bfloat16 too (the blocked direct kernel's alone): against torch float64 and TVM's build."""
    import torch.nn.functional as F

    mod, w, b = asymmetric_module(dtype)
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    report = relax_cutlass.offload_report(offloaded)
    (row,) = report.offloaded
    assert "_direct_p" in row["kernel"] and not report.left_in_tvm, str(report)
    ours = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), tvm.cuda(0))
    theirs = relax.VirtualMachine(tvm.compile(mod, gpu_convs.cuda_target()), tvm.cuda(0))
    rng = np.random.default_rng(4)
    for batch in (1, 5):
        data = rng.uniform(-1, 1, (batch, 13, 13, 24)).astype(w.dtype)
        ref = (
            F.conv2d(
                F.pad(torch.from_numpy(data.astype("float64")).permute(0, 3, 1, 2), (0, 1, 1, 0)),  # l, r, t, b
                torch.from_numpy(w.astype("float64")).permute(0, 3, 1, 2),
                torch.from_numpy(b.astype("float64")),
                stride=2,
                groups=24,
            )
            .relu()
            .permute(0, 2, 3, 1)
            .numpy()
        )
        arg = tvm.runtime.tensor(data, tvm.cuda(0))
        got = ours["main"](arg).numpy().astype("float64")
        tvm_out = theirs["main"](arg).numpy().astype("float64")
        assert got.shape == ref.shape == (batch, 6, 6, 24)
        tol = 5e-3 if dtype == "float16" else 2e-2
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < tol
        assert np.linalg.norm(got - tvm_out) / np.linalg.norm(tvm_out) < tol
