"""Parallel q/k/v projections of one input fused into one GEMM (FuseParallelProjections, CPU).

BERT-large's q, k, v and output projections (1024 x 1024 x 1024 at 8 x 128 tokens) have 64 output
tiles each on a 132-SM H200, about 230 TFLOP/s; q|k|v as one GEMM of N = 3072 has 192. The rewrite
concatenates the weights (and biases) at rewrite time and gives each projection as a strided_slice
of the fused result's last axis, the form the packed attention pattern reads in place. Checked
here: the rewrite is exact, it fuses only projections that feed attention heads (a gated MLP and
misaligned parts are left alone), and whole models offload to the same values."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.rewrites.projections import fuse_parallel_projections
from relax_cutlass.testing.attention import check_regions_against_kernel_model
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import (
    build_cpu,
    offload_for_cpu,
    offload_pipeline_on_cpu,
    op_names,
    run_vm,
    small_transformer,
)
from relax_cutlass.transform import FuseParallelProjections


def _const(rng, shape, dtype):
    return relax.const(rng.standard_normal(shape).astype(dtype), dtype)


def _heads_module(parts, bias="after", dtype="float32", head_dim=16, seq=None, extra_use=False) -> tvm.IRModule:
    """x (2, S, 64) -> for each N in `parts`: matmul(x, W) [+ b] -> reshape (2, S, N / head_dim,
    head_dim) -> permute to (2, heads, S, head_dim); `bias`: "after" (y + b), "before" (b + y),
    None, or "mixed" (the first part only). `extra_use`: the first projection is also returned."""
    rng = np.random.default_rng(0)
    s = seq if seq is not None else tvm.tirx.Var("s", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, s, 64), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for i, n in enumerate(parts):
                y = bb.emit(relax.op.matmul(x, _const(rng, (64, n), dtype)))
                if bias == "after" or (bias == "mixed" and i == 0):
                    y = bb.emit(relax.op.add(y, _const(rng, (n,), dtype)))
                elif bias == "before":
                    y = bb.emit(relax.op.add(_const(rng, (n,), dtype), y))
                if extra_use and i == 0:
                    outs.append(y)
                heads = bb.emit(relax.op.reshape(y, (2, s, n // head_dim, head_dim)))
                outs.append(bb.emit(relax.op.permute_dims(heads, [0, 2, 1, 3])))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> list[np.ndarray]:
    return [t.numpy() for t in build_cpu(mod)["main"](tvm.runtime.tensor(x))]


def _calls(mod: tvm.IRModule, op: str) -> list[relax.Call]:
    """The calls of `op` in main, in post order."""
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == op:
            found.append(e)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


def _slices(mod: tvm.IRModule) -> list[tuple]:
    """(source, axes, begin, end) of each strided_slice in main, in order."""
    return [(c.args[0], *([int(v) for v in a.fields] for a in c.args[1:4])) for c in _calls(mod, "relax.strided_slice")]


@pytest.mark.parametrize(
    "parts, bias, dtype",
    [
        ((64, 64, 64), "after", "float32"),  # BERT: q, k, v with biases
        ((64, 32, 32), None, "float32"),  # Llama: 4 query heads over 2 kv heads, no bias
        ((64, 32, 32), "before", "float16"),  # the bias as the add's first operand
    ],
)
def test_parallel_head_projections_become_one_gemm_and_slices(parts, bias, dtype):
    """Three projections of one x (a symbolic sequence length) -> one matmul on the concatenated
    weights [+ one add of the concatenated biases] and one strided_slice of its last axis per part,
    at the part's offset; the values are the original's."""
    mod = _heads_module(parts, bias=bias, dtype=dtype)
    fused = FuseParallelProjections()(mod)
    ops = op_names(fused)
    assert ops.count("relax.matmul") == 1 and ops.count("relax.add") == (1 if bias else 0)
    (matmul,) = _calls(fused, "relax.matmul")
    assert [int(d) for d in matmul.args[1].ty.shape.values] == [64, sum(parts)]
    slices = _slices(fused)
    bounds = np.cumsum([0, *parts]).tolist()
    assert [s[1:] for s in slices] == [([2], [lo], [hi]) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    assert len({s[0] for s in slices}) == 1  # all parts of one projection
    x = np.random.default_rng(1).uniform(-1, 1, (2, 7, 64)).astype(dtype)
    for got, want in zip(_run(fused, x), _run(mod, x), strict=True):
        assert got.shape == want.shape and rel_error(got, want) < (1e-6 if dtype == "float32" else 1e-3)


def test_a_gated_mlp_is_left_alone():
    """silu(x W_gate) * (x W_up): two projections of one x that feed no attention heads (the gated
    MLP is its own fused region)."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gate = bb.emit(relax.op.matmul(x, _const(rng, (64, 128), "float16")))
            up = bb.emit(relax.op.matmul(x, _const(rng, (64, 128), "float16")))
            out = bb.emit_output(relax.op.multiply(bb.emit(relax.op.nn.silu(gate)), up))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(FuseParallelProjections()(mod), mod)


@pytest.mark.parametrize(
    "case",
    [
        {"parts": (60, 60, 60), "head_dim": 12},  # parts not multiples of 8 elements
        {"parts": (64, 64, 64), "bias": "mixed"},  # a bias on some projections only
        {"parts": (64,)},  # one projection: nothing to fuse
        {"parts": (64, 64), "extra_use": True},  # a projection also read elsewhere
    ],
)
def test_groups_the_rewrite_does_not_take_are_left_unchanged(case):
    mod = _heads_module(**case)
    tvm.ir.assert_structural_equal(fuse_parallel_projections(mod["main"]), mod["main"])


def test_only_the_projections_that_feed_heads_fuse():
    """q, k, v heads and a fourth projection of the same x used whole: the three fuse, the fourth
    keeps its own GEMM."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for _ in range(3):
                y = bb.emit(relax.op.matmul(x, _const(rng, (64, 64), "float32")))
                outs.append(bb.emit(relax.op.reshape(y, (2, 16, 4, 16))))
            outs.append(bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(x, _const(rng, (64, 64), "float32"))))))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    fused = FuseParallelProjections()(mod)
    assert op_names(fused).count("relax.matmul") == 2 and len(_slices(fused)) == 3
    x = np.random.default_rng(1).uniform(-1, 1, (2, 16, 64)).astype("float32")
    for got, want in zip(_run(fused, x), _run(mod, x), strict=True):
        assert rel_error(got, want) < 1e-6


def _offloaded_transformer(family: str, layers: int = 2):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    model = last_hidden_state(small_transformer(family, layers=layers))
    ids = torch.randint(0, 512, (2, 16))
    mod = relax_cutlass.from_torch(model, (ids,))
    offloaded = offload_pipeline_on_cpu(mod, "sm_90a", profile="never")
    want, got = run_vm(build_cpu(mod), [ids.numpy()]), run_vm(build_cpu(offloaded), [ids.numpy()])
    assert got.shape == want.shape and rel_error(got, want) < 1e-2
    return relax_cutlass.offload_report(offloaded)


def test_bert_projects_q_k_v_with_one_gemm_read_in_place_by_the_attention():
    """The small BERT (hidden 128, 2 layers): per layer one GEMM of N = 3 x 128 instead of three
    of N = 128 (left: the output projection), and the attention reads q, k and v in place out of
    it; the offloaded model computes the un-offloaded one's values."""
    report = _offloaded_transformer("bert")
    gemms = [r for r in report.offloaded if r["op"] == "matmul"]
    calls = {n: sum(r["calls"] for r in gemms if r["mnk"][1:] == [n, 128]) for n in (128, 384)}
    assert calls == {128: 2, 384: 2}
    (attention,) = [r for r in report.offloaded if r["op"] == "attention"]
    assert attention["composite"] == "relax_cutlass.attention_softmax_packed" and attention["calls"] == 2
    assert attention["attention"]["packed"] == {"query": [2, 0, 384], "key": [2, 128, 384], "value": [2, 256, 384]}
    assert not report.left_in_tvm


def test_llama_fuses_its_grouped_projections_and_not_its_gated_mlp():
    """Llama's q (4 heads) and k, v (2 kv heads each): one GEMM of N = 128 + 64 + 64; the gated
    MLP's gate and up projections keep their own GEMMs (the gate's epilogue multiplies by up)."""
    report = _offloaded_transformer("llama")
    gemms = [r for r in report.offloaded if r["op"] == "matmul"]
    by_epilogue = {}
    for r in gemms:
        by_epilogue.setdefault((r["epilogue"], *r["mnk"][1:]), 0)
        by_epilogue[(r["epilogue"], *r["mnk"][1:])] += r["calls"]
    # per layer: q|k|v (none, 256, 128) and up (none, 256, 128); gate with up in its epilogue
    assert by_epilogue[("none", 256, 128)] == 4 and by_epilogue[("silu+residual_mul", 256, 128)] == 2
    assert all(r["mnk"][1] != 64 for r in gemms)  # no k or v projection of its own


def test_llama_attention_reads_its_value_in_place():
    """Llama's q and k are computed (rotary) from their parts of the q|k|v GEMM, so TVM writes
    them, but v reaches the attention through views only: the attention reads it in place (before,
    TVM wrote a transposed copy per layer), and the offloaded model computes the same values."""
    report = _offloaded_transformer("llama")
    (attention,) = [r for r in report.offloaded if r["op"] == "attention"]
    assert attention["composite"] == "relax_cutlass.attention_softmax_gqa_packed_v" and attention["calls"] == 2
    assert attention["attention"]["packed"] == {"value": [2, 192, 256]}, attention["attention"]
    # the kernel's read of v (an offset and the projection's row stride) gives the region's values
    torch = pytest.importorskip("torch")
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    model = last_hidden_state(small_transformer("llama", layers=1))
    partitioned, _ = offload_for_cpu(relax_cutlass.from_torch(model, (torch.randint(0, 512, (2, 16)),)))
    assert check_regions_against_kernel_model(partitioned) == 1


@pytest.mark.parametrize(
    "family, packed",
    [("gpt_neox", {"value": [3, 64, 96]}), ("phi", {"value": [2, 256, 384]}), ("qwen2", {"value": [2, 192, 256]})],
)
def test_rotary_families_read_their_value_in_place(family, packed):
    """GPT-NeoX (its per-head q|k|v split on the last of (B, S, N, 3H)), Phi and Qwen2 as
    scripts/hf_sweep.py builds them: v read in place, and the kernel's reads of it give the
    region's values."""

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from relax_cutlass.testing.models.torch_transformers import TINY_VOCAB, tiny_model

    torch.manual_seed(0)
    mod = relax_cutlass.from_torch(tiny_model(family, torch, transformers), (torch.randint(3, TINY_VOCAB, (1, 16)),))
    partitioned, rewritten = offload_for_cpu(mod)
    rows = [r for r in relax_cutlass.offload_report(rewritten).offloaded if r["op"] == "attention"]
    assert sum(r["calls"] for r in rows) == 2, rows  # both layers
    assert all(r["composite"].endswith("_packed_v") and r["attention"]["packed"] == packed for r in rows), rows
    assert check_regions_against_kernel_model(partitioned) == len(rows)


def test_gpt2_keeps_its_packed_projection():
    """GPT-2's c_attn is one projection already: unchanged, read in place as before."""
    report = _offloaded_transformer("gpt2")
    (attention,) = [r for r in report.offloaded if r["op"] == "attention"]
    assert attention["composite"] == "relax_cutlass.attention_softmax_packed"
    assert sum(r["calls"] for r in report.offloaded if r["op"] == "matmul" and r["mnk"][1] == 384) == 2
