"""The offload report on an attention that stays in TVM: its two batched matmuls' rows say that
they are an attention's and which ops between the scores and the softmax no pattern read
(BLOOM's ALiBi beside a padding mask), rather than plain batched matmuls."""

from __future__ import annotations

import pytest
from tvm import relax

import relax_cutlass


def _attention(between) -> relax.Function:
    """softmax(between(q @ k^T)) @ v on (heads, seq, head dim) fp16 tensors."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((4, 64, 64), "float16")) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            kt = bb.emit(relax.op.permute_dims(k, [0, 2, 1]))
            scores = bb.emit(relax.op.matmul(q, kt))
            probs = bb.emit(relax.op.nn.softmax(between(bb, scores), axis=-1))
            out = bb.emit_output(relax.op.matmul(probs, v))
        bb.emit_func_output(out)
    return bb.get()


def _rows(mod):
    offloaded = relax_cutlass.offload_pipeline("sm_90a", compile=False)(mod)
    return relax_cutlass.offload_report(offloaded).left_in_tvm


def _sigmoid(bb, scores):
    scaled = bb.emit(relax.op.multiply(scores, relax.const(0.125, "float16")))
    squashed = bb.emit(relax.op.sigmoid(relax.op.divide(scaled, relax.const(50.0, "float16"))))
    return bb.emit(relax.op.multiply(squashed, relax.const(50.0, "float16")))


def test_an_attention_is_named_with_the_op_no_pattern_reads():
    rows = _rows(_attention(_sigmoid))
    assert [r["op"] for r in rows] == ["batched matmul", "batched matmul"]
    first, second = (r["reasons"][0] for r in rows)
    assert first.startswith("the q @ k^T matmul of an attention") and second.startswith("the @ v matmul")
    assert "multiply by 0.125 -> divide by 50 -> sigmoid -> multiply by 50" in first
    assert "sigmoid there is not a form the attention kernels compute" in first
    assert any("batched ND x ND matmul stays in TVM" in reason for reason in rows[0]["reasons"])  # the GEMM's too


def test_a_fused_attention_and_other_batched_matmuls_get_no_note():
    from relax_cutlass.testing.attention import torch_export_attention

    assert _rows(torch_export_attention(h=64)) == []  # fused: nothing left in TVM
    bb = relax.BlockBuilder()
    a, b = (relax.Var(n, relax.TensorType((4, 64, 64), "float16")) for n in "ab")
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(relax.op.nn.softmax(a), b))  # no scores matmul before it
        bb.emit_func_output(out)
    (row,) = _rows(bb.get())
    assert not any("attention" in reason for reason in row["reasons"]), row


def test_an_attention_of_a_form_no_pattern_reads_says_so():
    """Scaled scores only, but on 3-D (heads, seq, head dim) tensors without a batch axis."""
    rows = _rows(_attention(lambda bb, s: bb.emit(relax.op.multiply(s, relax.const(0.125, "float16")))))
    assert len(rows) == 2 and all("no attention pattern matched this form" in r["reasons"][0] for r in rows), rows


@pytest.mark.parametrize(
    "family, says",
    [("bloom_padded", "2 additions there (a position bias such as ALiBi beside a mask)")],
)
def test_real_models_attention_left_in_tvm_says_why(family, says):
    """The families of scripts/hf_sweep.py whose attention stays in TVM (T5's, from float32
    weights, did until its position bias was cast as the weights are; BLOOM's without a padding
    mask until its ALiBi ran beside the kernel's causal mask; Gemma-2's until its soft-capping
    tanh ran in the SM90 kernel: tests/test_softcap.py)."""
    import torch
    import transformers

    from relax_cutlass.testing.models.torch_transformers import TINY_VOCAB, tiny_model

    torch.manual_seed(0)
    model = tiny_model(family.removesuffix("_padded"), torch, transformers)
    inputs = (torch.randint(3, TINY_VOCAB, (2, 16)),)
    if family.endswith("_padded"):  # an attention_mask input: the first 5 tokens of each sequence padding
        inputs = (*inputs, torch.ones(2, 16, dtype=torch.int64).index_fill_(1, torch.arange(5), 0))
    mod = relax_cutlass.from_torch(model, inputs)
    rows = _rows(mod)
    assert rows and all(r["reasons"][0].startswith("the ") and says in r["reasons"][0] for r in rows), rows


def test_the_search_visits_each_binding_once():
    """A softmax after 40 residual additions and no scores matmul: the backward search from the
    softmax visits each binding once (157 visits; followed per operand, the additions' two
    branches made it exponential: 514,309 visits before the depth limit stopped it)."""
    bb = relax.BlockBuilder()
    x, w = (
        relax.Var("x", relax.TensorType((4, 64, 64), "float16")),
        relax.Var("w", relax.TensorType((4, 64, 64), "float16")),
    )
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = x
            for _ in range(40):
                y = bb.emit(relax.op.add(y, relax.op.multiply(y, relax.const(0.5, "float16"))))
            out = bb.emit_output(relax.op.matmul(relax.op.nn.softmax(y), w))
        bb.emit_func_output(out)
    (row,) = _rows(bb.get())
    assert not any("attention" in reason for reason in row["reasons"]), row
