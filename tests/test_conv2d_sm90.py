"""The conv2d kind's CUTLASS 3.x SM90 kernels (TMA im2col + wgmma) on CPU: which targets and
problems get them and why others do not, the padding TMA needs, the emitted instance and EVT, the
offloaded module's semantics (externs served by the llvm-built composites), candidates and tuning
records. Their nvcc build is in test_nvcc.py, their GPU runs in test_gpu_conv_sm90.py."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import relax_cutlass
from relax_cutlass.kinds.conv2d.profile import conv2d_candidates, split_k_uncertain
from relax_cutlass.kinds.conv2d.records import Conv2dKernel, Conv2dProblem, conv2d_key, conv_family
from relax_cutlass.kinds.conv2d.select import candidate_conv2d_tiles, choose_conv2d_kernel
from relax_cutlass.kinds.conv2d.select_3x import candidate_conv2d_tiles_sm90, tma_conv_fallback_reason, upper_padding
from relax_cutlass.kinds.epilogue import Epilogue
from relax_cutlass.prepare import bind_weights
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing.harness import compare_on_cpu, offload_for_cpu, random_inputs
from relax_cutlass.testing.models import conv2d_epilogue_model, random_weights
from relax_cutlass.toolkit.tuning import TuningDatabase, TuningRecord

RELU = Epilogue(bias=True, activation="relu")
LAYER2 = Conv2dProblem(n=32, h=28, w=28, c=128, k=128, r=3, s=3, p=28, q=28, pad=(1, 1))  # ResNet-50 layer 2


def _bound(mod):
    return bind_weights(mod, random_weights(mod))


@pytest.mark.parametrize(
    "arch,family,want",
    [
        (90, "auto", 90),
        (90, "sm90", 90),
        (90, "sm80", 80),
        (80, "auto", 80),
        (100, "auto", 100),
        (103, "sm100", 100),
        (110, "auto", 100),
        (100, "sm80", 80),
        (120, "auto", 80),
    ],
)
def test_each_target_gets_its_conv_family(arch, family, want):
    """sm_90a: SM90 kernels; sm_100a / sm_103a / sm_110a: SM100 (tcgen05) kernels, stated as not yet
    run on hardware; everything else (and family='sm80'): the SM80 implicit GEMMs."""
    kernel, split = choose_conv2d_kernel(LAYER2, RELU, arch, family=family)
    assert kernel.arch == want and kernel.target == arch and split == 1
    if want != 80:
        assert kernel.name.startswith(f"sm{want}_conv2d") and "_im2col_" in kernel.name
        assert ("not yet run on Blackwell hardware" in kernel.note) == (want == 100)
        assert kernel.note or want == 90
    elif family == "sm80":
        assert kernel.note == "SM80 kernel requested (family='sm80')"
    elif arch == 120:
        assert "no tcgen05" in kernel.note


@pytest.mark.parametrize(
    "change,reason",
    [
        (dict(c=12), "not multiples of 8"),
        (dict(c=64), "narrow TMA im2col rows"),
        (dict(k=36), "not multiples of 8"),
        (dict(groups=2), "ungrouped"),
        (dict(stride=(9, 9), p=7, q=7), "stride"),
        (dict(dilation=(130, 130), pad=(130, 130)), "TMA im2col's limits"),
    ],
)
def test_what_tma_cannot_run_falls_back_to_sm80_with_the_reason(change, reason):
    problem = Conv2dProblem(**(vars(LAYER2) | change))
    assert reason in tma_conv_fallback_reason(problem)
    kernel, _ = choose_conv2d_kernel(problem, Epilogue(bias=True), 90)
    assert kernel.arch == 80 and reason in kernel.note


def test_under_filled_static_batches_keep_the_sm80_split_k_kernel():
    """Batch-1 ResNet stage 4: 4 SM90 tiles cannot fill 132 SMs, the SM80 kernel's split-K can; a
    symbolic batch (never split) and batch 32 take the SM90 kernel."""
    stage4 = dict(h=7, w=7, c=512, k=512, r=3, s=3, p=7, q=7, pad=(1, 1))
    kernel, split = choose_conv2d_kernel(Conv2dProblem(n=1, **stage4), RELU, 90)
    assert kernel.arch == 80 and split > 1 and "under-fills" in kernel.note
    for n in (None, 32):
        kernel, split = choose_conv2d_kernel(Conv2dProblem(n=n, **stage4), RELU, 90)
        assert kernel.arch == 90 and split == 1


def test_shallow_under_filled_convs_keep_the_sm90_kernel_unsplit():
    """DenseNet-121's last dense block at batch 32 (7x7, M=1568): its 1x1 bottleneck convs (K=512
    to 1024) and 3x3 growth convs (K=1152) under-fill the GPU, but a split of them keeps too few
    main-loop iterations a slice: profiled on the H200 the SM80 split ran 1.5-2x slower than the
    SM90 kernel or the unsplit tile, so the heuristic keeps the SM90 kernel."""
    bottleneck = [dict(h=7, w=7, c=c, k=128, r=1, s=1, p=7, q=7) for c in (512, 768, 1024)]
    growth = dict(h=7, w=7, c=128, k=32, r=3, s=3, p=7, q=7, pad=(1, 1))
    for dims, epilogue in [*((d, RELU) for d in bottleneck), (growth, Epilogue())]:
        kernel, split = choose_conv2d_kernel(Conv2dProblem(n=32, **dims), epilogue, 90)
        assert kernel.arch == 90 and split == 1, (dims, kernel.name, split)
        # and a build on the GPU still profiles them by default (profile="uncertain")
        assert "under-fills" in split_k_uncertain(Conv2dProblem(n=32, **dims), 90)


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 60),
    r=st.integers(1, 7),
    stride=st.integers(1, 4),
    dilation=st.integers(1, 3),
    pads=st.tuples(st.integers(0, 4), st.integers(0, 4)),
)
def test_the_upper_padding_reproduces_every_output_size(size, r, stride, dilation, pads):
    """Any top/bottom padding (torch's symmetric one, TF's SAME, the frontends' asymmetric ones):
    CUTLASS 3.x's output size from (top, `upper_padding`) is the model's, so no conv within TMA's
    limits falls back for its padding."""
    top, bottom = pads
    out = (size + top + bottom - dilation * (r - 1) - 1) // stride + 1
    if out < 1:
        return
    problem = Conv2dProblem(
        n=2, h=size, w=size, c=128, k=16, r=r, s=r, p=out, q=out, pad=(top, top),
        stride=(stride, stride), dilation=(dilation, dilation),
    )  # fmt: skip
    assert tma_conv_fallback_reason(problem) is None
    up = upper_padding(problem)[0]
    assert up >= 0 and (size + top + up - dilation * (r - 1) - 1) // stride + 1 == out


def test_sm90_candidates_hold_their_accumulator_in_one_warp_group():
    tiles = candidate_conv2d_tiles_sm90()
    assert {(128, 128, 64), (128, 64, 64), (64, 128, 64), (64, 256, 64)} <= {t.threadblock for t in tiles}
    assert all(t.threadblock[0] * t.threadblock[1] <= 128 * 128 for t in tiles)  # 256x128 would spill
    assert all(conv_family(t) == 90 for t in tiles)


def test_an_sm90_tile_is_an_sm90_kernel_and_never_grouped():
    tile = candidate_conv2d_tiles_sm90()[0]
    sm80 = Conv2dKernel(LAYER2, RELU, candidate_conv2d_tiles("float32")[0])
    assert sm80.arch == 80
    assert Conv2dKernel(LAYER2, RELU, tile).arch == 90 and dataclasses.replace(sm80, tile=tile).arch == 90
    assert dataclasses.replace(Conv2dKernel(LAYER2, RELU, tile), tile=sm80.tile).arch == 80
    with pytest.raises(ValueError, match="ungrouped"):
        Conv2dKernel(Conv2dProblem(**(vars(LAYER2) | {"groups": 2})), RELU, tile)


@pytest.mark.parametrize(
    "epilogue,parts",
    [
        (Epilogue(), ["Sm90AccFetch"]),
        (RELU, ["Sm90RowBroadcast<0, TileShape", "ReLu"]),
        (
            Epilogue(bias=True, activation="silu", residual=True, residual_activation="relu"),
            ["Sm90RowBroadcast", "RelaxCutlassSilu16", "Sm90SrcFetch<cutlass::half_t>", "ReLu"],
        ),
    ],
)
def test_emitted_instance_is_a_conv_universal_with_the_evt(epilogue, parts):
    kernel, _ = choose_conv2d_kernel(LAYER2, epilogue, 90)
    text = emit_kernel(kernel).text
    for part in [
        "cutlass::conv::collective::CollectiveBuilder",
        "cutlass::conv::Operator::kFprop",
        "cutlass::conv::KernelImplicitTmaWarpSpecializedSm90",
        "cutlass::conv::device::ConvUniversalAdapter",
        "cute::Shape<cute::_128, cute::_128, cute::Shape<cute::_64>>",
        *parts,
    ]:
        assert part in text, part
    assert ("ElementC = cutlass::half_t" in text) == epilogue.residual
    assert "Sm90SrcFetch" not in text or epilogue.residual


@pytest.mark.parametrize("residual", [False, True])
def test_sm90_offloaded_module_matches_the_original(residual):
    # a 1x1 conv: too short a main loop for the SM80 kernel's split-K
    mod = _bound(conv2d_epilogue_model(2, 9, 10, 128, 136, kernel=1, padding=0, activation="gelu", residual=residual))
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod), arch="sm_90a")
    (row,) = relax_cutlass.offload_report(rewritten).offloaded
    assert row["family"] == "sm90" and row["kernel"].startswith("sm90_conv2d"), row


def test_report_states_the_fallback_for_odd_channels():
    mod = _bound(conv2d_epilogue_model(2, 8, 8, 12, 16, activation="relu"))
    _, rewritten = offload_for_cpu(mod, arch="sm_90a")
    (row,) = relax_cutlass.offload_report(rewritten).offloaded
    assert row["family"] == "sm80" and "TMA needs 16-byte rows" in row["note"]


def test_profiling_times_both_families_and_honours_an_sm90_record(tmp_path):
    candidates = conv2d_candidates(LAYER2, 90, 6)
    families = [conv_family(t) for t, _ in candidates]
    assert families[0] == 90 and families.count(80) >= 2 and families.count(90) >= 2
    assert conv2d_key(LAYER2, 90, 90) != conv2d_key(LAYER2, 90)  # SM80-only records do not stand for it
    db = TuningDatabase(tmp_path / "t.jsonl")
    label = next(t.describe() for t, _ in candidates[1:] if conv_family(t) == 90)
    db.add([TuningRecord(conv2d_key(LAYER2, 90, 90), label, 0.02)])
    kernel, split = choose_conv2d_kernel(LAYER2, RELU, 90, db=db)
    assert kernel.selected_by == "tuned" and kernel.tile.describe() == label and kernel.arch == 90 and split == 1
    # family='sm80' looks up the SM80-only record (none here): the heuristic's SM80 kernel
    kernel, _ = choose_conv2d_kernel(LAYER2, RELU, 90, family="sm80", db=db)
    assert kernel.arch == 80 and kernel.selected_by == "heuristic"
