"""Relax's own attention op on the GPU, built in-process as a user on the GPU host builds it, against
torch's scaled_dot_product_attention in float64: a scale of exactly 1 (a speech encoder's; its glue
once held the C++ literal `1f` and failed the whole build) for sm_80 and, on Hopper, sm_90a; and
R.nn.attention given a bias (relax.nn.attention_bias) in each broadcast of (B, N, S, T), with and
without TVM's causal masks, through the SM80 kernel and, on Hopper, the SM90 kernel.

    pytest -m gpu tests/test_gpu_attention_op.py   (on the GPU host)
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

import relax_cutlass  # noqa: E402
from relax_cutlass.arch import arch_name, local_gpu_arch  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)
from relax_cutlass.testing.errors import rel_error  # noqa: E402

torch, tvm, relax = gpu_convs.torch, gpu_convs.tvm, gpu_convs.relax


def _module(b, s, t, n, h, scale=None, causal=None, bias_shape=None):
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((b, s, n, h), "float16"))
    k = relax.Var("k", relax.TensorType((b, t, n, h), "float16"))
    v = relax.Var("v", relax.TensorType((b, t, n, h), "float16"))
    params = [q, k, v]
    if bias_shape is not None:
        params.append(relax.Var("bias", relax.TensorType(bias_shape, "float16")))
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.attention(*params, scale=scale, causal_mask=causal))
        bb.emit_func_output(out)
    return bb.get()


def _reference(q, k, v, scale, causal, bias=None):
    """softmax(q k^T * scale + bias, TVM's causal mask) v in float64, BSNH in and out."""
    q, k, v = (torch.from_numpy(x.astype("float64")).cuda().transpose(1, 2) for x in (q, k, v))
    s, t = q.shape[2], k.shape[2]
    mask = torch.zeros(s, t, dtype=torch.float64, device="cuda")
    if causal is not None:
        offset = abs(s - t) if causal == "BottomRight" else 0
        seen = torch.arange(t, device="cuda")[None, :] <= torch.arange(s, device="cuda")[:, None] + offset
        mask = mask.masked_fill(~seen, float("-inf"))
    if bias is not None:
        mask = mask + torch.from_numpy(bias.astype("float64")).cuda()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).cpu().numpy()


def _build_and_check(mod, arch: str, scale, causal, bias_shape=None, seed=0) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region sent back to TVM warns
        offloaded = relax_cutlass.offload_pipeline(arch, profile="never")(mod)
    (row,) = relax_cutlass.offload_report(offloaded).offloaded
    vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), tvm.cuda(0))
    rng = np.random.default_rng(seed)
    shapes = [[int(d) for d in p.ty.shape.values] for p in mod["main"].params]
    arrays = [rng.uniform(-1, 1, size=shape).astype("float16") for shape in shapes]
    if bias_shape is not None:  # about a fifth of the keys masked, never a whole row
        bias = arrays[3].astype("float32") * 2
        bias[..., 1:][rng.random(bias[..., 1:].shape) < 0.2] = -np.inf
        arrays[3] = bias.astype("float16")
    got = vm["main"](*[tvm.runtime.tensor(a, tvm.cuda(0)) for a in arrays]).numpy().astype("float64")
    want = _reference(*arrays[:3], scale, causal, arrays[3] if bias_shape is not None else None)
    err = rel_error(got, want)
    assert err < 2e-3, (row["kernel"], err)
    return row


ARCHS = ["sm_80"] + ([arch_name(90)] if local_gpu_arch() == 90 else [])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal", [None, "TopLeft"])
def test_attention_with_scale_one(arch, causal):
    row = _build_and_check(_module(2, 128, 128, 8, 64, scale=1.0, causal=causal), arch, 1.0, causal)
    assert row["attention"]["scale"] == 1.0


@pytest.mark.parametrize(
    "bias_shape", [(2, 8, 200, 333), (2, 1, 200, 333), (2, 1, 1, 333), (1, 8, 200, 333), (1, 1, 1, 333)]
)
@pytest.mark.parametrize("causal", [None, "BottomRight"])
@pytest.mark.parametrize("arch", ARCHS)
def test_attention_op_with_a_bias(bias_shape, causal, arch):
    """Key rows of 333 (no 16-byte multiple: the SM80 kernel pads the bias rows at run time, the
    SM90 one reads them as they are)."""
    mod = _module(2, 200, 333, 8, 64, causal=causal, bias_shape=bias_shape)
    sm90 = arch == arch_name(90)
    # on Hopper the SM90 kernel with the bias (the heuristic's: select.SM90_BIAS_FIRST)
    row = _build_and_check(mod, arch, 1 / 8, causal, bias_shape)
    assert row["composite"] == "relax_cutlass.attention_op_bias" and row["kernel"].endswith("_bias"), row
    assert row["kernel"].startswith("sm90_" if sm90 else "sm80_"), row
