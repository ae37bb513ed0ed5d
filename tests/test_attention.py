"""Fused attention regions: pattern, layout analysis, legality, report, emitted C++ (CPU only).

Every accepted graph is checked two ways on the CPU: the rewritten module against the untouched
one (harness), and the region's `AttentionProblem`, which is all the kernel is told, evaluated in
numpy on the region's own inputs against the composite's output. The second is what catches a
misread layout: the composite still computes the right thing, the kernel would not.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax

from relax_cutlass.kinds.attention.records import AttentionProblem
from relax_cutlass.kinds.attention.select import choose_attention_kernel
from relax_cutlass.stages.emit import emit_glue, emit_kernel
from relax_cutlass.stages.report import offload_report
from relax_cutlass.testing.attention import (
    F16,
    attention_regions,
    check_regions_against_kernel_model,
    evaluate_dim,
    kernel_model,
    masked_inputs,
    offloaded_attention_rows,
    op_attention,
    sdpa_attention,
    tensor_type,
    torch_export_attention,
    tvm_rewrite_form,
)
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import (
    build_cpu,
    compare_on_cpu,
    offload_for_cpu,
    random_inputs,
    run_vm,
    serve_regions_on_cpu,
)


@pytest.mark.parametrize(
    "builder, kwargs",
    [
        (torch_export_attention, {}),
        (torch_export_attention, {"b": 1}),  # lone heads axis
        (torch_export_attention, {"n": 1}),  # lone batch axis
        (torch_export_attention, {"t": 12, "h": 16}),  # cross attention, other head dim
        (torch_export_attention, {"scale_op": "divide"}),
        (torch_export_attention, {"cast": False}),
        (torch_export_attention, {"dtype": "bfloat16"}),
        (op_attention, {}),
        (op_attention, {"t": 5}),
        (tvm_rewrite_form, {}),
    ],
)
def test_attention_is_offloaded_and_correct(builder, kwargs):
    mod = builder(**kwargs)
    rows = offloaded_attention_rows(mod)
    assert len(rows) == 1, offload_report(mod, arch="sm_90a")
    # Nothing of the attention is left in TVM: both matmuls are inside the region.
    assert not offload_report(mod, arch="sm_90a").left_in_tvm
    compare_on_cpu(mod, random_inputs(mod), rtol=3e-2 if kwargs.get("dtype") == "bfloat16" else 1e-2)
    partitioned, _ = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned) == 1


FINFO_MIN = float(np.finfo(np.float32).min)


@pytest.mark.parametrize(
    "kwargs, bias, masked_rows",
    [
        ({}, "B1ST", "zero"),  # transformers' sdpa: q and k^T scaled, padding mask, safe softmax
        ({"mask_shape": "b11t"}, "B11T", "zero"),
        ({"mask_shape": "11st", "t": 24}, "11ST", "zero"),  # cross attention, one mask for the batch
        # 12 and 13 keys: bias rows off 16 bytes, copied into padded rows at run time (PadBiasRows)
        ({"t": 12}, "B1ST", "zero"),
        ({"mask_shape": "b11t", "s": 9, "t": 13}, "B11T", "zero"),
        ({"mask_shape": "bnst", "mask": "float16"}, "BNST", "zero"),  # an fp16 bias, added in fp16
        # a constant causal mask: the kernel's own causal mask, no bias (test_causal_masks.py)
        ({"mask_shape": "11st", "mask": "constant"}, None, "TopLeft"),
        ({"q_scale": False}, "B1ST", "zero"),  # k^T and the scores scaled
        ({"q_scale": False, "k_scale": False}, "B1ST", "zero"),  # only the scores scaled
        ({"tail": False}, "B1ST", "nan"),  # a plain softmax: a fully masked row is 0/0 in both
        ({"tail": False, "masked_value": FINFO_MIN}, "B1ST", "mean"),  # transformers' eager mask
        # the eager mask under torch's safe softmax (T5's export): that tail, which never fired,
        # gets the 1/T fill of a fully masked row
        ({"masked_value": FINFO_MIN}, "B1ST", "mean"),
    ],
)
def test_masked_attention_is_offloaded_and_correct(kwargs, bias, masked_rows):
    mod = sdpa_attention(**kwargs)
    (row,) = offloaded_attention_rows(mod)
    if bias is None:  # `masked_rows` is then the causal mask
        assert "bias" not in row["attention"] and row["attention"]["causal"] == masked_rows
    else:
        assert (row["attention"]["bias"], row["attention"]["masked_rows"]) == (bias, masked_rows)
        assert row["kernel"].endswith("_bias")
    assert not offload_report(mod, arch="sm_90a").left_in_tvm
    # A fully masked row (the first) too, except where the graph itself gives NaN there.
    compare_on_cpu(mod, masked_inputs(mod, full_row=masked_rows not in ("nan", "TopLeft")))
    partitioned, _ = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned) == 1


def test_split_scale_is_the_product_of_both_sides():
    partitioned, _ = offload_for_cpu(sdpa_attention(h=16))
    (region,) = attention_regions(partitioned)
    root = float(np.float16(np.sqrt(0.25)))  # each side's fp16 factor
    assert region.kernel.problem.scale == pytest.approx(root * root, rel=1e-6)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"mask": "float32"}, "the additive mask/bias is float32, but the kernel reads it as float16"),
        ({"masked_value": -1e6}, "the additive mask/bias is float32"),  # not exact, swamping or within range
        ({"fill": 0.5}, "a fully masked row gets probabilities 0.5"),
    ],
)
def test_unsupported_masks_stay_in_tvm_with_the_reason(kwargs, reason):
    mod = sdpa_attention(**kwargs)
    assert not offloaded_attention_rows(mod)
    text = str(offload_report(mod, arch="sm_90a"))
    assert reason in text, text
    compare_on_cpu(mod, masked_inputs(mod))


def test_float32_masks_are_cast_only_where_exact():
    """The -inf mask becomes float16 outside the region (one cast of the (B, 1, S, T) mask); the
    finfo.min mask becomes a -inf one plus the safe-softmax tail with 1/T; any other float32 mask
    is left alone."""
    from relax_cutlass.kinds.attention.masks import cast_attention_masks

    def ops(func):
        calls = []
        relax.analysis.post_order_visit(func, lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
        return [f"{c.op.name}:{c.ty.dtype}" for c in calls if isinstance(c.op, tvm.ir.Op)]

    before = sdpa_attention()["main"]
    after = ops(cast_attention_masks(before))
    assert after.count("relax.astype:float16") == ops(before).count("relax.astype:float16") + 1
    assert after.count("relax.astype:float32") == ops(before).count("relax.astype:float32") + 1
    swamping = ops(cast_attention_masks(sdpa_attention(tail=False, masked_value=FINFO_MIN)["main"]))
    wheres = sorted(op for op in swamping if op.startswith("relax.where"))
    assert wheres == ["relax.where:float16", "relax.where:float32"]  # the fp16 mask, the tail
    assert swamping.count("relax.max:int8") == 1  # the row test of the added tail
    other = sdpa_attention(masked_value=-1e6)["main"]
    assert cast_attention_masks(other).same_as(other)


@pytest.mark.parametrize("tail", [False, True])
def test_a_swamping_mask_in_bfloat16_becomes_a_finite_bfloat16_mask(tail):
    """Regression (every attention of a padded bfloat16 model stayed in TVM): Hugging Face's eager
    mask where(keep, 0, finfo(float32).min) is cast to bfloat16 with BFLOAT16_SWAMPING_MASK for
    the minimum: still swamping, so no row changes (a fully masked one, the first, keeps the mean of
    the values), and no tail is added; the graph's own safe-softmax tail, which never fired, stays
    as it was."""
    from relax_cutlass.kinds.attention.masks import BFLOAT16_SWAMPING_MASK, cast_attention_masks

    mod = sdpa_attention(dtype="bfloat16", tail=tail, masked_value=FINFO_MIN)
    cast = cast_attention_masks(mod["main"])
    found = []
    relax.analysis.post_order_visit(
        cast, lambda e: found.append(e) if isinstance(e, relax.Call) and e.op.name == "relax.where" else None
    )
    (mask,) = [w for w in found if str(w.ty.dtype) == "bfloat16"]
    fills = [a.value.numpy().astype("float32") for a in mask.args[1:] if isinstance(a, tvm.ir.GenericConst)]
    assert sorted(float(f) for f in fills) == [BFLOAT16_SWAMPING_MASK, 0.0], fills
    assert len(found) == 1 + tail  # the mask (and the graph's tail): no tail added
    (row,) = offloaded_attention_rows(mod)
    assert row["attention"]["bias"] == "B1ST" and row["attention"]["masked_rows"] == ("zero" if tail else "nan")
    compare_on_cpu(mod, masked_inputs(mod, full_row=True), rtol=3e-2)


@pytest.mark.parametrize(
    "checkpoint, dtype",
    [
        ("float32", "bfloat16"),  # T5's: a float32 table in a bfloat16 model
        ("16-bit", "float16"),
        pytest.param("float32", "float16", marks=pytest.mark.slow),
        pytest.param("16-bit", "bfloat16", marks=pytest.mark.slow),
    ],
)
def test_a_position_bias_from_a_table_is_cast_with_its_mask(checkpoint, dtype):
    """T5's form: where(keep, position bias, finfo(float32).min), the position bias rows of an
    embedding table, under torch's safe softmax. The table is a weight: from a float32 checkpoint
    its rows are rounded to the element type as `dtype` rounds every other weight (regression: all
    attentions of a T5 encoder from float32 weights stayed in TVM), from a checkpoint in that type
    the cast is exact. Either way the mask is cast and the attention runs in the kernel (in float16
    the tail's fill becomes 1/T), matching TVM's build within the bias's rounding."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from relax_cutlass import from_torch
    from relax_cutlass.testing.models.torch_transformers import TINY_VOCAB, tiny_model

    torch.manual_seed(0)
    model = tiny_model("t5_encoder", torch, transformers)
    if checkpoint == "16-bit":
        model = model.to(getattr(torch, dtype)).float()
    ids = torch.randint(3, TINY_VOCAB, (2, 24))
    mod = from_torch(model, (ids,), dtype=dtype)
    rows = offloaded_attention_rows(mod)
    assert sum(r["calls"] for r in rows) == 2 and all(r["attention"]["bias"] == "BNST" for r in rows), rows
    masked_rows = "mean" if dtype == "float16" else "zero"  # bfloat16: the graph's tail as it was
    assert all(r["attention"]["masked_rows"] == masked_rows for r in rows), rows
    partitioned, rewritten = offload_for_cpu(mod)
    serve_regions_on_cpu(partitioned)
    got = run_vm(build_cpu(rewritten), [ids.numpy()])
    want = run_vm(build_cpu(mod), [ids.numpy()])
    bound = 1e-3 if checkpoint == "16-bit" else {"float16": 2e-3, "bfloat16": 1e-2}[dtype]
    assert np.isfinite(got).all() and rel_error(got, want) < bound, rel_error(got, want)


@pytest.mark.parametrize(
    "table_scale, offloaded",
    [(1.0, True), (1e5, False)],  # a table beyond float16's range would round to infinities
)
def test_a_constant_bias_is_cast_only_within_float16_range(table_scale, offloaded):
    """A relative position bias as BEiT and Swin compute it (rows of a float32 table gathered by a
    constant index, plus a constant 0/-100 shifted-window mask): computed from weights alone, it is
    cast to float16 where every value it can take is finite there; a table beyond that range keeps
    the attention in TVM, saying why."""
    rng = np.random.default_rng(0)
    b, n, s, d = 2, 2, 16, 32
    table = (rng.standard_normal((2 * s - 1, n)) * table_scale).astype("float32")
    index = (np.arange(s)[:, None] - np.arange(s)[None, :] + s - 1).astype("int64")
    window = np.where(rng.random((b, 1, s, s)) < 0.3, -100.0, 0.0).astype("float32")
    window[..., np.arange(s), np.arange(s)] = 0.0  # every query sees itself
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(x, relax.TensorType([b, n, s, d], "float16")) for x in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            rows = bb.emit(relax.op.take(relax.const(table), relax.const(index.reshape(-1)), axis=0))
            bias = bb.emit(relax.op.permute_dims(relax.op.reshape(rows, [s, s, n]), [2, 0, 1]))
            bias = bb.emit(relax.op.add(relax.op.expand_dims(bias, 0), relax.const(window)))
            scores = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]), out_dtype="float16"))
            scaled = bb.emit(relax.op.astype(relax.op.multiply(scores, relax.const(d**-0.5, "float16")), "float32"))
            probs = bb.emit(relax.op.astype(relax.op.nn.softmax(relax.op.add(scaled, bias), axis=-1), "float16"))
            out = bb.emit(relax.op.matmul(probs, v, out_dtype="float16"))
            out = bb.emit_output(relax.op.permute_dims(out, [0, 2, 1, 3]))  # (B, S, N, D), as the kernel writes
        bb.emit_func_output(out)
    mod = bb.get()
    assert bool(offloaded_attention_rows(mod)) == offloaded
    if not offloaded:
        assert "within float16's range" in str(offload_report(mod, arch="sm_90a"))
    compare_on_cpu(mod, random_inputs(mod), rtol=2e-3)


def _transformers_bert(attention: str, with_mask: bool):
    """A one-layer Hugging Face BertModel (random init) on (input_ids[, attention_mask]), through
    torch.export and TVM's frontend, weights bound in float16: (torch model, Relax module)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from relax_cutlass.prepare import bind_float16
    from relax_cutlass.testing.models.torch_models import import_exported

    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=1, hidden_size=64, num_attention_heads=2, intermediate_size=128, attn_implementation=attention
    )
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, *mask):
            return self.bert(input_ids=ids, attention_mask=mask[0] if mask else None).last_hidden_state

    example = (torch.zeros(2, 16, dtype=torch.int64),) + ((torch.ones(2, 16, dtype=torch.int64),) if with_mask else ())
    model = Model().eval()
    return model, bind_float16(*import_exported(model, example))


@pytest.mark.parametrize(
    "attention, with_mask, masked_rows",
    [("sdpa", True, "zero"), ("sdpa", False, "zero"), ("eager", True, "mean")],
)
def test_transformers_bert_attention_is_fused(attention, with_mask, masked_rows):
    """transformers' default sdpa attention (q and k^T scaled apart, a -inf mask, the safe
    softmax) and its eager one (a finfo.min mask), exported as they are: the attention is one
    region with the padding mask as its bias (none without an attention_mask), and agrees with the
    untouched module and with torch for padded sequences and for a fully masked one."""
    import torch

    model, mod = _transformers_bert(attention, with_mask)
    (row,) = offloaded_attention_rows(mod)
    if with_mask:
        assert (row["attention"]["bias"], row["attention"]["masked_rows"]) == ("B1ST", masked_rows)
    else:  # the mask transformers builds without an attention_mask is zero: dropped (no bias)
        assert "bias" not in row["attention"], row
    assert row["attention"]["scale"] == pytest.approx(1 / np.sqrt(32), rel=1e-3)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, (2, 16))
    padded = np.ones((2, 16), "int64")
    padded[1, 11:] = 0
    empty = padded.copy()
    empty[0] = 0  # every key of the first sequence masked
    original = build_cpu(mod)
    partitioned, rewritten = offload_for_cpu(mod)
    serve_regions_on_cpu(partitioned)
    rewritten = build_cpu(rewritten)
    for keep in [padded, empty] if with_mask else [None]:
        inputs = [ids] if keep is None else [ids, keep]
        got = run_vm(rewritten, inputs)
        assert rel_error(got, run_vm(original, inputs)) < 1e-2
        with torch.no_grad():
            reference = model(*[torch.from_numpy(a) for a in inputs]).numpy()
        assert rel_error(got, reference) < 1e-2
    assert check_regions_against_kernel_model(partitioned) == 1


def test_attention_op_with_an_explicit_scale():
    """TVM's llvm legalization of R.nn.attention with `scale` returns float32 data for a float16
    result (its batch_matmul mixes dtypes), so the reference here is numpy's."""
    mod = op_attention(scale=0.3, t=5)
    partitioned, _ = offload_for_cpu(mod)
    (region,) = attention_regions(partitioned)
    q, k, v = random_inputs(mod)
    scores = np.einsum("bsnh,btnh->bnst", q.astype("float64"), k.astype("float64")) * 0.3
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("bnst,btnv->bsnv", probs / probs.sum(-1, keepdims=True), v.astype("float64"))
    assert rel_error(kernel_model(region.kernel.problem, q, k, v), expected) < 1e-6
    assert region.kernel.problem.scale == pytest.approx(0.3)


def test_symbolic_batch_reads_sizes_at_run_time():
    mod = torch_export_attention(symbolic_batch=True)
    (row,) = offloaded_attention_rows(mod)
    assert row["attention"]["batch"] == "dynamic"
    for batch in (1, 3):
        compare_on_cpu(mod, random_inputs(mod, batch=batch))
    partitioned, _ = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned, batch=3) == 1


def test_scale_is_the_applied_one():
    partitioned, _ = offload_for_cpu(torch_export_attention(h=16, scale_op="divide"))
    (region,) = attention_regions(partitioned)
    assert region.kernel.problem.scale == pytest.approx(0.25)
    partitioned, _ = offload_for_cpu(op_attention(h=16))
    (region,) = attention_regions(partitioned)
    assert region.kernel.problem.scale == pytest.approx(0.25)  # R.nn.attention's default 1/sqrt(H)


@pytest.mark.parametrize(
    "builder, kwargs, reason",
    [
        (torch_export_attention, {"softmax_axis": 2}, "softmax over axis 2 is not over the keys"),
        (torch_export_attention, {"out": "bnsh"}, "not BSNV"),
        (torch_export_attention, {"h": 6}, "multiples of 4"),
    ],
)
def test_unsupported_attention_stays_in_tvm_with_the_reason(builder, kwargs, reason):
    mod = builder(**kwargs)
    assert not offloaded_attention_rows(mod)
    text = str(offload_report(mod, arch="sm_90a"))
    assert reason in text, text
    compare_on_cpu(mod, random_inputs(mod))  # whatever was offloaded instead is still right


def test_emitted_kernel_and_glue():
    partitioned, _ = offload_for_cpu(torch_export_attention(h=64))
    (region,) = attention_regions(partitioned, family="sm80")  # sm_90a's SM90 kernel: tests/test_attention_sm90.py
    kernel = region.kernel
    assert kernel.name == "sm80_fmha_f16_aligned_q32_k128_maxk64"  # 4 CTAs of 64 queries: under-filled
    source = emit_kernel(kernel)
    assert "AttentionKernel<cutlass::half_t, cutlass::arch::Sm80, /*isAligned=*/true" in source.text
    assert any(flag.endswith("41_fused_multi_head_attention") for flag in source.extra_flags)
    glue = emit_glue([region], "m").text
    # The exported graph hands the kernel (B, S, N, H) tensors: batch, rows and heads are dims 0, 1, 2.
    assert "Data(query), PackedStride(query, 0), PackedStride(query, 1), PackedStride(query, 2)" in glue
    assert 'TRY(CheckDim(fn, "query dim 3", query->shape[3], 64, query));' in glue and "0.125f" in glue


def test_a_bias_off_16_byte_rows_is_padded_at_run_time():
    """Regression (H100): BERT and Llama exported with a symbolic sequence length ran
    only at lengths that are multiples of 8; the glue raised "pad the sequence" at 7 and 300 keys.
    Now the kernel's run function copies such a bias into rows rounded up to 8 keys (PadBiasRows)
    and no key count is refused, static (13 keys) or symbolic."""
    partitioned, _ = offload_for_cpu(sdpa_attention(mask_shape="b11t", s=9, t=13))
    (region,) = attention_regions(partitioned)
    assert region.kernel.problem.bias_reads is not None and region.kernel.arch == 80
    source = emit_kernel(region.kernel).text
    assert "PadBiasRows<T><<<" in source and "if (!BiasIsVectorAligned(a))" in source
    assert "launch.attn_bias_ptr += i * group * p.bias_strideH" in source  # GQA launches: the padded strides
    glue = emit_glue([region], "m").text
    assert "seq_kv % 8" not in glue and "pad the sequence" not in glue


def test_head_split_is_read_through_strides():
    """The hand-written BERT layer splits heads right before the permute, so the region starts at
    the (B, S, N*H) projections: heads and head dims are two axes of one dimension."""
    from relax_cutlass.testing.models import bert_encoder_layer

    mod = bert_encoder_layer(batch=2, seq=16, hidden=64, ffn=128, heads=4)
    (row,) = offloaded_attention_rows(mod)
    assert row["shapes"]["query"] == [2, 16, 64]
    partitioned, _ = offload_for_cpu(mod)
    (region,) = attention_regions(partitioned)
    assert region.kernel.problem.query_reads == ((0, 1), (1, 1), (2, 16), (2, 1))
    glue = emit_glue([region], "m").text
    assert "PackedStride(query, 2) * 16" in glue
    assert check_regions_against_kernel_model(partitioned) == 1
    compare_on_cpu(mod, random_inputs(mod))


def test_wide_heads_take_the_32x128_tile():
    kernel = choose_attention_kernel(AttentionProblem(2, 8, 128, 128, 128, 128, 0.1), 80)
    assert (kernel.queries_per_block, kernel.keys_per_block, kernel.max_head_dim) == (32, 128, 128)
    narrow = choose_attention_kernel(AttentionProblem(16, 8, 128, 128, 36, 36, 0.1), 80)
    assert not narrow.aligned and narrow.name.endswith("a4_q64_k64_maxk36")


def test_under_filled_attention_takes_32_query_tiles():
    """BERT-large at batch 1 has 16 heads x 2 blocks of 64 queries: 32 CTAs for 132 SMs."""
    bert = AttentionProblem(1, 16, 128, 128, 64, 64, 0.125)
    assert choose_attention_kernel(bert, 90, family="sm80").queries_per_block == 32
    assert choose_attention_kernel(dataclasses.replace(bert, batch=8), 90, family="sm80").queries_per_block == 64
    # A symbolic batch may be large: the 64-query tiles, as for any size not known at build time.
    assert choose_attention_kernel(dataclasses.replace(bert, batch=None), 90, family="sm80").queries_per_block == 64


def test_torchvision_vit_attention_is_fused():
    """nn.MultiheadAttention as torch.export writes it in a torchvision ViT, weights in float16:
    q/k/v split from the packed projection by take, heads split and scaled by 0.5 in float32,
    cast to float16 just before each batched matmul, the output written sequence-first. Each
    layer's attention becomes one region, and the module agrees with the untouched one."""
    pytest.importorskip("torch")
    from relax_cutlass.prepare import bind_float16
    from relax_cutlass.testing.models.torch_models import vit_module

    mod = bind_float16(*vit_module(batch=2, layers=1))  # two layers took 4.5 min on 2 cores
    (row,) = offloaded_attention_rows(mod)
    assert row["calls"] == 1
    assert row["attention"]["scale"] == pytest.approx(0.25)  # q and k^T each scaled by 0.5
    compare_on_cpu(mod, random_inputs(mod))


def test_torchvision_vit_attention_with_head_dim_64_is_fused():
    """Regression (ViT-B/16 on the H100: its 24 attention matmuls stayed in TVM): at
    head dim 64 torch.export scales q and k^T by 1/sqrt(8) each, no power of two, so the scales
    cannot run in float16 bit-identically; they stay in float32 between two casts, which the
    pattern reads through. The test above uses head dim 16, whose scales are 0.5."""
    pytest.importorskip("torch")
    from relax_cutlass.prepare import bind_float16
    from relax_cutlass.testing.models.torch_models import vit_module

    mod = bind_float16(*vit_module(batch=2, hidden=64, heads=1, mlp=128, layers=1))
    (row,) = offloaded_attention_rows(mod)
    assert row["calls"] == 1
    assert row["attention"]["scale"] == pytest.approx(0.125)  # q and k^T each scaled by 1/sqrt(8)
    compare_on_cpu(mod, random_inputs(mod))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "scales, in_float16",
    [((0.5,), True), ((0.25,), True), ((0.3,), False), ((3.0,), False), ((0.3, 0.5), False), ((0.5, 0.3), False)],
)
def test_operand_casts_move_bit_identically(scales, in_float16, dtype):
    """astype(f32 views/scales of astype(x16, f32), f16) -> the views in float16 on x16; 2**k
    scales in float16; any other scalar scale (ViT-B/16's 1/sqrt(8)) in float32 between two
    casts, from the first such scale to the last. Either way bit-identical, on values that reach
    float16's subnormals too. bfloat16 operands keep every scale in float32 between the casts
    (a power of two is exact there too, but its bfloat16 product could leave bfloat16's range
    where float32's does not)."""
    from relax_cutlass.kinds.attention.operands import cast_attention_operands

    in_float16 = in_float16 and dtype == "float16"
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), dtype))
    w = relax.Var("w", relax.TensorType((2, 16, 4), dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            wide = bb.emit(relax.op.astype(x, "float32"))
            value = bb.emit(relax.op.reshape(wide, (2, 4, 16)))
            for i, scale in enumerate(scales):
                value = bb.emit(relax.op.multiply(value, relax.const(scale, "float32")))
                if i == 0:
                    value = bb.emit(relax.op.permute_dims(value, [0, 2, 1]))
                    value = bb.emit(relax.op.permute_dims(value, [0, 2, 1]))
            out = bb.emit_output(relax.op.matmul(bb.emit(relax.op.astype(value, dtype)), w))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    rewritten = cast_attention_operands(func)
    casts = [line for line in rewritten.script().splitlines() if "R.astype" in line]
    # in float16 no cast is left; otherwise one cast up to float32 and one back, around the scales
    assert len(casts) == (0 if in_float16 else 2)
    rng = np.random.default_rng(0)
    # magnitudes from the 16-bit type's subnormals to its large values, both signs
    element = ml_dtypes.bfloat16 if dtype == "bfloat16" else "float16"
    low, high = (-133, 120) if dtype == "bfloat16" else (-24, 14)
    x_np = (rng.choice([-1, 1], (8, 16)) * 2.0 ** rng.uniform(low, high, (8, 16))).astype(element)
    w_np = rng.standard_normal((2, 16, 4)).astype(element)
    results = []
    for f in (func, rewritten):
        vm = build_cpu(tvm.IRModule({"main": f}))
        results.append(run_vm(vm, [x_np, w_np]))
    np.testing.assert_array_equal(results[0].view("uint16"), results[1].view("uint16"))
    assert np.isfinite(results[0].astype("float32")).any()  # the comparison saw numbers, not only inf/NaN


def _rewritten_view_chain(rewrite, source, views, out) -> tuple:
    """main(x) = reshape(views(x), out) and `rewrite` of it: (function, rewritten, its script), the
    two checked to give the same values bit for bit."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(source, "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            view = x
            for make in views:
                view = bb.emit(make(view))
            y = bb.emit_output(relax.op.reshape(view, out))
        bb.emit_func_output(y)
    func = bb.get()["main"]
    rewritten = relax.analysis.remove_all_unused(rewrite(func))
    x_np = np.random.default_rng(0).standard_normal(source).astype("float16")
    got, expected = (run_vm(build_cpu(tvm.IRModule({"main": f})), [x_np]) for f in (rewritten, func))
    np.testing.assert_array_equal(got, expected)
    return func, rewritten, rewritten.script()


@pytest.mark.parametrize(
    "source, merged, axes, out, want",
    [
        # torch.onnx dynamo's k^T: (B, N, T, H) -> (B*N, T, H) -> (B*N, H, T) -> (B, N, H, T)
        ((2, 4, 16, 8), (8, 16, 8), (0, 2, 1), (2, 4, 8, 16), "R.permute_dims(x, axes=[0, 1, 3, 2])"),
        # its grouped-query keys: (B, N_kv, G, T, H) -> (B*N_kv*G, T, H) -> ... -> (B, N_kv*G, H, T)
        ((1, 2, 3, 16, 8), (6, 16, 8), (0, 2, 1), (1, 6, 8, 16), "R.reshape(x, R.shape([1, 6, 16, 8]))"),
        # the batch dim moves: no batch-merged transpose, left alone
        ((2, 4, 16, 8), (8, 16, 8), (1, 0, 2), (16, 2, 4, 8), None),
        # split back into other sizes than the merged dims' product: left alone
        ((2, 4, 16, 8), (8, 16, 8), (0, 2, 1), (2, 4, 16, 8), None),
    ],
)
def test_batch_merged_transposes_become_one_permute(source, merged, axes, out, want):
    """reshape -> permute_dims keeping dim 0 -> reshape, a transpose written on the batch-merged
    view, is one permute_dims of the tensor (after repeat_kv's reshape where the batch splits
    back into other dims); values unchanged."""
    from relax_cutlass.kinds.attention.operands import merged_batch_transposes

    views = [lambda v: relax.op.reshape(v, merged), lambda v: relax.op.permute_dims(v, axes)]
    func, rewritten, text = _rewritten_view_chain(merged_batch_transposes, source, views, out)
    if want is None:
        assert text.count("R.reshape") == 2, text
        return
    assert want in text and text.count("R.permute_dims") == 1, text


@pytest.mark.parametrize(
    "source, axes, out, want",
    [
        # dynamo's nn.MultiheadAttention k^T: (S, B*N, H) -> (B*N, H, S) -> split B*N
        ((17, 8, 16), [(1, 0, 2), (0, 2, 1)], (2, 4, 16, 17), "R.reshape(x, R.shape([17, 2, 4, 16]))"),
        ((6, 4, 5), [(2, 0, 1)], (5, 2, 3, 4), "R.permute_dims(lv, axes=[3, 0, 1, 2])"),
        # a merge, not a split: left alone
        ((6, 4, 5), [(2, 0, 1)], (5, 24), None),
    ],
)
def test_splits_after_transposes_move_before_them(source, axes, out, want):
    """permute_dims chains compose into one, and a reshape that only splits the permuted dims moves
    before the permute (splitting x's dims instead): values unchanged."""
    from relax_cutlass.kinds.attention.operands import splits_before_transposes

    views = [lambda v, step=step: relax.op.permute_dims(v, step) for step in axes]
    _, _, text = _rewritten_view_chain(splits_before_transposes, source, views, out)
    if want is None:
        assert text.index("R.permute_dims") < text.index("R.reshape"), text
    else:
        assert want in text and text.count("R.permute_dims") == 1, text
        assert text.index("R.reshape") < text.index("R.permute_dims"), text


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_attention_with_scale_one_builds(arch):
    """A speech encoder's attention has scale exactly 1: its glue was written with the C++ literal
    `1f`, which g++ rejects, and the whole build raised. Built for real here (kernel, glue, link)."""
    import warnings

    import relax_cutlass

    mod = op_attention(b=2, s=128, n=8, h=64, scale=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a region sent back to TVM warns
        built = relax_cutlass.offload_pipeline(arch, profile="never")(mod)
    (row,) = relax_cutlass.offload_report(built).offloaded
    assert row["attention"]["scale"] == 1.0 and built.attrs["external_mods"]


def op_attention_bias(bias_shape, causal=None, b=2, s=16, t=16, n=4, h=16, bias_dtype=F16):
    """R.nn.attention(q, k, v, bias) on BSNH tensors: TVM's relax.nn.attention_bias (inputs x, y,
    z: q, k, v, then the bias)."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(name, tensor_type((b, rows, n, h))) for name, rows in (("x", s), ("y", t), ("z", t)))
    bias = relax.Var("bias", tensor_type(bias_shape, bias_dtype))
    with bb.function("main", [q, k, v, bias]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(relax.op.nn.attention(q, k, v, bias, causal_mask=causal)))
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("bias_shape", [(2, 4, 16, 24), (2, 1, 16, 24), (2, 1, 1, 24), (1, 4, 16, 24), (1, 1, 1, 24)])
@pytest.mark.parametrize("causal", [None, "TopLeft", "BottomRight"])
def test_attention_op_with_a_bias_is_offloaded_and_correct(bias_shape, causal):
    """Relax's own attention op given a bias (what hand-written modules and other frontends give)
    was neither offloaded nor reported; every broadcast of the (B, N, S, T) bias reads through
    strides (0 where broadcast), with TVM's causal masks on top."""
    mod = op_attention_bias(bias_shape, causal, t=24)
    (row,) = offload_report(mod, "sm_80").offloaded
    assert row["composite"] == "relax_cutlass.attention_op_bias"
    # masked keys where no causal mask could leave a query row without any (NaN, in TVM too)
    compare_on_cpu(mod, masked_inputs(mod, full_row=False) if causal is None else random_inputs(mod))
    partitioned, _ = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned) == 1


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"bias_dtype": "float32"}, "the additive mask/bias is float32, but the kernel reads it as float16"),
        ({"h": 6}, "head dims 6/6 must be multiples of 4"),
    ],
)
def test_attention_op_with_a_bias_left_in_tvm_is_reported(kwargs, reason):
    report = offload_report(op_attention_bias((2, 4, 16, 16), **kwargs), "sm_80")
    assert not report.offloaded
    (left,) = report.left_in_tvm
    assert left["op"] == "attention op" and reason in left["reasons"][0], left


@pytest.mark.parametrize("bias_batch", ["b", 1])
def test_attention_op_with_a_bias_and_symbolic_sizes(bias_batch):
    """A symbolic batch and length, the bias (b | 1, 1, 1, s) a padding mask: read through strides
    whose sizes the glue takes at run time, which the host compiler builds."""
    from relax_cutlass.stages.constants import offloaded_functions as offloaded
    from relax_cutlass.toolkit.compile import compile_all

    b, s = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("s", "int64")
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(name, tensor_type((b, s, 4, 16))) for name in "xyz")
    bias = relax.Var("bias", tensor_type((b if bias_batch == "b" else 1, 1, 1, s)))
    with bb.function("main", [q, k, v, bias]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(relax.op.nn.attention(q, k, v, bias)))
        bb.emit_func_output(gv)
    mod = bb.get()
    for size in ({"b": 1, "s": 5}, {"b": 3, "s": 24}):
        compare_on_cpu(mod, masked_inputs_sized(mod, size))
    partitioned, _ = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned, b=3, s=24) == 1
    regions = attention_regions(partitioned)
    assert regions[0].kernel.problem.batch is None and regions[0].kernel.problem.seq_kv is None
    compile_all([emit_glue(regions, "symbolic_bias")], 90)  # host compiler only
    assert len(list(offloaded(partitioned))) == 1


def masked_inputs_sized(mod: tvm.IRModule, dims: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """Random inputs for symbolic `dims`; the bias -inf on about a third of the keys, never key 0."""
    rng = np.random.default_rng(seed)
    arrays = []
    for p in mod["main"].params:
        shape = [evaluate_dim(d, dims) for d in p.ty.shape.values]
        values = rng.uniform(-1, 1, size=shape)
        if p.name == "bias":
            values[..., 1:][rng.random(values[..., 1:].shape) < 0.3] = -np.inf
        arrays.append(values.astype(str(p.ty.dtype)))
    return arrays
