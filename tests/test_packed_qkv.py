"""q, k and v out of one packed projection, read in place by the attention kernel (CPU).

GPT-2 splits its (B, S, 3E) c_attn output; torch's nn.MultiheadAttention (torchvision's ViT)
unflattens its in-projection to (3, S, B, E) and takes each part. TVM wrote each of those as a
copy (ViT-B/16 at batch 8 spent 0.46 of its 1.70 ms on the H200 in them);
`packed_projection_slices` writes them as strided slices of the projection, which the attention
region takes in: one parameter in the query, key and value roles, each read from its own offset.
Checked here: the rewrite (exact, and only for true slices), the region's problem record against
the numpy model of the kernel, the whole model against the un-offloaded one, and the emitted glue
through the host compiler."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.attention.packed import packed_projection_slices
from relax_cutlass.stages.emit import emit_glue
from relax_cutlass.testing.attention import attention_regions, check_regions_against_kernel_model
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import (
    build_cpu,
    offload_pipeline_on_cpu,
    op_names,
    partition_for_cpu,
    run_vm,
    small_transformer,
)

torch = pytest.importorskip("torch")


def _vit():
    from relax_cutlass.testing.models.torch_models import vit

    return vit(image=32, patch=16, hidden=128, layers=2, heads=2), (torch.randn(2, 3, 32, 32),)


def _gpt2():
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    return last_hidden_state(small_transformer("gpt2", "eager", layers=2)), (torch.randint(0, 128, (2, 16)),)


@pytest.mark.parametrize("model", [_vit, _gpt2], ids=["vit_multihead_attention", "gpt2_split"])
def test_packed_projection_is_read_in_place(model):
    torch.manual_seed(0)
    module, example = model()
    mod = relax_cutlass.from_torch(module, example)
    partitioned = partition_for_cpu(mod, "sm_90a")
    regions = attention_regions(partitioned)
    assert regions
    for region in regions:
        problem = region.kernel.problem
        # one parameter in three roles, each part starting where its E columns do
        assert region.arg_roles.count("query") == 1 and {a for a, _ in region.role_aliases} == {"key", "value"}
        hidden = problem.heads * problem.head_dim
        assert [(role, first) for role, _, first, _ in problem.slices] == [
            ("query", 0),
            ("key", hidden),
            ("value", 2 * hidden),
        ]
        glue = emit_glue([region], "m").text
        assert "const DLTensor* key = query;" in glue
        assert f"static_cast<const char*>(Data(key)) + {hidden} * PackedStride(key, " in glue
    # nothing is left of the splits, unflattens and takes between the projection and the
    # attention: every part went into a region as a slice (the takes left are embeddings' and
    # ViT's class token's)
    main_ops = op_names(partitioned)
    assert not {"relax.split", "relax.strided_slice", "relax.squeeze"} & set(main_ops), main_ops
    assert main_ops.count("relax.take") == op_names(mod).count("relax.take") - (6 if model is _vit else 0)
    assert check_regions_against_kernel_model(partitioned) == len(regions)
    offloaded = offload_pipeline_on_cpu(mod, "sm_90a", profile="never")
    rows = [r for r in relax_cutlass.offload_report(offloaded).offloaded if r["op"] == "attention"]
    assert sum(r.get("calls", 1) for r in rows) == 2  # both layers
    assert all(set(r["attention"]["packed"]) == {"query", "key", "value"} for r in rows), rows
    inputs = [x.numpy() for x in example]
    want, got = run_vm(build_cpu(mod), inputs), run_vm(build_cpu(offloaded), inputs)
    assert rel_error(got, want) < 1e-2
    with torch.no_grad():
        expected = module(*example)
    expected = (expected[0] if isinstance(expected, tuple) else expected).numpy()
    assert rel_error(got, expected) < 2e-2


def _packed_take(order: tuple[int, int]) -> tvm.IRModule:
    """take(views(P), 1, axis 0) of a (S, B, 3E) projection P unflattened as (3, E) (order
    (3, E): a slice of P's last axis) or as (E, 3) (interleaved columns: no slice)."""
    s, b, e = 5, 2, 16
    p = relax.Var("p", relax.TensorType((s, b, 3 * e), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [p]):
        with bb.dataflow():
            split = (3, e) if order == (3, 16) else (e, 3)
            x = bb.emit(relax.op.reshape(p, (s, b, *split)))
            x = bb.emit(relax.op.expand_dims(x, 0))
            axes = [3, 1, 2, 0, 4] if order == (3, 16) else [4, 1, 2, 0, 3]
            x = bb.emit(relax.op.squeeze(bb.emit(relax.op.permute_dims(x, axes)), [3]))
            out = bb.emit_output(relax.op.take(x, relax.const(1, "int64"), axis=0))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("order", [(3, 16), (16, 3)])
def test_a_take_becomes_a_slice_only_where_it_is_one(order):
    mod = _packed_take(order)
    rewritten = tvm.IRModule({"main": packed_projection_slices(mod["main"])})
    assert ("relax.strided_slice" in op_names(rewritten)) == (order == (3, 16))
    x = np.random.default_rng(0).uniform(-1, 1, (5, 2, 48)).astype("float16")
    np.testing.assert_array_equal(run_vm(build_cpu(rewritten), [x]), run_vm(build_cpu(mod), [x]))


def test_a_part_off_a_16_byte_boundary_is_copied_with_the_reason():
    """Parts of 12 columns (head dim 4, 3 heads) start at elements 12 and 24 of the rows: the
    kernels' 16-byte vector loads cannot read the key (24 bytes in) in place, so the packed region
    is refused (the report says why) and the value-only one fuses the attention, q and k from
    TVM's copies, v (48 bytes in) in place."""
    s, b, n, h = 8, 2, 3, 4
    p = relax.Var("p", relax.TensorType((b, s, 3 * n * h), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [p]):
        with bb.dataflow():
            parts = []
            for i in range(3):
                x = bb.emit(relax.op.strided_slice(p, axes=[2], begin=[i * n * h], end=[(i + 1) * n * h]))
                x = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, (b, s, n, h))), [0, 2, 1, 3]))
                parts.append(x)
            q, k, v = parts
            scores = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
            probs = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.multiply(scores, relax.const(0.5, "float16")))))
            out = bb.emit_output(bb.emit(relax.op.permute_dims(bb.emit(relax.op.matmul(probs, v)), [0, 2, 1, 3])))
        bb.emit_func_output(out)
    report = relax_cutlass.offload_report(partition_for_cpu(bb.get(), "sm_90a"))
    text = str(report)
    assert "attention_softmax_packed refused (the key starts at element 12 of its packed projection's rows" in text
    # the value, at element 24 (48 bytes), is still read in place; q and k from TVM's copies
    (row,) = [r for r in report.offloaded if r["op"] == "attention"]
    assert row["composite"] == "relax_cutlass.attention_softmax_packed_v", text
    assert row["attention"]["packed"] == {"value": [2, 24, 36]}, row


@pytest.mark.nvcc
def test_packed_glue_compiles():
    """The glue of a packed region (aliases, offsets) through the host compiler."""
    from relax_cutlass.toolkit.compile import compile_all

    torch.manual_seed(0)
    module, example = _gpt2()
    partitioned = partition_for_cpu(relax_cutlass.from_torch(module, example), "sm_90a")
    compile_all([emit_glue(attention_regions(partitioned), "packed")], 90)


class _PackedHeads(torch.nn.Module):
    """One projection to q|k|v, parts picked as torchvision's Swin does ((B, S, 3, N, H) permuted to
    (3, B, N, S, H), part i taken) or as BLOOM does (per head: (B, S, N, 3, H), part i of axis 3)."""

    def __init__(self, form: str, hidden: int = 64, heads: int = 2):
        super().__init__()
        self.form, self.heads = form, heads
        self.qkv, self.out = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, e = x.shape
        n, h = self.heads, e // self.heads
        if self.form == "swin":
            qkv = self.qkv(x).reshape(b, s, 3, n, h).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
        else:
            fused = self.qkv(x).view(b, s, n, 3, h)
            q, k, v = (fused[..., i, :].transpose(1, 2) for i in range(3))
        probs = torch.softmax((q * h**-0.5) @ k.transpose(-2, -1), dim=-1)
        return self.out((probs @ v).transpose(1, 2).reshape(b, s, e))


@pytest.mark.parametrize("form", ["swin", "bloom"])
def test_parts_of_permuted_or_per_head_packings_are_read_in_place(form):
    """Regression (the zoo's swin_t and bloom_4l, H200: each part a take kernel of its own): the
    takes become views of slices (BLOOM's of the projection's rows cut per head), the attention
    reads all three from the one projection, no take is left; values as the original's."""
    torch.manual_seed(0)
    module, x = _PackedHeads(form).eval(), torch.randn(2, 16, 64)
    mod = relax_cutlass.from_torch(module, (x,))
    assert op_names(mod).count("relax.take") == 3
    offloaded = offload_pipeline_on_cpu(mod, "sm_90a", profile="never")
    assert "relax.take" not in op_names(offloaded)
    (row,) = [r for r in relax_cutlass.offload_report(offloaded).offloaded if r["op"] == "attention"]
    assert set(row["attention"]["packed"]) == {"query", "key", "value"}, row
    want, got = run_vm(build_cpu(mod), [x.numpy()]), run_vm(build_cpu(offloaded), [x.numpy()])
    assert rel_error(got, want) < 1e-2
