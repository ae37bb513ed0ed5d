"""Transformers run on a padded batch, as users batch them: token ids and an attention mask with
padding, through from_torch and the offload passes (regions served by their llvm-built composites)
against torch float64 on the real tokens.

GPT-2 with transformers' default sdpa attention at any batch > 1 (a padded batch included) fails in
torch's decompositions (a view of the attention output that fake tensors lay out transposed);
from_torch imports it with transformers' eager attention instead and says so."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import relax_cutlass
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import build_cpu, offload_for_cpu, run_vm, serve_regions_on_cpu, small_transformer
from relax_cutlass.testing.models.torch_transformers import last_hidden_state

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

FAMILIES = ("bert", "gpt2", "llama")
# attention fused: Llama's since its float32 rotary embedding's q and k are rounded before the
# views (cast_attention_operands; transformers 5.24 applies the embedding in float32)
FUSED = {"bert", "gpt2", "llama"}


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_padded_batch_imports_offloads_and_matches_torch(family, impl):
    torch.manual_seed(0)
    model = last_hidden_state(small_transformer(family, impl))
    ids = torch.randint(0, 512, (2, 64))
    mask = torch.ones(2, 64, dtype=torch.int64)
    mask[1, 44:] = 0  # the second sequence is 44 tokens, padded to 64
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(ids, mask).numpy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = relax_cutlass.from_torch(model, (ids, mask))
    retried = [w for w in caught if "eager attention instead" in str(w.message)]
    assert bool(retried) == (family == "gpt2" and impl == "sdpa"), [str(w.message) for w in caught]
    partitioned, rewritten = offload_for_cpu(mod)
    serve_regions_on_cpu(partitioned)
    got = run_vm(build_cpu(rewritten), [ids.numpy(), mask.numpy()])
    real = mask.numpy().astype(bool)
    assert np.isfinite(got[real]).all()
    assert rel_error(got[real], expected[real]) < 1e-2
    kinds = {row["op"] for row in relax_cutlass.offload_report(rewritten).offloaded}
    assert "matmul" in kinds and ("attention" in kinds) == (family in FUSED), kinds


@pytest.mark.parametrize("family", [f if f != "gpt2" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_a_bfloat16_padded_batch_fuses_its_attention(family):
    """Regression (every attention of a padded bfloat16 model stayed in TVM: the eager mask's
    finfo(float32).min is not exact in bfloat16): the mask becomes a finite, still swamping bfloat16
    one, and the attention runs in the kernel. Decoders are padded on the left, so their first
    queries see no key at all (every score masked: the mean of the values, in the graph and in
    the kernel alike): every row, padding included, matches TVM's own build."""
    torch.manual_seed(0)
    model = last_hidden_state(small_transformer(family, "eager"))
    ids = torch.randint(0, 512, (2, 64))
    mask = torch.ones(2, 64, dtype=torch.int64)
    if family == "bert":
        mask[1, 44:] = 0
    else:
        mask[1, :20] = 0
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(ids, mask).numpy()
    mod = relax_cutlass.from_torch(model, (ids, mask), dtype="bfloat16")
    partitioned, rewritten = offload_for_cpu(mod)
    kinds = {row["op"] for row in relax_cutlass.offload_report(rewritten).offloaded}
    assert "attention" in kinds, kinds
    serve_regions_on_cpu(partitioned)
    inputs = [ids.numpy(), mask.numpy()]
    got, own = run_vm(build_cpu(rewritten), inputs), run_vm(build_cpu(mod), inputs)
    real = mask.numpy().astype(bool)
    # the regions (served by their composites, summing in float32 as the kernels do) compute what
    # TVM's build computes: a padding row gone wrong (zeros or NaN for the mean) would be O(1) off
    assert np.isfinite(got).all()
    assert rel_error(got[real], own[real]) < 1e-3 and rel_error(got[~real], own[~real]) < 1e-3
    if family == "bert":  # (a float64 copy of the left-padded Llama gives NaN rows in torch itself)
        assert rel_error(got[real], expected[real]) < 1e-2


def test_an_unexportable_model_gets_an_error_that_says_what_to_do():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x  # control flow on a value: torch.export cannot trace it

    with pytest.raises(RuntimeError, match=r"torch.export of DataDependent failed .*make the model exportable"):
        relax_cutlass.from_torch(DataDependent(), (torch.randn(4, 8),))


def test_gpt2_with_sdpa_imports_at_any_batch():
    """Not only with a mask: any batch > 1 hits the same decomposition failure (the zoo's GPT-2 ran
    at batch 1, which does not)."""
    torch.manual_seed(0)
    model = last_hidden_state(small_transformer("gpt2", "sdpa"))
    ids = torch.randint(0, 512, (2, 64))
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(ids).numpy()
    with pytest.warns(UserWarning, match="eager attention instead"):
        mod = relax_cutlass.from_torch(model, (ids,))
    assert rel_error(run_vm(build_cpu(mod), [ids.numpy()]), expected) < 1e-2


def test_gpt2_padded_batch_with_a_symbolic_length_fuses_its_attention():
    """Regression: GPT-2 at batch > 1 imports with transformers' eager attention,
    whose float32 finfo.min mask is cast to -inf with a safe-softmax tail of 1/T for the rows it
    masks entirely; with a symbolic length T that tail had no constant, so the attention stayed
    in TVM. The tail is now the softmax of a row of zeros, read as the kernel's "mean" rows.
    Left padding masks whole rows (a padded query sees only padded keys): every row is checked,
    at the exported length and another one."""
    torch.manual_seed(0)
    model = last_hidden_state(small_transformer("gpt2", "eager"))

    def batch(n):
        ids = torch.randint(0, 512, (2, n))
        mask = torch.ones(2, n, dtype=torch.int64)
        mask[1, : n // 3] = 0  # left padding
        return ids, mask

    seq = torch.export.Dim("seq", min=2, max=128)
    mod = relax_cutlass.from_torch(model, batch(48), dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    partitioned, rewritten = offload_for_cpu(mod)
    rows = relax_cutlass.offload_report(rewritten).offloaded
    attention = [r for r in rows if r["op"] == "attention"]
    assert sum(r.get("calls", 1) for r in attention) == 2, attention
    assert all(r["attention"]["masked_rows"] == "mean" for r in attention), attention
    serve_regions_on_cpu(partitioned)
    vm = build_cpu(rewritten)
    for n in (48, 29):
        ids, mask = batch(n)
        with torch.no_grad():
            expected = copy.deepcopy(model).double()(ids, mask).numpy()
        got = run_vm(vm, [ids.numpy(), mask.numpy()])
        assert np.isfinite(got).all() and rel_error(got, expected) < 1e-2, n


def test_the_safe_softmax_fills_become_scalars_with_the_weights_hidden():
    """scalar_where_fills reads only the where-fills' constants, so it runs with every other weight
    standing in as a Var (import cost): the zeros tensors of torch's safe softmax still become
    scalars, and the weights come back as the same constants."""
    import tvm
    from tvm import relax

    from relax_cutlass.kinds.attention.masks import scalar_where_fills
    from relax_cutlass.kinds.ir import bound_value

    mod = relax_cutlass.from_torch(small_transformer("llama"), (torch.randint(0, 512, (2, 16)),))

    def tensor_fills_and_constants(func):
        var2val, fills, constants = relax.analysis.get_var2val(func), [], []

        def visit(expr):
            if isinstance(expr, tvm.ir.GenericConst):
                constants.append(expr)
            if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.where":
                fill = bound_value(expr.args[1], var2val)
                if isinstance(fill, tvm.ir.GenericConst) and len(fill.value.shape) > 0:
                    fills.append(fill)

        relax.analysis.post_order_visit(func.body, visit)
        return fills, constants

    before, weights = tensor_fills_and_constants(mod["main"])
    after, kept = tensor_fills_and_constants(scalar_where_fills(mod["main"]))
    assert len(before) == 2 and not after
    big = [w for w in weights if np.prod(w.value.shape) > 1 and not any(w.same_as(f) for f in before)]
    assert big and all(any(w.same_as(k) for k in kept) for w in big)
