"""Soft-capped attention (Gemma-2, Grok: cap * tanh(scores / cap) before the mask) on the CPU: the
pattern and layout read the cap after the tanh and the scale before it, the region runs on the SM90
kernel (the only one whose score step computes the tanh) wherever it can run the problem, and stays
in TVM with the reason elsewhere; the offloaded module against the untouched one, the problem
record against the region's composite (the kernel model), the emitted score step and the profiler's
reference. The GPU runs are tests/test_gpu_softcap.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import relax_cutlass
from relax_cutlass.kinds import PlanError
from relax_cutlass.kinds.attention.emit_sm90 import SM90_BIAS_SCHEDULES
from relax_cutlass.kinds.attention.profile import attention_job
from relax_cutlass.kinds.attention.records import AttentionProblem, attention_key
from relax_cutlass.kinds.attention.reference import attention_reference
from relax_cutlass.kinds.attention.select import choose_attention_kernel
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing.attention import (
    check_regions_against_kernel_model,
    kernel_model,
    masked_inputs,
    offloaded_attention_rows,
    soft_capped_attention,
)
from relax_cutlass.testing.harness import compare_on_cpu, offload_for_cpu

GEMMA = AttentionProblem(2, 8, 1024, 1024, 256, 256, 256**-0.5, causal="TopLeft", kv_group=2, softcap=50.0)


@pytest.mark.parametrize("mask", ["none", "causal", "padding"])
@pytest.mark.parametrize("cap, cap_op", [(50.0, "divide"), (1.0, "divide"), (30.0, "multiply")])
def test_soft_capped_attention_is_offloaded_and_right(mask, cap, cap_op):
    """One SM90 region whose record holds the cap and the tanh's scale (the product of the 16-bit
    constants before the tanh, as the graph multiplies them); the offloaded module matches the
    untouched one and the record's model matches the composite (a cap of 1 saturates the tanh)."""
    mod = soft_capped_attention(mask=mask, cap=cap, cap_op=cap_op)
    (row,) = offloaded_attention_rows(mod)
    inverse = float(np.float16(1 / cap)) if cap_op == "multiply" else 1 / cap
    assert row["attention"]["softcap"] == cap
    assert row["attention"]["scale"] == pytest.approx(float(np.float16(16**-0.5)) * inverse, rel=1e-6)
    assert row["attention"].get("causal") == ("TopLeft" if mask == "causal" else None)
    assert ("bias" in row["attention"]) == (mask == "padding")
    assert row["kernel"].startswith("sm90_fmha") and row["kernel"].endswith(f"_softcap{cap:g}"), row
    compare_on_cpu(mod, masked_inputs(mod, full_row=False), arch="sm_90a")
    partitioned, _ = offload_for_cpu(mod, arch="sm_90a")
    assert check_regions_against_kernel_model(partitioned) == 1


def test_the_kernel_model_soft_caps():
    """The model's soft-cap is not vacuous: without it, saturated scores give another output."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.uniform(-4, 4, size=(1, 9, 2, 16)) for _ in range(3))
    problem = AttentionProblem(1, 2, 9, 9, 16, 16, 0.25, softcap=1.0)
    capped = kernel_model(problem, q, k, v)
    assert not np.allclose(capped, kernel_model(dataclasses.replace(problem, softcap=None), q, k, v))
    want = np.einsum("bnst,btnv->bsnv", _softmax(np.tanh(np.einsum("bsnh,btnh->bnst", q, k) * 0.25)), v)
    np.testing.assert_allclose(capped, want, rtol=1e-12)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("arch, family, says", [(80, "auto", "sm_80"), (90, "sm80", "family='sm80'")])
def test_soft_capping_off_the_sm90_kernel_stays_in_tvm_and_says_why(arch, family, says):
    """No SM80 kernel soft-caps: on sm_80 (or with family='sm80') the region is refused at planning,
    with the reason, and the model still runs right in TVM."""
    with pytest.raises(PlanError, match="computed by the SM90 attention kernel only") as refused:
        choose_attention_kernel(GEMMA, arch, family=family)
    assert says in str(refused.value) and "the attention stays in TVM" in str(refused.value)
    assert attention_job(GEMMA, arch, family) is None
    if arch == 80:
        mod = soft_capped_attention(mask="causal")
        report = relax_cutlass.offload_report(mod, arch="sm_80")
        assert not [r for r in report.offloaded if r["op"] == "attention"]
        assert len(report.left_in_tvm) == 2, str(report)
        assert all("computed by the SM90 attention kernel only" in " ".join(r["reasons"]) for r in report.left_in_tvm)
        compare_on_cpu(mod, masked_inputs(mod), arch="sm_80")


@pytest.mark.parametrize(
    "change, kernel",
    [
        # fewer queries than the SM90 bias kernel's tile, and a bias: the SM90 kernel all the same
        (dict(seq_q=24, seq_kv=24, bias_reads=((0, 1), None, None, (3, 1)), causal=None), "_q128_k64_h256_gqa_bias"),
        # head dim 256, whose SM90 tile the heuristic has not yet measured faster than the SM80 kernel
        ({}, "_q128_k64_h256_causal_tl_gqa"),
        # head dim 64, whose first schedule (ping-pong, persistent) reads no per-CTA score step
        (dict(head_dim=64, head_dim_value=64), "cooperative_q128_k128_h64_causal_tl_gqa"),
        # head dim 32: padded to 64
        (dict(head_dim=32, head_dim_value=32), "cooperative_q128_k128_h64_causal_tl_gqa"),
    ],
)
def test_soft_capping_takes_the_sm90_kernel_where_it_can_run(change, kernel):
    problem = dataclasses.replace(GEMMA, **change)
    chosen = choose_attention_kernel(problem, 90)
    assert chosen.arch == 90 and chosen.schedule in SM90_BIAS_SCHEDULES, chosen
    assert kernel in chosen.name and chosen.name.endswith("_softcap50"), chosen.name
    job = attention_job(problem, 90)
    assert {k.schedule for k, _ in job.candidates} <= set(SM90_BIAS_SCHEDULES)
    assert all(k.name.endswith("_softcap50") for k, _ in job.candidates)


def test_the_emitted_kernel_soft_caps_in_its_score_step():
    """The cap is compiled in (a literal C++ reads), the tanh takes the run-time scale, and the
    softmax's scale is 1; kernels without soft-capping have a cap of 0 and no other change."""
    capped = emit_kernel(choose_attention_kernel(GEMMA, 90)).text
    assert "constexpr float kSoftcap = 50.0f;" in capped
    assert "if constexpr (kSoftcap != 0.0f) qk = kSoftcap * tanhf(qk * b.softcap_scale);" in capped
    assert "const float softmax_scale = kSoftmaxScaleIsOne ? 1.0f : a->scale;" in capped
    assert "RelaxBiasMask<1, 64>" in capped  # every key tile through the score step, TopLeft
    plain = emit_kernel(choose_attention_kernel(dataclasses.replace(GEMMA, softcap=None, head_dim=128,
                                                                    head_dim_value=128), 90)).text  # fmt: skip
    assert "constexpr float kSoftcap = 0.0f;" in plain and "RelaxBiasMask" not in plain
    fractional = choose_attention_kernel(dataclasses.replace(GEMMA, softcap=0.5), 90)
    assert fractional.name.endswith("_softcap0p5") and "kSoftcap = 0.5f;" in emit_kernel(fractional).text
    # a soft-capped problem is tuned apart from the same problem without it
    assert attention_key(GEMMA, 90, 90) != attention_key(dataclasses.replace(GEMMA, softcap=None), 90, 90)


def test_the_profilers_reference_soft_caps_as_the_kernel_model_does():
    """The GPU host's check of a profiled candidate: the reference at sampled rows, given the job's
    soft-cap, is the kernel model of the problem."""
    job = attention_job(dataclasses.replace(GEMMA, batch=1, seq_q=40, seq_kv=40, head_dim=64, head_dim_value=64), 90)
    from relax_cutlass.kinds import kind_of

    fields = kind_of(job.problem).profiling.job_fields(job)
    assert fields["softcap"] == 50.0 and fields["causal"] == 1
    rng = np.random.default_rng(1)
    q = rng.uniform(-4, 4, size=(1, 40, 8, 64)).astype("float32")
    k, v = (rng.uniform(-4, 4, size=(1, 40, 4, 64)).astype("float32") for _ in range(2))
    rows = np.array([0, 7, 39])
    got = attention_reference(q, k, v, job.problem.scale, fields["causal"], rows, fields["softcap"])
    np.testing.assert_allclose(got, kernel_model(job.problem, q, k, v)[:, rows], rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, attention_reference(q, k, v, job.problem.scale, fields["causal"], rows))


def test_a_mask_added_before_the_tanh_stays_in_tvm():
    """tanh(scores + mask) would turn a masked key's -inf into -1: no pattern takes it, and the
    model runs right in TVM."""
    from tvm import relax

    from relax_cutlass.testing.attention import const, tensor_type

    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor_type((1, 2, 16, 16)))
    keep = relax.Var("keep", tensor_type((1, 1, 1, 16), "bool"))
    with bb.function("main", [x, keep]):
        with bb.dataflow():
            scores = bb.emit(relax.op.matmul(x, relax.op.permute_dims(x, [0, 1, 3, 2])))
            masked = bb.emit(relax.op.add(scores, bb.emit(relax.op.where(keep, const(0.0, "float16"),
                                                                        const(-60000.0, "float16")))))  # fmt: skip
            capped = bb.emit(relax.op.multiply(relax.op.tanh(relax.op.divide(masked, const(50.0, "float16"))),
                                               const(50.0, "float16")))  # fmt: skip
            gv = bb.emit_output(relax.op.matmul(relax.op.nn.softmax(capped), x))
        bb.emit_func_output(gv)
    mod = bb.get()
    assert offloaded_attention_rows(mod) == []
    compare_on_cpu(mod, masked_inputs(mod, full_row=False), arch="sm_90a")


# unpadded: a sibling of the left-padded batch, which runs both attentions and the padding besides
@pytest.mark.parametrize("padding", [pytest.param("none", marks=pytest.mark.slow), "left"])
def test_gemma2_offloads_both_attentions_soft_capped(padding):
    """transformers' Gemma-2 (scripts/hf_sweep.py's tiny one): the global layer's causal mask and
    the sliding-window layer's band mask (a float32 constant of finfo.min, cast as a swamping
    mask) both beside the soft-cap, nothing left in TVM, the output within float16's bound of
    torch float32's (both attentions stayed in TVM before). In a left-padded batch the global
    layer's padding is a (B, 1, 1, T) bias beside the causal mask, its first rows fully masked
    (the mean of every value: the SM90 kernel's fix-up), the sliding layer's a (B, 1, S, T) one."""
    import torch
    import transformers

    from relax_cutlass.testing.errors import rel_error
    from relax_cutlass.testing.harness import build_cpu, offload_pipeline_on_cpu, run_vm
    from relax_cutlass.testing.models.torch_transformers import TINY_VOCAB, tiny_model

    torch.manual_seed(0)
    model = tiny_model("gemma2", torch, transformers).to(torch.float16).float()
    ids = torch.randint(3, TINY_VOCAB, (2, 24))
    inputs = (ids,)
    if padding == "left":
        inputs = (ids, torch.ones(2, 24, dtype=torch.int64).index_fill_(1, torch.arange(5), 0))
    with torch.no_grad():
        want = model(*inputs).numpy()
    offloaded = offload_pipeline_on_cpu(relax_cutlass.from_torch(model, inputs, dtype="float16"), profile="never")
    report = relax_cutlass.offload_report(offloaded)
    attention = [r for r in report.offloaded if r["op"] == "attention"]
    assert len(attention) == 2 and not report.left_in_tvm, str(report)
    assert {r["attention"].get("causal") for r in attention} == {"TopLeft", None}
    assert all(r["attention"]["softcap"] == 50.0 for r in attention)
    if padding == "left":
        assert {r["attention"]["bias"] for r in attention} == {"B11T", "B1ST"}
        assert all(r["attention"]["masked_rows"] == "mean" for r in attention)
    got = run_vm(build_cpu(offloaded), [x.numpy() for x in inputs])
    assert rel_error(got, want) < 2e-2  # every row, the fully masked ones too


@pytest.mark.parametrize(
    "bias, chosen",
    [
        ((((0, 1), None, None, (3, 1))), "sm90"),  # a padded batch's (B, 1, 1, T) mask: the SM90 fix-up
        ((((0, 1), None, (2, 1), (3, 1))), "tvm"),  # a (B, 1, S, T) one: no kernel gives those rows
    ],
)
def test_a_causal_mask_beside_a_mask_whose_masked_rows_give_the_mean(bias, chosen):
    """Gemma-2 in a padded batch (eager attention's finfo.min mask: a fully masked row is the mean
    of all the values): the SM90 kernel's causal loop stops at the diagonal, and its fix-up gives
    those rows the mean of every value where the mask is one row of keys per sequence; any other
    such mask stays in TVM, soft-capped. Without soft-capping the SM80 kernel runs those others, and
    the SM90 kernel with its fix-up the padded batch's."""
    problem = dataclasses.replace(GEMMA, bias_reads=bias, masked_rows="mean")
    if chosen == "sm90":
        kernel = choose_attention_kernel(problem, 90)
        text = emit_kernel(kernel).text
        assert kernel.arch == 90 and "FixCausalMeanRows<Element><<<" in text and "relax_fully_masked_rows" in text
        assert "takes no additive" not in text and "one row of keys per" in text  # refused per-query masks at run time
    else:
        with pytest.raises(PlanError, match="causal loop stops at the diagonal"):
            choose_attention_kernel(problem, 90)
    plain = choose_attention_kernel(dataclasses.replace(problem, softcap=None, head_dim=128, head_dim_value=128), 90)
    assert plain.arch == (90 if chosen == "sm90" else 80), plain
    assert chosen == "sm90" or "causal loop stops at the diagonal" in plain.note
    # every causal kernel with a score step has the fix-up (run where the call has such a mask); a
    # plain causal kernel has none
    assert "FixCausalMeanRows" in emit_kernel(choose_attention_kernel(GEMMA, 90)).text
    plain_causal = dataclasses.replace(GEMMA, softcap=None, head_dim=128, head_dim_value=128)
    assert "FixCausalMeanRows" not in emit_kernel(choose_attention_kernel(plain_causal, 90)).text


def test_the_fully_masked_rows_rule_finds_every_row_whose_visible_keys_are_all_masked(tmp_path):
    """emit_sm90.MEAN_ROWS_RULE, built with the host compiler, against every row's visible keys:
    TopLeft and BottomRight, more queries than keys and fewer, left- and right-padded rows, rows
    with no unmasked key."""
    import shutil
    import subprocess

    from relax_cutlass.kinds.attention.emit_sm90 import MEAN_ROWS_RULE

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    rng = np.random.default_rng(0)
    cases = []
    for s, t in [(8, 8), (5, 12), (12, 5), (1, 7), (7, 1)]:
        for causal in ("TopLeft", "BottomRight"):
            for _ in range(6):
                keep = rng.random(t) < rng.choice([0.0, 0.3, 0.8, 1.0])
                if rng.random() < 0.5:  # left padding: the first keys masked
                    keep = np.arange(t) >= rng.integers(0, t + 1)
                cases.append((s, t, causal, keep))
    lines = []
    for s, t, causal, keep in cases:
        offset = abs(s - t) if causal == "BottomRight" else 0
        first = int(np.argmax(keep)) if keep.any() else t
        lines.append(f'  std::printf("%lld\\n", (long long)relax_fully_masked_rows({first}, {offset}, {s}, {t}));')
    main = "#define CUTLASS_HOST_DEVICE inline\n#include <cstdint>\n#include <cstdio>\n" + MEAN_ROWS_RULE
    main += "int main() {\n" + "\n".join(lines) + "\n}\n"
    (tmp_path / "rows.cc").write_text(main)
    subprocess.run([cxx, "-O1", "-o", str(tmp_path / "rows"), str(tmp_path / "rows.cc")], check=True)
    got = [
        int(x)
        for x in subprocess.run([str(tmp_path / "rows")], check=True, capture_output=True, text=True).stdout.split()
    ]
    for (s, t, causal, keep), n in zip(cases, got, strict=True):
        offset = abs(s - t) if causal == "BottomRight" else 0
        masked = [not keep[: min(t, i + offset + 1)].any() for i in range(s)]
        assert masked == [i < n for i in range(s)], (s, t, causal, keep, n)
