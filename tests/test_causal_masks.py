"""Causal masks a model computes from no input (Hugging Face's decoders: aranges, cumsum,
index_tensor, where(keep, 0, -inf)) are evaluated at build time and, where causal in value, become
the attention kernels' own causal mask: no mask tensor is built or read at run time."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.attention.causal import causal_offset
from relax_cutlass.kinds.evaluate import evaluate_input_free, input_free_bindings
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import (
    build_cpu,
    compare_on_cpu,
    random_inputs,
    run_vm,
    serve_regions_on_cpu,
)

torch = pytest.importorskip("torch")

# isort: split
from relax_cutlass.testing.attention import attention_rows_after_offload  # noqa: E402
from relax_cutlass.testing.models.torch_attention import CausalAttention  # noqa: E402


def _mask(rows: int, keys: int, offset: int, masked: float = -np.inf) -> np.ndarray:
    i, j = np.indices((rows, keys))
    return np.where(j <= i + offset, 0.0, masked).astype("float32")


@pytest.mark.parametrize("rows, keys", [(6, 6), (4, 9), (1, 5)])
def test_causal_offset_reads_top_left_and_bottom_right(rows, keys):
    assert causal_offset(_mask(rows, keys, 0)[None, None], rows, keys, float32_add=True) == 0
    if keys > rows:
        assert causal_offset(_mask(rows, keys, keys - rows), rows, keys, float32_add=True) == keys - rows
    assert causal_offset(_mask(rows, keys, 1), rows, keys, float32_add=True) is None  # one key too many


def test_causal_offset_refuses_what_is_not_causal_in_value():
    rows = keys = 8
    causal = _mask(rows, keys, 0)
    window = causal.copy()
    window[np.tril_indices(rows, -3)] = -np.inf  # sliding window of 3
    padded = causal.copy()
    padded[:, 6:] = -np.inf  # a padding mask folded in
    assert causal_offset(window, rows, keys, True) is None
    assert causal_offset(padded, rows, keys, True) is None
    per_head = np.stack([causal, padded])[None]  # (1, 2, S, T): heads differ
    assert causal_offset(per_head, rows, keys, True) is None
    assert causal_offset(_mask(rows, keys, 0, masked=5.0), rows, keys, True) is None
    assert causal_offset(causal[:, :7], rows, keys, True) is None  # another shape
    assert causal_offset(_mask(rows, 4, 0), rows, 4, True) is None  # fewer keys than queries


def test_a_swamping_finite_mask_value_counts_only_when_added_in_float32():
    """finfo(float32).min (Hugging Face's eager masks) swamps every float16 score in a float32
    add; in a float16 add it would not be a mask value at all."""
    huge = _mask(8, 8, 0, masked=float(np.finfo("float32").min))
    assert causal_offset(huge, 8, 8, float32_add=True) == 0
    assert causal_offset(huge, 8, 8, float32_add=False) is None
    assert causal_offset(_mask(8, 8, 0, masked=-1e4), 8, 8, float32_add=True) is None


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 12),
    extra=st.integers(0, 6),
    offset=st.integers(-3, 9),
    lead=st.sampled_from([(), (1,), (1, 1), (2, 3)]),
    masked=st.sampled_from([-np.inf, float(np.finfo("float32").min), -1e4]),
    float32_add=st.booleans(),
    flip=st.one_of(st.none(), st.tuples(st.integers(0, 11), st.integers(0, 17))),
)
def test_causal_offset_is_exactly_the_masks_diagonal(rows, extra, offset, lead, masked, float32_add, flip):
    """For any mask built as `j <= i + offset` (then perhaps one entry flipped), causal_offset says
    the offset exactly when the mask is TVM's TopLeft or BottomRight in value and its hidden
    value hides in that add; else None."""
    keys = rows + extra
    mask = np.broadcast_to(_mask(rows, keys, offset, masked), (*lead, rows, keys)).copy()
    flipped = flip is not None and flip[0] < rows and flip[1] < keys
    if flipped:
        mask[(..., *flip)] = masked if mask[(0,) * len(lead) + flip] == 0 else 0.0
    i, j = np.indices((rows, keys))
    causal_entries = (j <= i + offset) ^ (np.indices((rows, keys)) == np.array(flip or (-1, -1))[:, None, None]).all(0)
    hides = masked == -np.inf or (float32_add and masked <= -(2.0**40)) or not (mask != 0).any()
    want = next((d for d in dict.fromkeys((0, keys - rows)) if np.array_equal(causal_entries, j <= i + d)), None)
    assert causal_offset(mask, rows, keys, float32_add) == (want if hides else None)


def test_input_free_values_are_evaluated_and_input_dependent_ones_are_not():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    y = relax.Var("y", relax.TensorType((n, 4), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            rows = bb.emit(relax.op.expand_dims(relax.op.arange(0, 4, 1, "int64"), 1))
            cols = bb.emit(relax.op.expand_dims(relax.op.arange(0, 4, 1, "int64"), 0))
            keep = bb.emit(relax.op.less_equal(cols, rows))
            mask = bb.emit(relax.op.where(keep, relax.const(0.0, "float32"), relax.const(-np.inf, "float32")))
            dependent = bb.emit(relax.op.add(mask, x))
            symbolic = bb.emit(relax.op.zeros_like(y))
            out = bb.emit_output(relax.op.add(dependent, relax.op.sum(symbolic, axis=[0])))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    np.testing.assert_array_equal(evaluate_input_free(func, mask), _mask(4, 4, 0))
    assert evaluate_input_free(func, dependent) is None
    assert input_free_bindings(func, symbolic) is None  # reads y (and has a symbolic shape)


@pytest.mark.parametrize(
    "kind, masked, causal",
    [
        ("top_left", float("-inf"), "TopLeft"),
        ("bottom_right", float("-inf"), "BottomRight"),
        ("top_left", float(np.finfo("float32").min), "TopLeft"),
        ("window", float("-inf"), None),
    ],
)
def test_an_arange_built_mask_becomes_the_kernels_causal_mask(kind, masked, causal):
    rows, keys = (16, 24) if kind == "bottom_right" else (24, 24)
    q, k, v = torch.randn(2, 2, rows, 16), torch.randn(2, 2, keys, 16), torch.randn(2, 2, keys, 16)
    mod = relax_cutlass.from_torch(CausalAttention(kind, masked), (q, k, v))
    (row,) = attention_rows_after_offload(mod)[0]
    assert row["attention"].get("causal") == causal, row
    assert ("bias" in row["attention"]) == (causal is None), row  # the window stays a mask tensor
    compare_on_cpu(mod, random_inputs(mod))


def test_an_input_free_mask_of_zeros_is_dropped():
    """A mask that hides no key is no mask: the region has neither a bias nor a causal mask (so
    the SM90 kernel, which takes no bias, can run it), and the result is unchanged."""
    q, k, v = (torch.randn(2, 2, 24, 16) for _ in range(3))
    mod = relax_cutlass.from_torch(CausalAttention("none"), (q, k, v))
    (row,) = attention_rows_after_offload(mod)[0]
    assert "bias" not in row["attention"] and "causal" not in row["attention"], row
    compare_on_cpu(mod, random_inputs(mod))


def test_bert_without_an_attention_mask_runs_attention_with_no_mask_tensor():
    """Regression (bert_large in the zoo): transformers' BERT called without an
    attention_mask adds where(arange(S) >= 0, 0, -inf), a mask of zeros, to every layer's scores;
    read as a bias it kept BERT-large on the SM80 kernel (0.29 ms of 2.4 ms) plus a masked-rows
    fix-up kernel per layer."""
    pytest.importorskip("transformers")
    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    model = last_hidden_state(small_transformer("bert"))
    ids = torch.randint(0, 512, (2, 32))
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(ids).numpy()
    mod = relax_cutlass.from_torch(model, (ids,))
    rows, partitioned, rewritten = attention_rows_after_offload(mod)
    assert sum(r["calls"] for r in rows) == 2, rows
    assert all("bias" not in r["attention"] and "causal" not in r["attention"] for r in rows), rows
    serve_regions_on_cpu(partitioned)
    got = run_vm(build_cpu(rewritten), [ids.numpy()])
    assert rel_error(got, expected) < 1e-2


@pytest.mark.parametrize("family, impl", [("gpt2", "eager"), ("llama", "sdpa")])
def test_decoders_attention_runs_causal_with_no_mask_tensor(family, impl):
    """transformers' GPT-2 and Llama (grouped-query, rotary embedding in float32 in transformers
    5.24) at batch 1: each layer's attention is one region with TVM's TopLeft causal mask, and
    the model agrees with torch float64."""
    pytest.importorskip("transformers")
    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    model = last_hidden_state(small_transformer(family, impl))
    ids = torch.randint(0, 512, (1, 64))
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(ids).numpy()
    mod = relax_cutlass.from_torch(model, (ids,))
    rows, partitioned, rewritten = attention_rows_after_offload(mod)
    assert sum(r["calls"] for r in rows) == 2 and all(r["attention"]["causal"] == "TopLeft" for r in rows), rows
    assert all("bias" not in r["attention"] for r in rows)
    assert "R.less_equal" not in rewritten["main"].script()  # the mask's computation is gone
    if family == "llama":  # 4 query heads over 2 kv heads, read through strides: no repeat written
        assert all(r["attention"]["kv_heads"] == 2 for r in rows), rows
        assert "R.broadcast_to" not in rewritten["main"].script()
    serve_regions_on_cpu(partitioned)
    got = run_vm(build_cpu(rewritten), [ids.numpy()])
    assert rel_error(got, expected) < 1e-2


@pytest.mark.parametrize(
    "family, impl, left_padded",
    [("llama", "sdpa", True), ("qwen2", "sdpa", False), ("llama", "eager", True), ("gpt2", "eager", True)],
)
def test_a_padded_decoder_batch_runs_its_causal_mask_in_the_kernel(family, impl, left_padded):
    """transformers' mask of a padded decoder batch is and(causal, attention_mask) in one
    (B, 1, S, T) boolean: the causal part (computed from no input) becomes the kernel's own causal
    mask and the attention_mask a (B, 1, 1, T) bias, instead of a (B, 1, S, T) one; sdpa's -inf
    mask, and eager's finfo.min one once cast to float16 (-inf, and a tail keeping a fully masked
    row's mean). Every row, the left-padded sequence's first queries (no key to see: zeros with
    sdpa's safe softmax, the mean of the values with eager's finite mask) included, as TVM's build
    of the graph computes it."""
    transformers = pytest.importorskip("transformers")
    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    model = last_hidden_state(small_transformer("gpt2" if family == "gpt2" else "llama", impl, layers=1))
    if family == "qwen2":
        config = transformers.Qwen2Config(
            hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=1, vocab_size=512, attn_implementation="sdpa",
        )  # fmt: skip
        model = last_hidden_state(transformers.Qwen2Model(config).eval())
    ids = torch.randint(0, 512, (2, 48))
    mask = torch.ones(2, 48, dtype=torch.int64)
    if left_padded:
        mask[1, :17] = 0
    else:
        mask[1, 31:] = 0
    mod = relax_cutlass.from_torch(model, (ids, mask))
    rows, partitioned, rewritten = attention_rows_after_offload(mod)
    assert sum(r["calls"] for r in rows) == 1, rows
    for row in rows:
        assert row["attention"]["bias"] == "B11T" and row["attention"]["causal"] == "TopLeft", row
        assert row["attention"]["masked_rows"] == ("zero" if impl == "sdpa" else "mean"), row
        assert family == "gpt2" or row["attention"]["kv_heads"] == 2, row
    serve_regions_on_cpu(partitioned)
    inputs = [ids.numpy(), mask.numpy()]
    got, own = run_vm(build_cpu(rewritten), inputs), run_vm(build_cpu(mod), inputs)
    assert np.isfinite(got).all() and rel_error(got, own) < 1e-3
