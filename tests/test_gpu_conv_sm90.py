"""CUTLASS 3.x SM90 conv2d kernels (TMA im2col + wgmma, EVT epilogues) on a Hopper GPU, built
in-process as a user on the GPU host builds them, against torch float64 on the same fp16 inputs:
ResNet-50's conv forms, odd sizes (the bottom/right padding TMA needs is then 1, or the floor
division's negative need), dilation, 5x5, every fused activation, a residual block, asymmetric
padding, a symbolic batch; and the SM80 fallback where TMA cannot run the conv."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

import relax_cutlass  # noqa: E402
from relax_cutlass.arch import local_gpu_arch  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)
from relax_cutlass.testing.errors import rel_error  # noqa: E402

if local_gpu_arch() != 90:
    pytest.skip("SM90 kernels need a Hopper GPU", allow_module_level=True)

torch, tvm, relax = gpu_convs.torch, gpu_convs.tvm, gpu_convs.relax

# (N, H=W, C, K, groups, R, stride, dilation, bias, activation). Every case but the last two runs
# on an SM90 kernel: C >= 128 and enough output tiles to fill the GPU (select_3x, select.py).
CASES = [
    (32, 14, 256, 64, 1, 3, 1, 1, True, "relu"),  # K = 64: the 128x64 tile
    (8, 28, 128, 512, 1, 1, 1, 1, True, "identity"),
    (8, 56, 256, 512, 1, 1, 2, 1, True, "relu"),  # 1x1 stride 2 on an even size: upper padding -1 -> 0
    (16, 28, 256, 128, 1, 3, 2, 1, True, "relu"),
    (32, 17, 128, 128, 1, 3, 2, 1, True, "silu"),  # odd size, stride 2: upper padding 1
    (16, 15, 128, 128, 1, 5, 1, 2, True, "gelu"),  # 5x5 dilated
    (16, 7, 512, 512, 1, 3, 1, 1, False, "hardswish"),
    (32, 7, 2048, 512, 1, 1, 1, 1, True, "relu"),
    (64, 9, 136, 24, 1, 3, 1, 1, True, "relu"),  # 17-element K tiles, 3 output vectors
    # the SM80 kernels on Hopper: C = 64 (measured faster) and an output that under-fills the GPU
    (8, 56, 64, 64, 1, 3, 1, 1, True, "relu"),
    (1, 7, 2048, 512, 1, 1, 1, 1, True, "relu"),
]
SM80_CASES = 2


def _rows(offloaded):
    report = relax_cutlass.offload_report(offloaded)
    assert not report.left_in_tvm, str(report)
    return report.offloaded


def test_sm90_conv_kernels_match_torch_float64():
    mod, inputs, expected = gpu_convs.module_and_references(CASES)
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="never")(mod)
    rows = _rows(offloaded)
    assert len(rows) == len(CASES)
    sm90 = [r for r in rows if r["family"] == "sm90"]
    assert len(sm90) == len(CASES) - SM80_CASES and all("_im2col_" in r["kernel"] for r in sm90), rows
    notes = sorted(r["note"].split(" ")[0] for r in rows if r["family"] == "sm80")
    assert notes == ["C=64", "output"], notes  # "C=64 < 128 ...", "output under-fills the GPU ..."
    gpu_convs.assert_outputs_match(offloaded, CASES, inputs, expected)


def test_sm90_residual_block_and_asymmetric_padding():
    """relu(conv(x) + bias + residual) and a conv padded (0, 1, 2, 1) (top, left, bottom, right) on
    SM90 kernels."""
    rng = np.random.default_rng(3)
    n, hw, c, k = 32, 20, 128, 128  # enough tiles to fill the GPU: no SM80 split-K
    x = relax.Var("x", relax.TensorType((n, hw, hw, c), "float16"))
    res = relax.Var("res", relax.TensorType((n, hw, hw, k), "float16"))
    w1 = (rng.uniform(-1, 1, (k, 3, 3, c)) / 24).astype("float16")
    w2 = (rng.uniform(-1, 1, (k, 3, 3, c)) / 24).astype("float16")
    b = rng.uniform(-1, 1, (k,)).astype("float16")
    bb = relax.BlockBuilder()
    with bb.function("main", [x, res]):
        with bb.dataflow():
            conv = dict(data_layout="NHWC", kernel_layout="OHWI", out_dtype="float16")
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w1), padding=1, **conv))
            y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.add(y, relax.const(b)), res)))
            z = bb.emit(relax.op.nn.conv2d(x, relax.const(w2), padding=(0, 1, 2, 1), **conv))
            out = bb.emit_output(relax.Tuple([y, z]))
        bb.emit_func_output(out)
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="never")(bb.get())
    rows = _rows(offloaded)
    assert len(rows) == 2 and all(r["family"] == "sm90" for r in rows), rows
    data = rng.uniform(-1, 1, (n, hw, hw, c)).astype("float16")
    resid = rng.uniform(-1, 1, (n, hw, hw, k)).astype("float16")
    t = lambda a: torch.from_numpy(a).double()  # noqa: E731
    xt = t(data).permute(0, 3, 1, 2)
    conv1 = torch.nn.functional.conv2d(xt, t(w1).permute(0, 3, 1, 2), t(b), padding=1)
    want_y = torch.relu(conv1 + t(resid).permute(0, 3, 1, 2)).permute(0, 2, 3, 1).numpy()
    padded = torch.nn.functional.pad(xt, (1, 1, 0, 2))  # (left, right, top, bottom)
    want_z = torch.nn.functional.conv2d(padded, t(w2).permute(0, 3, 1, 2)).permute(0, 2, 3, 1).numpy()
    vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), tvm.cuda(0))
    y, z = vm["main"](tvm.runtime.tensor(data, tvm.cuda(0)), tvm.runtime.tensor(resid, tvm.cuda(0)))
    assert z.shape == want_z.shape
    for got, want in ((y, want_y), (z, want_z)):
        assert rel_error(got, want) < 5e-3


def test_sm90_conv_symbolic_batch():
    mod, sample = gpu_convs.symbolic_batch_module((None, 28, 128, 128, 1, 3, 1, 1, True, "relu"))
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="never")(mod)
    (row,) = _rows(offloaded)
    assert row["family"] == "sm90", row
    gpu_convs.assert_symbolic_batch_runs(offloaded, sample)


def test_sm80_fallbacks_on_hopper_run_and_say_why():
    """C = 12 (6-element rows: no TMA) and family='sm80' get the SM80 kernels, with the reason."""
    cases = [(2, 14, 12, 64, 1, 3, 1, 1, True, "relu")]
    mod, inputs, expected = gpu_convs.module_and_references(cases)
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="never")(mod)
    (row,) = _rows(offloaded)
    assert row["family"] == "sm80" and "TMA" in row["note"], row
    gpu_convs.assert_outputs_match(offloaded, cases, inputs, expected)
    cases = [CASES[0]]
    mod, inputs, expected = gpu_convs.module_and_references(cases)
    offloaded = relax_cutlass.offload_pipeline("sm_90a", family="sm80", profile="never")(mod)
    (row,) = _rows(offloaded)
    assert row["family"] == "sm80" and "family='sm80'" in row["note"], row
    gpu_convs.assert_outputs_match(offloaded, cases, inputs, expected)
