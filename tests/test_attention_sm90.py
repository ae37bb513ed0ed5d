"""The attention kind's SM90 family (CUTLASS examples/88, Hopper TMA + wgmma FMHA) and causal
R.nn.attention, on CPU: which targets and forms get the SM90 kernel and why others stay on
examples/41's SM80 kernel, the emitted source, profiling candidates and tuning records, and the
semantics of the causal forms (the offloaded module against the untouched one, and the kernel's
problem record against TVM's legalization). The nvcc build (SASS holds HGMMA) is the `nvcc` test
at the end; the GPU runs are tests/test_gpu_attention_sm90.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_cutlass import offload_report
from relax_cutlass.kinds.attention import select
from relax_cutlass.kinds.attention.emit_sm90 import SM90_BIAS_SCHEDULES
from relax_cutlass.kinds.attention.profile import attention_job
from relax_cutlass.kinds.attention.records import CAUSAL_CODE, AttentionProblem, attention_key
from relax_cutlass.kinds.attention.select import (
    attention_family,
    attention_label,
    choose_attention_kernel,
    sm90_attention_fallback_reason,
    sm90_attention_kernels,
    sm90_candidate_first,
    sm90_mean_rows_fixup,
    sm90_unmeasured_kernels,
)
from relax_cutlass.stages.emit import emit_glue, emit_kernel
from relax_cutlass.testing.attention import (
    attention_regions,
    check_regions_against_kernel_model,
    offloaded_attention_rows,
    op_attention,
    sdpa_attention,
    torch_export_attention,
)
from relax_cutlass.testing.harness import compare_on_cpu, offload_for_cpu, random_inputs
from relax_cutlass.toolkit.tuning import TuningDatabase, TuningRecord

HD128 = AttentionProblem(4, 16, 1024, 1024, 128, 128, 128**-0.5)
HD64 = AttentionProblem(4, 16, 1024, 1024, 64, 64, 0.125)


@pytest.mark.parametrize(
    "arch,family,want",
    [(90, "auto", 90), (90, "sm90", 90), (90, "sm80", 80), (80, "auto", 80), (100, "auto", 80), (120, "auto", 80)],
)
@pytest.mark.parametrize("causal", [None, "TopLeft", "BottomRight"])
def test_each_target_gets_its_attention_family(arch, family, want, causal):
    problem = dataclasses.replace(HD128, causal=causal)
    kernel = choose_attention_kernel(problem, arch, family=family)
    assert kernel.arch == want and kernel.target == arch
    if want == 90:
        assert kernel.name.startswith("sm90_fmha_f16_cooperative_q128_k128_h128")
        assert kernel.note == ""
        assert kernel.name.endswith({None: "h128", "TopLeft": "_causal_tl", "BottomRight": "_causal_br"}[causal])
    elif family == "sm80":
        assert kernel.note == "SM80 kernel requested (family='sm80')"
    elif arch in (100, 120):
        assert "SM80 family" in kernel.note


def test_sm90_tiles_per_head_dim_and_dtype():
    assert choose_attention_kernel(HD64, 90).name == "sm90_fmha_f16_pingpong_q128_k128_h64"
    bf16 = dataclasses.replace(HD128, element="bfloat16", seq_q=None, seq_kv=None, batch=None)
    assert choose_attention_kernel(bf16, 90).name == "sm90_fmha_bf16_cooperative_q128_k128_h128"


@pytest.mark.parametrize(
    "change,reason",
    [
        (dict(head_dim=48, head_dim_value=48), "head dims 48/48"),
        (dict(head_dim=72, head_dim_value=72), "head dims 72/72"),
        (dict(head_dim=64, head_dim_value=128), "head dims 64/128"),
        (dict(scale=-0.125), "positive scale"),
    ],
)
def test_what_the_sm90_kernel_cannot_run_falls_back_with_the_reason(change, reason):
    problem = dataclasses.replace(HD128, **change)
    assert reason in sm90_attention_fallback_reason(problem)
    kernel = choose_attention_kernel(problem, 90)
    assert kernel.arch == 80 and kernel.name.startswith("sm80_fmha") and reason in kernel.note
    assert attention_family(problem, 90) == 80


BIASES = {"b11t": ((0, 1), None, None, (3, 1)), "1nst": (None, (1, 1), (2, 1), (3, 1))}


@pytest.mark.parametrize("bias", BIASES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [None, "BottomRight"])
def test_an_additive_bias_runs_on_the_sm90_kernel(bias, head_dim, causal, monkeypatch):
    """A padding mask or a position bias on the scores: the heuristic runs it on the SM90 kernel
    (select.SM90_BIAS_FIRST), with the bias read per CTA (a schedule of one block per CTA, the
    example's block order even when causal) and its own kernel name; profiling times its schedules
    against each other (the profiler passes no bias). With SM90_BIAS_FIRST emptied the SM80 kernel
    runs it and the report says why."""
    base = HD64 if head_dim == 64 else HD128
    problem = dataclasses.replace(base, bias_reads=BIASES[bias], masked_rows="zero", causal=causal)
    assert sm90_attention_fallback_reason(problem) is None and attention_family(problem, 90) == 90
    kernel = choose_attention_kernel(problem, 90)
    plain = choose_attention_kernel(dataclasses.replace(problem, bias_reads=None), 90)
    job = attention_job(problem, 90)
    assert job.key == attention_key(problem, 90, 90)
    assert {k.schedule for k, _ in job.candidates} == set(SM90_BIAS_SCHEDULES) == {"cooperative", "cooperative_locked"}
    assert kernel.arch == 90 and kernel.bias and kernel.schedule == "cooperative" and kernel.name.endswith("_bias")
    # the plain kernel's name with the bias's schedule (head dim 64's first, ping-pong, is persistent)
    assert kernel.name == dataclasses.replace(plain, schedule="cooperative").name + "_bias"
    assert sm90_unmeasured_kernels(problem, 90) == []
    monkeypatch.setattr(select, "SM90_BIAS_FIRST", set())
    assert "additive mask/bias" in sm90_attention_fallback_reason(problem) and attention_family(problem, 90) == 80
    fallback = choose_attention_kernel(problem, 90)
    assert fallback.arch == 80 and fallback.bias and f"not the default at head dim {head_dim}" in fallback.note
    job = attention_job(problem, 90)
    assert job is None or all(k.arch == 80 for k, _ in job.candidates)
    text = emit_kernel(kernel).text
    assert "struct CollectiveSoftmax<ElementAccumulator, RelaxBiasMask<kCausal, kKeys>, Params>" in text
    assert f"RelaxBiasMask<{CAUSAL_CODE[causal]}, {kernel.keys_per_block}>" in text
    assert "IndividualTileScheduler" in text and "RelaxCausalTileScheduler" not in text
    assert "takes no additive mask/bias" not in text
    assert "takes no additive mask/bias" in emit_kernel(plain).text and "RelaxBias" not in emit_kernel(plain).text
    # a row of masked scores: -inf, or (masked_rows 2) a power of two whose scaled value is exact
    assert "b.masked_rows == 2 ? kSwamping : -INFINITY" in text and "kSwamping = -0x1p100f" in text
    # a finite bias at or below it (a bfloat16 mask) scores it exactly, however its scaling rounded
    assert "score = value <= kSwamping ? kSwamping : score;" in text


@pytest.mark.parametrize("seq_q, family", [(49, 80), (127, 80), (128, 90), (4096, 90), (None, 90)])
def test_a_bias_on_fewer_queries_than_the_sm90_tile_runs_on_the_sm80_kernel(seq_q, family):
    """Swin-T's 49-token windows ran slower on the SM90 bias kernel's 128-query tile than on the
    SM80 kernel's 64-query one (H200): a mask/bias on fewer than SM90_BIAS_MIN_QUERIES queries
    keeps the SM80 kernel, the report saying why; a symbolic length takes the SM90 kernel; forced
    (the GPU tests' "sm90" family), any length runs on it."""
    problem = dataclasses.replace(HD64, bias_reads=BIASES["1nst"], masked_rows="nan", seq_q=seq_q)
    assert attention_family(problem, 90) == family
    if family == 80:
        reason = sm90_attention_fallback_reason(problem)
        assert f"additive mask/bias on {seq_q} queries, fewer than the SM90 attention kernel's 128" in reason
        assert reason in choose_attention_kernel(problem, 90).note
    with select.sm90_bias_head_dims((64,), 0):
        assert attention_family(problem, 90) == 90
    with sm90_candidate_first("cooperative", bias_head_dims=[64]):
        assert attention_family(problem, 90) == 90
    assert attention_family(problem, 90) == family  # restored


def test_a_tuning_record_can_choose_the_sm90_bias_kernel(tmp_path):
    problem = dataclasses.replace(HD64, bias_reads=BIASES["1nst"], masked_rows="nan")
    db = TuningDatabase(tmp_path / "t.jsonl")
    with sm90_candidate_first("cooperative", bias_head_dims=[64]):
        job = attention_job(problem, 90)
    timed = {attention_label(k.queries_per_block, k.keys_per_block, k.schedule): 2.0 for k, _ in job.candidates}
    timed["cooperative_locked_q128_k64"] = 1.0
    db.add([TuningRecord(job.key, "cooperative_locked_q128_k64", 1.0, candidates=timed)])
    with sm90_candidate_first("cooperative", bias_head_dims=[64]):
        kernel = choose_attention_kernel(problem, 90, db)
    assert (
        kernel.arch == 90 and kernel.bias and kernel.schedule == "cooperative_locked" and kernel.selected_by == "tuned"
    )


@pytest.mark.parametrize("change", [dict(bias_reads=BIASES["b11t"]), dict(softcap=50.0)])
def test_a_persistent_schedule_is_refused_for_a_kernel_that_modifies_the_scores(change):
    problem = dataclasses.replace(HD64, **change)
    kernel = dataclasses.replace(sm90_attention_kernels(problem, 90)[0], schedule="pingpong")
    with pytest.raises(ValueError, match="a bias or soft-capped kernel runs one of"):
        emit_kernel(kernel)


@pytest.mark.parametrize(
    "builder,kwargs,kernel,note",
    [
        (op_attention, {"h": 64}, "sm90_fmha_f16_pingpong_q128_k128_h64", ""),
        (op_attention, {"h": 64, "causal": "TopLeft"}, "sm90_fmha_f16_pingpong_q128_k128_h64_causal_tl", ""),
        (op_attention, {"h": 128, "causal": "BottomRight", "t": 24}, "_causal_br", ""),
        (torch_export_attention, {"h": 64}, "sm90_fmha_f16_pingpong_q128_k128_h64", ""),
        (torch_export_attention, {"h": 64, "dtype": "bfloat16"}, "sm90_fmha_bf16_pingpong", ""),
        (op_attention, {"h": 8, "causal": "TopLeft"}, "sm80_fmha", "head dims 8/8"),
        (sdpa_attention, {"h": 64, "s": 128}, "sm90_fmha_f16_cooperative_q128_k128_h64_bias", ""),
        (sdpa_attention, {"h": 64}, "sm80_fmha", "additive mask/bias on 16 queries"),
    ],
)
def test_report_names_the_family_and_the_reason(builder, kwargs, kernel, note):
    mod = builder(**kwargs)
    (row,) = offloaded_attention_rows(mod)  # sm_90a
    assert kernel in row["kernel"] and note in row.get("note", "")
    text = str(offload_report(mod, arch="sm_90a"))
    assert row["kernel"] in text and ("causal=" in text) == ("causal" in kwargs)
    (row80,) = [r for r in offload_report(mod, arch="sm_90a", family="sm80").offloaded if r["op"] == "attention"]
    assert row80["kernel"].startswith("sm80_fmha") and "family='sm80'" in row80["note"]


@pytest.mark.parametrize(
    "s,t,causal",
    [(8, 8, "TopLeft"), (8, 8, "BottomRight"), (6, 11, "TopLeft"), (6, 11, "BottomRight"), (11, 6, "TopLeft")]
    + [(11, 6, "BottomRight")],  # TVM's BottomRight with S > T: offset |S - T|, every key of the last rows seen
)
def test_causal_attention_is_offloaded_and_correct(s, t, causal):
    """R.nn.attention with TVM's causal masks (legalized: tril with k = 0 or |S - T|): the
    offloaded module matches the untouched one, and the kernel's record (mask included) matches
    the composite."""
    mod = op_attention(s=s, t=t, h=16, causal=causal)
    (row,) = offloaded_attention_rows(mod)
    assert row["attention"]["causal"] == causal
    compare_on_cpu(mod, random_inputs(mod))
    partitioned, _ = offload_for_cpu(mod)
    (region,) = attention_regions(partitioned)
    assert region.kernel.problem.causal == causal
    assert check_regions_against_kernel_model(partitioned) == 1


def test_kernel_model_masks_as_tvm_does():
    """The record's mask is not vacuous: without it the model of a causal region is wrong."""
    mod = op_attention(s=9, t=5, h=16, causal="BottomRight")
    partitioned, _ = offload_for_cpu(mod)
    (region,) = attention_regions(partitioned)
    unmasked = dataclasses.replace(region.kernel.problem, causal="TopLeft")
    from relax_cutlass.testing.attention import kernel_model

    rng = np.random.default_rng(0)
    q, k, v = (rng.uniform(-1, 1, size=(2, n, 2, 16)) for n in (9, 5, 5))
    got = kernel_model(region.kernel.problem, q, k, v)
    assert not np.allclose(got, kernel_model(unmasked, q, k, v))


def _symbolic_causal(h=64, causal="TopLeft"):
    """R.nn.attention on (B, S, N, H) tensors with a symbolic sequence length (self-attention)."""
    seq = tvm.tirx.Var("seq", "int64")
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(name, relax.TensorType((2, seq, 4, h), "float16")) for name in "xyz")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.nn.attention(q, k, v, causal_mask=causal))
        bb.emit_func_output(gv)
    return bb.get()


def test_symbolic_sequence_length_takes_the_sm90_kernel():
    mod = _symbolic_causal()
    (row,) = offloaded_attention_rows(mod)
    assert row["attention"]["seq_q"] == "dynamic" and row["kernel"].startswith("sm90_fmha_f16_pingpong_q128_k128_h64")
    for seq in (3, 13):
        compare_on_cpu(mod, random_inputs(mod, seq=seq))
    partitioned, _ = offload_for_cpu(mod)
    assert check_regions_against_kernel_model(partitioned, seq=13) == 1


def test_emitted_sm90_kernel_is_examples_88():
    partitioned, _ = offload_for_cpu(op_attention(h=128, causal="BottomRight"))
    (region,) = attention_regions(partitioned)
    source = emit_kernel(region.kernel)
    assert source.family == "sm90"  # the SASS check asks for HGMMA
    assert any(flag.endswith("88_hopper_fmha") for flag in source.extra_flags)
    text = source.text
    assert "cutlass::fmha::collective::FmhaMainloopTmaWarpSpecialized<" in text
    assert "RelaxMask<2>" in text and "IndividualTileScheduler" in text
    assert "cute::Shape<cute::_128, cute::_128, cute::_128>" in text
    assert "can_implement" in text and "get_workspace_size" in text  # checked at run time
    # launched as a programmatic dependent (PDL): the example's device_kernel with a wait first
    kernel_body = text[text.index("RelaxPdlKernel(CUTLASS_GRID_CONSTANT") :]
    assert kernel_body.index("PdlWaitForPrerequisites();") < kernel_body.index("op(params, smem);")
    assert "ClusterLauncher::launch(" in text and "LaunchWithPdl(stream)" in text and "Operation::run(" not in text
    assert "cudaFuncSetAttribute(RelaxPdlKernel<Kernel>" in text
    assert "16-byte aligned" in text and "scale_softmax_log2" in text
    pingpong = emit_kernel(dataclasses.replace(region.kernel, schedule="pingpong")).text
    assert "PersistentTileScheduler" in pingpong and "kLoadsQSeparately" in pingpong
    glue = emit_glue([region], "m").text
    assert "args.causal = 2;" in glue and "sm90_fmha_f16_cooperative_q128_k128_h128_causal_br_run" in glue


def test_sm80_kernel_takes_the_causal_mask_at_run_time():
    partitioned, _ = offload_for_cpu(op_attention(h=8, causal="TopLeft"))
    (region,) = attention_regions(partitioned, arch=80)
    text = emit_kernel(region.kernel).text
    assert "Attention::CausalFromTopLeft" in text and "causal_diagonal_offset" in text
    assert "args.causal = 1;" in emit_glue([region], "m").text


def test_profiling_times_every_sm90_tile_and_schedule():
    job = attention_job(dataclasses.replace(HD128, causal="TopLeft"), 90)
    assert job.key.family == 90 and job.key.geometry == (1,)
    schedules = ["cooperative", "pingpong", "cooperative_locked", "pingpong_locked"]
    assert [k.schedule for k, _ in job.candidates] == schedules
    hd64 = attention_job(HD64, 90)
    tiles = [(k.queries_per_block, k.keys_per_block, k.schedule) for k, _ in hd64.candidates]
    hd64_schedules = ["pingpong", "cooperative", "cooperative_locked", "pingpong_locked"]
    assert tiles == [(128, keys, s) for keys in (128, 64) for s in hd64_schedules]
    assert len({k.name for k, _ in hd64.candidates}) == len(tiles)
    assert all(k.arch == 90 and k.selected_by == "profiling" for k, _ in job.candidates)
    sm80 = attention_job(HD64, 90, family="sm80")
    assert sm80.key.family == 80 and all(k.arch == 80 for k, _ in sm80.candidates)
    assert attention_job(dataclasses.replace(HD128, seq_q=None), 90) is None


HD96 = AttentionProblem(1, 32, 512, 512, 96, 96, 96**-0.5, causal="TopLeft")  # Phi-3 mini's attention


@pytest.fixture
def no_padded_first(monkeypatch):
    """The heuristic keeps the SM80 kernel at every head dim without an SM90 kernel of its own."""
    from relax_cutlass.kinds.attention import select

    monkeypatch.setattr(select, "SM90_PADDED_FIRST", set())


@pytest.mark.parametrize("head_dim, padded", [(96, 128), (80, 128), (72, 128), (32, 64), (8, 64)])
def test_a_head_dim_without_its_own_sm90_kernel_is_profiled_padded_beside_the_sm80_kernel(
    head_dim, padded, no_padded_first
):
    """A head dim not in SM90_PADDED_FIRST (here none is): the heuristic keeps the SM80 kernel (the
    padded SM90 run is not measured faster) and says so; profiling times the SM90 kernel of the
    next wider head dim beside it, under the SM80 family's key."""
    problem = dataclasses.replace(HD96, head_dim=head_dim, head_dim_value=head_dim, scale=head_dim**-0.5)
    kernel = choose_attention_kernel(problem, 90)
    assert kernel.arch == 80 and f"padded to {padded}, not yet measured faster" in kernel.note
    job = attention_job(problem, 90)
    assert job.key == attention_key(problem, 90) and job.key.family == 80
    families = [k.arch for k, _ in job.candidates]
    assert families[0] == 80 and families.count(90) == len(sm90_attention_kernels(problem, 90)) > 0
    assert all(k.max_head_dim == padded and f"padded to {padded}" in k.note for k, _ in job.candidates if k.arch == 90)
    # the SM90 kernel's name (and object) is the wider head dim's own
    full = dataclasses.replace(problem, head_dim=padded, head_dim_value=padded, scale=padded**-0.5)
    assert {k.name for k, _ in job.candidates if k.arch == 90} == {k.name for k in sm90_attention_kernels(full, 90)}
    # not off sm_90a, nor with family="sm80", nor where the SM90 kernel cannot run the problem at all
    for other in (attention_job(problem, 80), attention_job(problem, 90, family="sm80")):
        assert other is None or all(k.arch == 80 for k, _ in other.candidates)
    biased = dataclasses.replace(problem, bias_reads=((0, 1), None, None, (3, 1)), causal=None)
    assert sm90_unmeasured_kernels(biased, 90) == [] and sm90_unmeasured_kernels(problem, 90, family="sm80") == []


def test_mean_rows_beside_a_causal_mask_run_on_the_sm90_kernel_with_its_fix_up():
    """A fully masked row that gives the mean of all the values (eager's finite mask) beside the
    kernel's causal mask: the SM90 kernel averages the keys its loop visits, which stops at the
    diagonal, so where the mask is one row of keys per sequence (a left-padded batch's (B, 1, 1, T))
    its fix-up (FixCausalMeanRows) writes those rows after it; with the fix-up switched off, or a
    mask row per query, the SM80 kernel (whose fix-up averages every key) runs it and says why;
    zero rows (sdpa's safe softmax) need no fix-up."""
    problem = dataclasses.replace(HD64, causal="TopLeft", bias_reads=((0, 1), None, None, (3, 1)), masked_rows="mean")
    per_query = dataclasses.replace(problem, bias_reads=((0, 1), None, (2, 1), (3, 1)))
    with sm90_candidate_first("cooperative", bias_head_dims=[64]):
        kernel = choose_attention_kernel(problem, 90)
        zero = choose_attention_kernel(dataclasses.replace(problem, masked_rows="zero"), 90)
        rows = choose_attention_kernel(per_query, 90)
        with sm90_mean_rows_fixup(False):
            off = choose_attention_kernel(problem, 90)
    assert kernel.name == "sm90_fmha_f16_cooperative_q128_k128_h64_causal_tl_bias", kernel
    assert "FixCausalMeanRows<Element><<<" in emit_kernel(kernel).text
    for refused in (off, rows):
        assert refused.arch == 80 and "causal loop stops at the diagonal" in refused.note, refused
    assert zero.name == kernel.name, zero


def test_head_dim_256_runs_on_its_sm90_tile():
    """Gemma's head dim 256 on examples/88's 128 x 64 tile (measured 3.9-4.7x the SM80 kernel on the
    H200), cooperative: the ping-pong schedules need more shared memory than a CTA may have (which
    failed on the H200), so one forced first falls back to the cooperative kernel; family='sm80'
    keeps the SM80 kernel and says why; profiling times no SM80 fallback's SM90 candidates for it."""
    problem = dataclasses.replace(HD128, head_dim=256, head_dim_value=256, scale=0.0625)
    forced = choose_attention_kernel(problem, 90)
    assert forced.name == "sm90_fmha_f16_cooperative_q128_k64_h256", forced
    assert sm90_unmeasured_kernels(problem, 90) == []
    with sm90_candidate_first("pingpong_locked"):
        assert choose_attention_kernel(problem, 90).name == forced.name
    fallback = choose_attention_kernel(problem, 90, family="sm80")
    assert fallback.arch == 80 and "family='sm80'" in fallback.note, fallback
    text = emit_kernel(forced).text
    assert "using TileShape = cute::Shape<cute::_128, cute::_64, cute::_256>;" in text
    # a kernel over the shared memory a CTA may have fails in nvcc, not at its first launch
    assert "static_assert(Kernel::SharedStorageSize <= 232448," in text
    # a head dim between 128 and 256 runs padded to 256 only where profiling measures it faster
    padded = dataclasses.replace(problem, head_dim=192, head_dim_value=192)
    assert choose_attention_kernel(padded, 90).arch == 80 and sm90_unmeasured_kernels(padded, 90)


@pytest.mark.parametrize("head_dims", [(96, 64), (100, 100), (264, 264)])
def test_no_padded_sm90_kernel_for_unequal_unaligned_or_too_wide_head_dims(head_dims):
    problem = dataclasses.replace(HD96, head_dim=head_dims[0], head_dim_value=head_dims[1])
    assert sm90_attention_kernels(problem, 90) == []
    assert choose_attention_kernel(problem, 90).arch == 80
    job = attention_job(problem, 90)
    assert job is None or all(k.arch == 80 for k, _ in job.candidates)


def test_a_tuning_record_in_which_the_padded_sm90_kernel_won_takes_it(tmp_path, no_padded_first):
    """The SM80 family's record of a head-dim-96 problem whose fastest correct candidate was the
    SM90 kernel padded to 128: the build takes that kernel (tuned), and the SM80 tile where the
    SM80 kernel won."""
    key = attention_key(HD96, 90)
    db = TuningDatabase(tmp_path / "t.jsonl")
    labels = {"q32_k128": 0.020, "cooperative_q128_k128": 0.012, "pingpong_q128_k128": 0.013}
    db.add([TuningRecord(key, "cooperative_q128_k128", 0.012, candidates=labels, heuristic="q32_k128")])
    kernel = choose_attention_kernel(HD96, 90, db)
    assert kernel.arch == 90 and kernel.selected_by == "tuned" and kernel.schedule == "cooperative"
    assert kernel.name == "sm90_fmha_f16_cooperative_q128_k128_h128_causal_tl" and "padded to 128" in kernel.note
    db.add([TuningRecord(key, "q32_k128", 0.011, candidates=dict(labels, q32_k128=0.011), heuristic="q32_k128")])
    kernel = choose_attention_kernel(HD96, 90, TuningDatabase(tmp_path / "t.jsonl"))
    assert kernel.arch == 80 and kernel.selected_by == "tuned"


@pytest.mark.parametrize(
    "head_dim, padded, schedule", [(96, 128, "cooperative"), (80, 128, "cooperative"), (32, 64, "pingpong")]
)
def test_a_padded_head_dim_measured_faster_takes_the_sm90_kernel(head_dim, padded, schedule):
    """The head dims in SM90_PADDED_FIRST (Phi-3's 96, Phi-2's 80, 32: 1.6-3.3x the SM80 kernel's
    speed on the H100, bench/attention_sdpa.py) run padded by the heuristic, on the wider head
    dim's first schedule, with the SM90 family's key."""
    problem = dataclasses.replace(HD96, head_dim=head_dim, head_dim_value=head_dim, scale=head_dim**-0.5)
    kernel = choose_attention_kernel(problem, 90)
    assert kernel.arch == 90 and kernel.max_head_dim == padded and kernel.schedule == schedule
    assert kernel.note == f"head dim {head_dim} padded to {padded}"
    assert attention_family(problem, 90) == 90 and attention_job(problem, 90).key.family == 90
    assert choose_attention_kernel(problem, 90, family="sm80").arch == 80


def test_tuning_record_picks_the_schedule(tmp_path):
    key = attention_key(HD128, 90, 90)
    db = TuningDatabase(tmp_path / "t.jsonl")
    db.add([TuningRecord(key, "pingpong_q128_k128", 1.0)])
    kernel = choose_attention_kernel(HD128, 90, db)
    assert kernel.schedule == "pingpong" and kernel.selected_by == "tuned"
    other = choose_attention_kernel(dataclasses.replace(HD128, batch=8), 90, db)
    assert other.schedule == "cooperative" and "no tuning record" in other.note


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize(
    "head_dim, causal, kv_group, tile, schedule",
    [
        (128, None, 1, None, None),
        (128, "TopLeft", 1, None, None),
        (128, "TopLeft", 4, None, None),
        # what profiling adds, in one compile: the warp groups' ordered softmax, persistent, on
        # head dim 64's 128 x 128 tile (each candidate checked against sdpa on the H100)
        (64, "TopLeft", 1, (128, 128), "pingpong_locked"),
        # an additive bias (padding mask, position bias), causal grouped-query on top
        (64, None, 1, None, "bias"),
        (128, "BottomRight", 4, None, "bias"),
        # soft-capped scores (Gemma-2): causal grouped-query, and head dim 256 with a bias beside
        # the causal mask (the fully masked rows' fix-up compiled in)
        (64, "TopLeft", 2, None, "softcap"),
        (256, "TopLeft", 2, None, "bias_softcap"),
    ],
)
def test_sm90_attention_compiles_to_hgmma(head_dim, causal, kv_group, tile, schedule):
    """Head-dim-128 kernels, non-causal, causal, and causal grouped-query (k/v heads read with a
    static stride 0 across each group), the other candidates, kernels with an additive bias and
    soft-capped ones, through nvcc for sm_90a: the SASS is sm_90a's and holds wgmma (HGMMA), no
    mma.sync (compile_all's guard checked the first)."""
    from relax_cutlass.toolkit.compile import compile_all
    from relax_cutlass.toolkit.sass_check import mma_counts

    base = HD128 if head_dim == 128 else dataclasses.replace(HD64, head_dim=head_dim, head_dim_value=head_dim)
    problem = dataclasses.replace(base, causal=causal, batch=None, seq_q=None, kv_group=kv_group)
    if "softcap" in (schedule or ""):
        problem = dataclasses.replace(problem, softcap=50.0)
    if schedule in ("bias", "bias_softcap"):  # the SM90 bias kernel (not the heuristic's yet), its first schedule
        problem = dataclasses.replace(problem, bias_reads=BIASES["b11t"], masked_rows="zero")
    if schedule in ("bias", "bias_softcap", "softcap"):
        schedule = "cooperative"
    kernel = choose_attention_kernel(problem, 90)
    if tile or schedule:
        (kernel,) = [
            k
            for k in sm90_attention_kernels(problem, 90)
            if (k.queries_per_block, k.keys_per_block) == (tile or select.SM90_ATTENTION_TILES[k.max_head_dim][0])
            and k.schedule == schedule
        ]
    assert kernel.arch == 90
    ((obj, _),) = compile_all([emit_kernel(kernel)], 90).values()
    counts, sass, _ = mma_counts(obj, ("HMMA", "HGMMA"))
    print(f"{kernel.name}: {counts}")
    assert sass == ["sm_90a"] and counts["HGMMA"] > 0 and counts["HMMA"] == 0


@pytest.mark.parametrize("m_blocks, pairs, section", [(1, 1, 1), (32, 64, 12), (32, 64, 64), (7, 5, 2), (3, 10, 4)])
def test_causal_block_order_visits_every_block_once_heaviest_first(tmp_path, m_blocks, pairs, section):
    """The causal SM90 kernels' block order (emit_sm90.CAUSAL_ORDER, the C++ they include), built
    with the host compiler: every (query block, pair) once; within a section the query blocks from
    the last (heaviest) down, and sections in order (a partial last one too)."""
    import shutil
    import subprocess

    from relax_cutlass.kinds.attention.emit_sm90 import CAUSAL_ORDER

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    main = f"""#define CUTLASS_HOST_DEVICE inline
#include <cstdio>
{CAUSAL_ORDER}
int main() {{
  for (int i = 0; i < {m_blocks * pairs}; ++i) {{
    RelaxCausalOrder at = relax_causal_order(i, {m_blocks}, {pairs}, {section});
    std::printf("%d %d\\n", at.m_block, at.pair);
  }}
}}
"""
    (tmp_path / "order.cc").write_text(main)
    subprocess.run([cxx, "-O1", "-o", str(tmp_path / "order"), str(tmp_path / "order.cc")], check=True)
    out = subprocess.run([str(tmp_path / "order")], check=True, capture_output=True, text=True).stdout
    visits = [tuple(map(int, line.split())) for line in out.splitlines()]
    assert sorted(visits) == [(m, p) for m in range(m_blocks) for p in range(pairs)]
    expected = [
        (m, p)
        for first in range(0, pairs, section)
        for m in reversed(range(m_blocks))
        for p in range(first, min(first + section, pairs))
    ]
    assert visits == expected


def test_a_candidate_forced_first_is_the_heuristics_choice_within_the_block():
    """select.sm90_candidate_first (the GPU tests' and bench/attention_sdpa.py's way to run one
    candidate) puts a schedule and tile first, and restores the order after."""
    from relax_cutlass.kinds.attention import select

    with select.sm90_candidate_first("pingpong_locked", (128, 128)):
        kernel = choose_attention_kernel(HD64, 90)
        assert (kernel.schedule, kernel.keys_per_block) == ("pingpong_locked", 128)
        assert choose_attention_kernel(HD128, 90).schedule == "pingpong_locked"
    kernel = choose_attention_kernel(HD64, 90)
    assert (kernel.schedule, kernel.keys_per_block) == ("pingpong", 128)
    assert [k.schedule for k in sm90_attention_kernels(HD128, 90)] == list(select.SM90_ATTENTION_SCHEDULES)
    with select.sm90_candidate_first("cooperative", (128, 64)):
        kernel = choose_attention_kernel(HD64, 90)
        assert (kernel.schedule, kernel.keys_per_block) == ("cooperative", 64)
    assert len({(k.schedule, k.keys_per_block) for k in sm90_attention_kernels(HD64, 90)}) == 8
