"""The rewritten module computes what the original computes (CPU; kernels served by composites)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import relax_cutlass
from relax_cutlass.kinds.epilogue_patterns import FUSED_ACTIVATIONS
from relax_cutlass.prepare import bind_weights
from relax_cutlass.testing.harness import compare_on_cpu, random_inputs
from relax_cutlass.testing.models import bert_encoder_layer, dense_epilogue_model, random_weights


@pytest.mark.parametrize("activation", ["identity", *FUSED_ACTIVATIONS, "gelu_decomposed", "gelu_tanh_decomposed"])
@pytest.mark.parametrize("residual", [False, True])
def test_every_epilogue_matches_the_original(activation, residual):
    mod = dense_epilogue_model(48, 32, 16, activation=activation, residual=residual)
    mod = bind_weights(mod, random_weights(mod))
    compare_on_cpu(mod, random_inputs(mod))


def test_symbolic_batch_and_cast():
    mod = dense_epilogue_model("m", 32, 16, activation="silu", out_cast="float32", batch=(3,))
    for m in (1, 17):
        compare_on_cpu(mod, random_inputs(mod, m=m))


def test_small_bert_layer_matches():
    mod = bert_encoder_layer(batch=2, seq=8, hidden=64, ffn=128, heads=4)
    mod = bind_weights(mod, random_weights(mod))
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod))
    ops = [r["op"] for r in relax_cutlass.offload_report(rewritten).offloaded]
    # six dense layers (q, k and v as one: FuseParallelProjections), the attention block and the
    # two residual add + layer norms (the norm kind)
    assert len(ops) == 7 and ops.count("attention") == 1 and ops.count("norm") == 2


EPILOGUE = st.fixed_dictionaries(
    {
        "bias": st.booleans(),
        "activation": st.sampled_from(["identity", *FUSED_ACTIVATIONS, "gelu_decomposed", "gelu_tanh_decomposed"]),
        "residual": st.booleans(),
        "residual_relu": st.booleans(),
        "transposed": st.booleans(),
        "out_cast": st.sampled_from([None, "float32"]),
    }
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    epilogue=EPILOGUE,
    m=st.one_of(st.integers(1, 70), st.just("m")),
    n=st.integers(1, 40),
    k=st.integers(1, 40),
    bind=st.booleans(),
)
def test_random_gemm_epilogues(epilogue, m, n, k, bind):
    """Any shape (aligned or not, symbolic or not), any epilogue combination: the rewrite is exact
    and every offloaded region satisfies the legality rules."""
    epilogue = dict(epilogue)
    if not epilogue["residual"]:
        epilogue["residual_relu"] = False
    mod = dense_epilogue_model(m, n, k, **epilogue)
    if bind:
        mod = bind_weights(mod, random_weights(mod))
    expected, got, rewritten = compare_on_cpu(mod, random_inputs(mod, m=5))
    report = relax_cutlass.offload_report(rewritten)
    legal = n % 2 == 0 and k % 2 == 0
    assert bool(report.offloaded) == legal
    for row in report.offloaded:
        assert row["mnk"][1] % 2 == 0 and row["mnk"][2] % 2 == 0
    if not legal:
        assert any("even" in r for row in report.left_in_tvm for r in row["reasons"])


@pytest.mark.parametrize("residual", [False, True])
def test_bfloat16_regions_match(residual):
    mod = dense_epilogue_model("m", 32, 16, activation="gelu", residual=residual, dtype="bfloat16")
    mod = bind_weights(mod, random_weights(mod))
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod, m=9), rtol=2e-2)
    (row,) = relax_cutlass.offload_report(rewritten).offloaded
    assert row["dtypes"]["lhs"] == "bfloat16" and row["dtypes"]["accumulator"] == "float32"
    assert "bf16in" in row["kernel"]
