"""Programmatic dependent launch across a transformer's kernel chain, on the GPU.

The SM90 GEMMs, the norm kernel and the SM90 attention kernel launch as programmatic dependents
(PDL) outside CUDA graphs, and plainly while a stream is captured into one. A kernel that read its
input before the kernel writing it had finished would race; a check that synchronizes after each
call can hide that, so the plain build is called back to back on different inputs with nothing in
between, every output kept and checked afterwards against torch in float64. The CUDA-graph build
(TVM's `relax.backend.use_cuda_graph`, the one the zoo times) must give the same values."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import relax_cutlass  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)
from relax_cutlass.testing.errors import rel_error  # noqa: E402
from relax_cutlass.testing.models.torch_transformers import last_hidden_state  # noqa: E402


def _model(family: str):
    """Two layers, hidden 256 in 4 heads: head dim 64, the SM90 attention kernel's; Llama with 2 kv
    heads (grouped-query attention, RMSNorm, gated MLP), BERT post-LN (residual add + LayerNorm)."""
    import transformers

    if family == "bert":
        config = transformers.BertConfig(
            hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, vocab_size=512
        )
        return transformers.BertModel(config, add_pooling_layer=False).eval()
    config = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, vocab_size=512,
    )  # fmt: skip
    return transformers.LlamaModel(config).eval()


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_pdl_chain_back_to_back_and_in_a_cuda_graph(family):
    torch.manual_seed(0)
    module = last_hidden_state(_model(family))
    ids = [torch.randint(0, 512, (2, 128)) for _ in range(12)]
    mod = relax_cutlass.from_torch(module, (ids[0],))
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="never")(mod)
    kernels = [row["kernel"] for row in relax_cutlass.offload_report(offloaded).offloaded]
    assert any(k.startswith("sm90_fmha") for k in kernels), kernels
    assert any("norm_" in k for k in kernels) and any(k.startswith("sm90_gemm") for k in kernels), kernels
    dev, target = tvm.cuda(0), gpu_convs.cuda_target()
    plain = relax.VirtualMachine(tvm.compile(offloaded, target), dev)
    with tvm.transform.PassContext(opt_level=3, config={"relax.backend.use_cuda_graph": True}):
        graph = relax.VirtualMachine(tvm.compile(offloaded, target), dev)

    def first(out):
        return out if hasattr(out, "numpy") else out[0]

    args = [tvm.runtime.tensor(x.numpy(), dev) for x in ids]
    queued = [first(plain["main"](a)) for a in args]  # back to back, no synchronization between
    got = [q.numpy().astype("float64") for q in queued]
    with torch.no_grad():
        double = module.double()
        want = [first(double(x)).numpy() for x in ids]
    errors = [rel_error(g, w) for g, w in zip(got, want, strict=True)]
    assert max(errors) < 1e-2, errors
    for a, g in zip(args, got, strict=True):  # the graph build (PDL off while captured): same values
        np.testing.assert_array_equal(first(graph["main"](a)).numpy().astype("float64"), g)
