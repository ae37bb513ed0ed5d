"""Soft-capped attention (Gemma-2's cap * tanh(scores / cap) before the mask) on a Hopper GPU: the
SM90 kernel's score step computes the tanh, built in-process as a user on the GPU host builds it,
against the same computation in torch float64: fp16 and bf16, head dims 32 (run padded), 64, 128
and 256, no mask, a causal one (a constant, run as the kernel's own) and a padding mask (a bias),
a cap that barely bends the scores (50) and one that saturates them (2); then transformers' Gemma-2
itself, sliding-window and global layers, against torch.

    pytest -m gpu tests/test_gpu_softcap.py   (on the GPU host; skipped without a Hopper GPU)
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

import relax_cutlass  # noqa: E402
from relax_cutlass.arch import local_gpu_arch  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)
from relax_cutlass.testing.attention import masked_inputs, rotary_table, soft_capped_attention  # noqa: E402
from relax_cutlass.testing.errors import rel_error  # noqa: E402

if local_gpu_arch() != 90:
    pytest.skip("soft-capped attention runs on the SM90 kernel: it needs a Hopper GPU", allow_module_level=True)

torch, tvm, relax = gpu_convs.torch, gpu_convs.tvm, gpu_convs.relax


def soft_capped_float64(x, y, keep, n: int, h: int, cap: float, mask: str, dtype: str) -> np.ndarray:
    """`soft_capped_attention`'s computation in torch float64 on the GPU (its 16-bit constants as
    the graph holds them): q, k, v = heads of x, y and 0.5 y; cap * tanh(q k^T * 1/sqrt(H) / cap)
    plus the mask; softmax; @ v; (B, S, N * H)."""
    constant = {"float16": np.float16, "bfloat16": None}[dtype]

    def rounded(value: float) -> float:  # the graph's constants are 16-bit
        if constant is not None:
            return float(constant(value))
        return float(torch.tensor(value, dtype=torch.bfloat16).double())

    def heads(z):
        z = torch.from_numpy(z.astype("float64")).cuda()
        return z.reshape(z.shape[0], z.shape[1], n, h).transpose(1, 2)

    q, k, v = heads(x), heads(y), heads(y) * 0.5
    scores = q @ k.transpose(-1, -2) * rounded(h**-0.5) / rounded(cap)
    scores = torch.tanh(scores) * rounded(cap)
    s, t = scores.shape[-2:]
    if mask == "causal":
        seen = torch.ones(s, t, dtype=torch.bool, device="cuda").tril(t - s)
        scores = scores.masked_fill(~seen, -torch.inf)
    elif mask == "padding":
        scores = scores.masked_fill(~torch.from_numpy(keep).cuda(), -torch.inf)
    out = torch.softmax(scores, -1) @ v
    return out.transpose(1, 2).reshape(x.shape).cpu().numpy()


# (dtype, head dim, mask, cap, batch, heads, seq_q, seq_kv)
CASES = [
    ("float16", 128, "none", 50.0, 2, 8, 1000, 1000),
    ("float16", 128, "causal", 50.0, 2, 8, 1000, 1000),
    ("float16", 64, "causal", 2.0, 1, 4, 4096, 4096),
    ("float16", 64, "padding", 50.0, 2, 8, 333, 333),
    ("bfloat16", 128, "padding", 2.0, 2, 4, 77, 77),
    ("bfloat16", 256, "causal", 50.0, 1, 4, 1000, 1000),
    ("float16", 256, "padding", 50.0, 2, 4, 512, 512),
    ("float16", 32, "causal", 50.0, 2, 4, 24, 24),  # the tiny Gemma-2 of scripts/hf_sweep.py
    ("float16", 128, "causal", 50.0, 2, 4, 77, 1000),  # fewer queries than keys: TVM's BottomRight
]


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c[:4])) for c in CASES])
def test_soft_capped_attention_matches_torch_float64(case):
    dtype, h, mask, cap, b, n, s, t = case
    mod = soft_capped_attention(b, s, n, h, t, cap=cap, mask=mask, dtype=dtype)
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="never")(mod)
    report = relax_cutlass.offload_report(offloaded)
    (row,) = [r for r in report.offloaded if r["op"] == "attention"]
    assert not report.left_in_tvm and row["attention"]["softcap"] == cap, str(report)
    assert row["kernel"].startswith("sm90_fmha") and "_softcap" in row["kernel"], row
    rng = np.random.default_rng(0)
    inputs = masked_inputs(mod, seed=1, full_row=False)
    # q and k of a few units, so that the scores reach the cap and the tanh bends them
    inputs[:2] = [(rng.uniform(-1, 1, size=x.shape) * 4).astype(x.dtype) for x in inputs[:2]]
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), dev)
    got = vm["main"](*[tvm.runtime.tensor(x, dev) for x in inputs]).numpy().astype("float64")
    keep = inputs[2] if mask == "padding" else None
    want = soft_capped_float64(*inputs[:2], keep, n, h, cap, mask, dtype)
    err = rel_error(got, want)
    assert err < (1e-2 if dtype == "bfloat16" else 3e-3), (case, err)


@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_gemma2_runs_every_attention_on_the_sm90_kernel(padding, attn_implementation):
    """transformers' Gemma-2 (head dim 256, its sliding-window layers' band mask a bias, its global
    layers' causal mask the kernel's own), fp16, against torch float32 on the same weights; in a
    padded batch (an attention_mask: the global layers' padding a (B, 1, 1, T) bias beside the
    causal mask, a left-padded sequence's first rows fully masked: eager attention's finite mask
    makes them the mean of every value, which the kernel's fix-up writes), every row compared.
    Eager attention soft-caps the scores; sdpa (transformers' default) drops the cap, and its
    attentions run the SM90 head-dim-256 kernel without one (plain, causal and with a bias); its
    padded rows are compared on the kept tokens (torch's sdpa leaves fully masked rows to its backend)."""
    import transformers

    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=256,
        sliding_window=128,
        max_position_embeddings=1024,
        attn_implementation=attn_implementation,  # eager soft-caps; sdpa drops the cap
    )
    model = last_hidden_state(transformers.Gemma2Model(config)).to(torch.float16).float()
    ids = torch.randint(3, 512, (2, 384))
    mask = torch.ones(2, 384, dtype=torch.int64)
    if padding == "left":
        mask[0, :100] = 0
    elif padding == "right":
        mask[1, -100:] = 0
    inputs = (ids,) if padding == "none" else (ids, mask)
    with torch.no_grad():
        want = model(*inputs).double().numpy()
    mod = relax_cutlass.from_torch(model, inputs, dtype="float16")
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="never")(mod)
    report = relax_cutlass.offload_report(offloaded)
    attention = [r for r in report.offloaded if r["op"] == "attention"]
    # only the rotary angles' float32 outer product (inv_freq x positions), computed in float32 on
    # purpose, stays in TVM
    assert sum(r.get("calls", 1) for r in attention) == 2 and all(map(rotary_table, report.left_in_tvm)), str(report)
    cap = 50.0 if attn_implementation == "eager" else None
    assert all(r["attention"].get("softcap") == cap and r["kernel"].startswith("sm90_fmha") for r in attention), str(
        report
    )
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), dev)
    out = vm["main"](*[tvm.runtime.tensor(x.numpy(), dev) for x in inputs])
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype("float64")
    kept = mask.numpy().astype(bool) if attn_implementation == "sdpa" else np.ones(mask.shape, bool)
    assert rel_error(got[kept], want[kept]) < 2e-2
