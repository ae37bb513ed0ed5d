"""Grouped-query attention: keys and values with fewer heads than the queries, repeated across the
query heads as transformers' `repeat_kv` writes it (expand_dims, broadcast_to, reshape). The repeat
is part of the attention region and the kernels read each kv head for its whole group through
strides: it is never written."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import relax_cutlass
from relax_cutlass.kinds.attention.records import AttentionProblem, attention_key
from relax_cutlass.kinds.attention.reference import attention_reference, problem
from relax_cutlass.testing.attention import attention_rows_after_offload, check_regions_against_kernel_model
from relax_cutlass.testing.harness import compare_on_cpu, op_names, random_inputs

torch = pytest.importorskip("torch")

# isort: split
from relax_cutlass.testing.models.torch_attention import CausalAttention, MultiQueryAttention  # noqa: E402


@pytest.mark.parametrize("kind, batch, group", [("top_left", 1, 2), ("none", 2, 4), ("top_left", 2, 4)])
def test_grouped_keys_and_values_are_read_through_strides(kind, batch, group):
    heads, rows, h = 8, 24, 16
    q = torch.randn(batch, heads, rows, h)
    k, v = torch.randn(batch, heads // group, rows, h), torch.randn(batch, heads // group, rows, h)
    mod = relax_cutlass.from_torch(CausalAttention(kind, group=group), (q, k, v))
    (row,), partitioned, rewritten = attention_rows_after_offload(mod)
    assert row["attention"]["heads"] == heads and row["attention"]["kv_heads"] == heads // group, row
    assert row["composite"] == "relax_cutlass.attention_softmax_gqa", row
    assert "relax.broadcast_to" not in op_names(rewritten)  # no repeat left for TVM to write
    compare_on_cpu(mod, random_inputs(mod))
    # the kernel's reads (kv heads through their own stride, one per group) give the region's values
    assert check_regions_against_kernel_model(partitioned) == 1


def test_a_repeat_of_all_heads_is_left_to_tvm_and_the_rest_fused():
    """torch's repeat (query head n reads kv head n % N_kv) is no grouped-query layout the kernels
    read: the repeat stays in TVM, the attention is still one region, and the result is right."""
    q, k, v = torch.randn(1, 8, 24, 16), torch.randn(1, 2, 24, 16), torch.randn(1, 2, 24, 16)
    mod = relax_cutlass.from_torch(CausalAttention("top_left", group=4, tile=True), (q, k, v))
    (row,), _, _ = attention_rows_after_offload(mod)
    assert "kv_heads" not in row["attention"] and row["composite"] == "relax_cutlass.attention_softmax", row
    compare_on_cpu(mod, random_inputs(mod))


def test_grouped_problems_have_their_own_tuning_key_and_kernel():
    mha = AttentionProblem(1, 32, 2048, 2048, 128, 128, 0.088, causal="TopLeft")
    gqa = dataclasses.replace(mha, kv_group=4)
    assert attention_key(mha, 90, 90) != attention_key(gqa, 90, 90)
    assert gqa.kv_heads == 8 and gqa.flops() == mha.flops()
    from relax_cutlass.kinds.attention.select import choose_attention_kernel

    assert choose_attention_kernel(gqa, 90).name.endswith("_causal_tl_gqa")
    assert choose_attention_kernel(gqa, 80).name == choose_attention_kernel(mha, 80).name  # run-time group


def test_profiling_reference_repeats_the_kv_heads():
    class Fake:
        @staticmethod
        def tensor(x, _dev):
            return x

    class FakeTvm:
        runtime = Fake

    job = {"attention": [2, 20, 20, 8, 16, 16], "kv_group": 4, "dtype": "float32", "scale": 0.25, "causal": 1}
    out_shape, (index, want), _call = problem(job, np.random.default_rng(0), FakeTvm, None)
    assert out_shape == (2, 20, 8, 16)
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(2, 20, 8, 16)), rng.normal(size=(2, 20, 2, 16)), rng.normal(size=(2, 20, 2, 16))
    rows = np.arange(20)
    grouped = attention_reference(q, k, v, 0.25, 1, rows)
    repeated = attention_reference(q, np.repeat(k, 4, axis=2), np.repeat(v, 4, axis=2), 0.25, 1, rows)
    np.testing.assert_allclose(grouped, repeated, rtol=1e-6)
    assert want.shape == (2, len(index[1]), 8, 16)


@pytest.mark.parametrize("form, batch", [("causal", 1), ("causal", 2), ("padding", 2), ("expand", 3)])
def test_multi_query_attention_reads_its_one_kv_head_for_every_query_head(form, batch):
    """Falcon's multi-query attention (one kv head broadcast to all query heads) stayed in TVM:
    the broadcast was refused as a repeat of data (the zoo's falcon_mq). It is grouped-
    query attention with G = N: one region, the kv head read for every query head, never written."""
    heads, rows, h = 4, 24, 16
    q = torch.randn(batch, heads, rows, h)
    k, v = torch.randn(batch, 1, rows, h), torch.randn(batch, 1, rows, h)
    keep = torch.ones(batch, rows, dtype=torch.bool)
    keep[-1, rows // 2 :] = False
    mod = relax_cutlass.from_torch(MultiQueryAttention(form), (q, k, v, keep))
    (row,), partitioned, rewritten = attention_rows_after_offload(mod)
    assert row["attention"]["heads"] == heads and row["attention"]["kv_heads"] == 1, row
    assert "relax.broadcast_to" not in op_names(rewritten)  # the repeat is read, not written
    compare_on_cpu(mod, random_inputs(mod))
    assert check_regions_against_kernel_model(partitioned) == 1
