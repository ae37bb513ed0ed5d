"""A position bias beside a causal mask (BLOOM's ALiBi): the reshape between the two adds moved in
front of the first (kinds/attention/terms.py), the bias cast as the weights are, and the attention
run as one region with the bias and the kernel's causal mask; and a rewrite that raises never fails
the pipeline."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relax_cutlass
from relax_cutlass.kinds.attention.terms import reshape_groups, reshaped_broadcast
from relax_cutlass.stages.partition import RewriteSkippedWarning, guarded_rewrite
from relax_cutlass.testing.attention import check_regions_against_kernel_model, offloaded_attention_rows
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import build_cpu, offload_for_cpu, run_vm, serve_regions_on_cpu


@pytest.mark.parametrize(
    "src, dst, groups",
    [
        ([8, 64, 64], [2, 4, 64, 64], [([0], [0, 1]), ([1], [2]), ([2], [3])]),  # BLOOM's (B*N, S, T)
        ([2, 4, 64, 64], [8, 64, 64], [([0, 1], [0]), ([2], [1]), ([3], [2])]),
        ([6, 1, 5], [6, 5], [([0], [0]), ([1, 2], [1])]),
        ([6, 5], [6, 5, 1], [([0], [0]), ([1], [1, 2])]),
        ([6, 10], [4, 15], [([0, 1], [0, 1])]),
    ],
)
def test_a_reshape_is_grouped_into_axes_kept_split_or_merged(src, dst, groups):
    assert [(list(a), list(b)) for a, b in reshape_groups(src, dst)] == groups


def test_a_reshape_of_other_sizes_has_no_groups():
    assert reshape_groups([8, 64], [8, 63]) is None


@st.composite
def _reshapes(draw):
    """A shape, a reshape of it that splits or merges axes, and a term broadcast to it."""
    src = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    dst = []
    for size in src:  # each axis kept, split in two, or merged into the one before
        factors = [f for f in range(2, size) if size % f == 0]
        choice = draw(st.sampled_from(["keep", "merge", "split"] if factors else ["keep", "merge"]))
        if choice == "split":
            f = draw(st.sampled_from(factors))
            dst += [f, size // f]
        elif choice == "merge" and dst:
            dst[-1] *= size
        else:
            dst.append(size)
    term = [draw(st.sampled_from([1, size])) for size in src]
    return src, dst, term[draw(st.integers(0, len(term))) :]


@given(_reshapes())
def test_a_term_reshaped_alike_keeps_its_values(case):
    """Where `reshaped_broadcast` gives a shape, the term reshaped to it and broadcast is the term
    broadcast and then reshaped, value for value; where it gives none, some group of axes is
    partly broadcast."""
    src, dst, term = case
    values = np.arange(int(np.prod(term))).reshape(term)
    shape = reshaped_broadcast(term, src, dst)
    if shape is not None:
        want = np.broadcast_to(values, src).reshape(dst)
        np.testing.assert_array_equal(np.broadcast_to(values.reshape(shape), dst), want)
    else:
        padded = [1] * (len(src) - len(term)) + term
        whole = [any(padded[k] == src[k] != 1 for k in a) for a, _ in reshape_groups(src, dst)]
        broadcast = [any(padded[k] == 1 != src[k] for k in a) for a, _ in reshape_groups(src, dst)]
        assert any(w and b for w, b in zip(whole, broadcast, strict=True)), (src, dst, term)


def _bloom(attention_mask: bool, dtype: str = "float16"):
    """A tiny random-init BLOOM (4 heads of 32; ALiBi computed from constants, or from the
    attention_mask input), imported in `dtype`, and its inputs."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from relax_cutlass.testing.models.torch_transformers import TINY_VOCAB, tiny_model

    torch.manual_seed(0)
    model = tiny_model("bloom", torch, transformers)
    ids = torch.randint(3, TINY_VOCAB, (2, 24))
    inputs = (ids,)
    if attention_mask:
        mask = torch.ones(2, 24, dtype=torch.int64)
        mask[1, :7] = 0
        inputs = (ids, mask)
    return relax_cutlass.from_torch(model, inputs, dtype=dtype), [x.numpy() for x in inputs]


@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_alibi_beside_a_causal_mask_runs_in_the_kernel(dtype):
    """BLOOM adds ALiBi in the (B*N, S, T) frame of its baddbmm, reshapes, then adds the causal
    mask: one region per attention, the bias read as (B, N, 1, T) (never written out per query),
    the causal mask the kernel's own; as TVM's build of the same graph."""
    mod, inputs = _bloom(attention_mask=False, dtype=dtype)
    rows = offloaded_attention_rows(mod)
    assert sum(r["calls"] for r in rows) == 2, rows
    for row in rows:
        assert row["attention"]["bias"] == "BN1T" and row["attention"]["causal"] == "TopLeft", row
        assert row["dtypes"]["bias"] == dtype and row["kernel"].endswith("_bias"), row
    partitioned, rewritten = offload_for_cpu(mod)
    serve_regions_on_cpu(partitioned)
    got, want = run_vm(build_cpu(rewritten), inputs), run_vm(build_cpu(mod), inputs)
    assert np.isfinite(got).all() and rel_error(got, want) < {"float16": 2e-3, "bfloat16": 1e-2}[dtype]


def test_alibi_beside_a_padding_mask_stays_in_tvm_and_says_why():
    """With an attention_mask input BLOOM's ALiBi counts the positions of the kept tokens, computed
    at run time in float32 with no bound the build can prove: both adds stay in TVM, the report
    naming them, and the module computes what TVM's build does."""
    mod, inputs = _bloom(attention_mask=True)
    assert offloaded_attention_rows(mod) == []
    partitioned, rewritten = offload_for_cpu(mod)
    notes = [r["reasons"][0] for r in relax_cutlass.offload_report(rewritten).left_in_tvm]
    assert len(notes) == 4 and all("2 additions there (a position bias such as ALiBi" in n for n in notes), notes
    serve_regions_on_cpu(partitioned)
    got, want = run_vm(build_cpu(rewritten), inputs), run_vm(build_cpu(mod), inputs)
    assert rel_error(got, want) < 2e-3


def _bloom_as_older_transformers_export_it(heads: int = 4, seq: int = 16, head_dim: int = 8):
    """BLOOM's attention as transformers 5.17 under torch 2.11 exports it (the GPU host's zoo
    import): ALiBi counts key positions with cumsum over a constant all-ones attention mask, and
    the causal mask is and(arange causal, index_tensor of that mask) filled with finfo(float32).min
    -- all computed from no input, in float32. Inputs q, k, v: (1, S, N, H) float16."""
    from tvm import relax

    f16, f32 = "float16", "float32"
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((1, seq, heads, head_dim), f16)) for n in "qkv")
    ones = relax.const(np.ones((1, seq), f32))
    op = relax.op
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            e = bb.emit
            exponents = e(op.astype(e(op.arange(1, heads + 1, 1, "int32")), f32))
            slopes = e(op.expand_dims(e(op.power(relax.const(0.5, f32), exponents)), [1]))
            counted = e(op.subtract(e(op.cumsum(ones, axis=-1)), relax.const(1.0, f32)))
            positions = e(op.expand_dims(e(op.multiply(counted, ones)), [1]))
            alibi = e(op.reshape(e(op.multiply(slopes, positions)), (heads, 1, seq)))
            batch = e(op.arange(0, 1, 1, "int64"))
            for axis in (1, 2, 3):
                batch = e(op.expand_dims(batch, [axis]))
            keys = e(op.add(e(op.arange(0, seq, 1, "int64")), relax.const(0, "int64")))
            keys = e(op.expand_dims(e(op.expand_dims(keys, [0])), [1]))
            rows, cols = e(op.expand_dims(keys, [3])), e(op.expand_dims(keys, [2]))
            causal = e(op.bitwise_and(relax.const(True), e(op.less_equal(cols, rows))))
            kept = e(op.index_tensor(relax.const(np.ones((1, seq), bool)), relax.Tuple([batch, cols])))
            keep = e(op.broadcast_to(e(op.bitwise_and(causal, kept)), (1, 1, seq, seq)))
            mask = e(op.where(keep, relax.const(0.0, f32), relax.const(float(np.finfo(f32).min), f32)))
            q3, k3, v3 = (e(op.reshape(e(op.permute_dims(x, [0, 2, 1, 3])), (heads, seq, head_dim))) for x in (q, k, v))
            scores = e(op.astype(e(op.matmul(q3, e(op.permute_dims(k3, [0, 2, 1])), out_dtype=f32)), f16))
            scores = e(op.astype(e(op.multiply(scores, relax.const(head_dim**-0.5, f16))), f32))
            logits = e(op.add(e(op.reshape(e(op.add(alibi, scores)), (1, heads, seq, seq))), mask))
            probs = e(op.astype(e(op.reshape(e(op.nn.softmax(logits, -1)), (heads, seq, seq))), f16))
            gv = bb.emit_output(e(op.astype(e(op.matmul(probs, v3, out_dtype=f32)), f16)))
        bb.emit_func_output(gv)
    rng = np.random.default_rng(0)
    return bb.get(), [rng.standard_normal((1, seq, heads, head_dim)).astype(f16) for _ in range(3)]


def test_alibi_counted_by_cumsum_over_a_constant_mask_runs_in_the_kernel():
    """Regression (bloom_4l on the GPU host, transformers 5.17): ALiBi's key positions came from a
    cumsum, which had no bound, so the float32 bias could not be read in float16 and every BLOOM
    attention stayed in TVM. A running sum is bounded by its terms and the axis length; the
    attention is now one region with the bias (B, N, 1, T) and the kernel's causal mask."""
    mod, inputs = _bloom_as_older_transformers_export_it()
    (row,) = offloaded_attention_rows(mod)
    # batch 1: the (B*N, S, T) frame reads as batch N of one head each, the bias one row per batch
    assert row["attention"]["bias"] == "B11T" and row["attention"]["causal"] == "TopLeft", row
    assert row["dtypes"]["bias"] == "float16" and row["kernel"].endswith("_bias"), row
    partitioned, rewritten = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned) == 1  # the kernel's strided reads
    serve_regions_on_cpu(partitioned)
    got, want = run_vm(build_cpu(rewritten), inputs), run_vm(build_cpu(mod), inputs)
    assert np.isfinite(got).all() and rel_error(got, want) < 2e-3


def test_a_rewrite_that_raises_leaves_the_function_and_warns():
    """A kind's rewrite that meets a graph it did not foresee: the function goes on unchanged, and
    a RewriteSkippedWarning names the rewrite, the function and the error."""
    mod, _ = _bloom(attention_mask=False)

    def broken(func):
        raise AttributeError("module 'tvm.relax' has no attribute 'PrimValue'")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert guarded_rewrite(broken, mod["main"], "main").same_as(mod["main"])
    (warning,) = caught
    assert warning.category is RewriteSkippedWarning
    assert "the broken rewrite failed on function main (AttributeError: module 'tvm.relax'" in str(warning.message)


def _shifted_window_attention(mask_is_input: bool = False, batch=2, windows=4, heads=2, seq=16, head_dim=16):
    """torchvision's Swin shifted-window attention as from_torch imports it (float16): the scores of
    every window (B*nW, N, S, S) plus the relative position bias (N, S, S), viewed as (B, nW, N, S,
    S) plus the shift mask (1, nW, 1, S, S) of 0 / -100, viewed back, softmax in float32. The mask a
    constant, or (`mask_is_input`) a parameter. -> (module, inputs)"""
    from tvm import relax

    f16, op = "float16", relax.op
    rng = np.random.default_rng(0)
    frame = (batch * windows, heads, seq, head_dim)
    q, k, v = (relax.Var(n, relax.TensorType(frame, f16)) for n in "qkv")
    shift = np.where(rng.random((1, windows, 1, seq, seq)) < 0.3, -100.0, 0.0).astype(f16)
    mask = relax.Var("mask", relax.TensorType(shift.shape, f16)) if mask_is_input else relax.const(shift)
    position = relax.const(rng.uniform(-2, 2, (heads, seq, seq)).astype(f16))
    bb = relax.BlockBuilder()
    params = [q, k, v, mask] if mask_is_input else [q, k, v]
    with bb.function("main", params):
        with bb.dataflow():
            e = bb.emit
            qs = e(op.reshape(q, (batch * windows * heads, seq, head_dim)))
            kt = e(op.reshape(e(op.permute_dims(k, [0, 1, 3, 2])), (batch * windows * heads, head_dim, seq)))
            scores = e(op.reshape(e(op.astype(e(op.matmul(qs, kt, out_dtype="float32")), f16)), frame[:2] + (seq, seq)))
            biased = e(op.reshape(e(op.add(scores, position)), (batch, windows, heads, seq, seq)))
            logits = e(op.reshape(e(op.add(biased, mask)), frame[:2] + (seq, seq)))
            probs = e(op.nn.softmax(e(op.astype(logits, "float32")), 3))
            probs = e(op.astype(e(op.reshape(probs, (batch * windows * heads, seq, seq))), f16))
            vs = e(op.reshape(v, (batch * windows * heads, seq, head_dim)))
            out = e(op.astype(e(op.matmul(probs, vs, out_dtype="float32")), f16))
            # (B*nW, N, S, H) -> (B*nW, S, N*H), as the block's projection reads it
            out = e(op.permute_dims(e(op.reshape(out, frame[:2] + (seq, head_dim))), [0, 2, 1, 3]))
            gv = bb.emit_output(e(op.reshape(out, (batch * windows, seq, heads * head_dim))))
        bb.emit_func_output(gv)
    inputs = [rng.standard_normal(frame).astype(f16) for _ in range(3)]
    return bb.get(), inputs + ([shift] if mask_is_input else [])


def test_swin_window_terms_become_one_bias_the_kernel_reads():
    """Regression (torchvision's swin_t in the zoo: its five shifted-window attentions stayed in
    TVM, 2 additions around a view): the position bias and the shift mask, both constants, are
    added into one (B*nW, N, S, S) bias, and the attention is one region reading it; the kernel's
    strided reads and the module's values as TVM's build of the original."""
    mod, inputs = _shifted_window_attention()
    (row,) = offloaded_attention_rows(mod)
    assert row["attention"]["bias"] == "BNST" and row["kernel"].endswith("_bias"), row
    partitioned, rewritten = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned) == 1
    serve_regions_on_cpu(partitioned)
    got, want = run_vm(build_cpu(rewritten), inputs), run_vm(build_cpu(mod), inputs)
    assert np.isfinite(got).all() and rel_error(got, want) < 2e-3


def test_window_terms_from_an_input_stay_in_tvm_and_say_why():
    """A shift mask given at run time cannot be added ahead: both adds stay in TVM, as before."""
    mod, inputs = _shifted_window_attention(mask_is_input=True)
    assert offloaded_attention_rows(mod) == []
    partitioned, rewritten = offload_for_cpu(mod)
    notes = [r["reasons"][0] for r in relax_cutlass.offload_report(rewritten).left_in_tvm]
    assert notes and all("2 additions there" in n for n in notes), notes
    serve_regions_on_cpu(partitioned)
    assert rel_error(run_vm(build_cpu(rewritten), inputs), run_vm(build_cpu(mod), inputs)) < 1e-3
