"""Grouped conv2d (1 < groups, not depthwise) in the conv2d kind: CUTLASS's grouped fprop kernels
(kSingleGroup / kMultipleGroup), and narrow groups with bound filters merged into 64-channel
super-groups (supergroups.py). Legality and the reasons of what stays in TVM, the kernel choice
for ResNeXt-50's convs, semantics on the CPU (regions served by their llvm-built composites), the
numpy reference, the C++ and the profiler's plan; and real nvcc builds of one kernel per mode."""

from __future__ import annotations

import numpy as np
import pytest

import relax_cutlass
from relax_cutlass.kinds.conv2d.groups import group_mode, grouped_conv_problems, iterator_for
from relax_cutlass.kinds.conv2d.records import Conv2dKernel, Conv2dProblem, conv2d_key
from relax_cutlass.kinds.conv2d.select import choose_conv2d_kernel, conv2d_tiles, grouped_tile_widths
from relax_cutlass.kinds.conv2d.supergroups import block_diagonal, super_group_size
from relax_cutlass.kinds.epilogue import Epilogue
from relax_cutlass.prepare import bind_weights
from relax_cutlass.testing.harness import compare_on_cpu, offload_for_cpu, random_inputs
from relax_cutlass.testing.models import conv2d_epilogue_model, random_weights

RELU = Epilogue(bias=True, activation="relu")


def _bound(mod):
    return bind_weights(mod, random_weights(mod))


# ResNeXt-50 32x4d's grouped 3x3 convs (32 groups) at a 224x224 input, as (C = K, input H = W,
# stride): per stage, the first block's (stride 2 after stage 1) and the other blocks'.
RESNEXT50_GROUPED = ((128, 56, 1), (256, 56, 2), (256, 28, 1), (512, 28, 2), (512, 14, 1), (1024, 14, 2), (1024, 7, 1))


def resnext50_grouped_convs(batch: int) -> list[Conv2dProblem]:
    convs = []
    for width, size, stride in RESNEXT50_GROUPED:
        out = (size + 2 - 3) // stride + 1
        convs.append(
            Conv2dProblem(batch, size, size, width, width, 3, 3, out, out, (1, 1), (stride, stride), groups=32)
        )
    return convs


@pytest.mark.parametrize(
    "groups,k,tile_n,mode",
    [
        (1, 64, 128, "none"),
        (32, 128, 64, "multiple"),  # 4 output channels per group: 16 groups per CTA
        (2, 256, 64, "single"),  # 128 per group: two CTAs per group
        (2, 256, 128, "single"),  # exactly one CTA per group: the optimized iterators
        (2, 256, 256, "multiple"),
        (2, 96, 64, None),  # 48 per group: a 64-wide tile would straddle two groups
    ],
)
def test_group_mode_follows_the_tile_width(groups, k, tile_n, mode):
    assert group_mode(groups, k, tile_n) == mode
    if mode is not None:
        assert iterator_for(mode, 3, 3) == ("analytic" if mode == "multiple" else "optimized")
    assert iterator_for("single", 33, 1) == "analytic"  # the optimized iterator's 32 mask bits


def test_every_resnext50_grouped_conv_gets_a_legal_kernel():
    """4, 8, 16 and 32 channels per group: narrower than every CTA tile (64, 128, 256), so the
    multiple-group kernels, 64 wide (the fewest groups per CTA: its main loop runs once per group);
    4 channels per group read in 4-element vectors."""
    assert grouped_tile_widths("float16") == {64, 128, 256}
    for batch in (1, 32):
        for arch in (80, 90):
            for problem in resnext50_grouped_convs(batch):
                assert not grouped_conv_problems(problem.c, problem.k, 32, grouped_tile_widths("float16"))
                kernel, split = choose_conv2d_kernel(problem, RELU, arch)
                assert (kernel.group_mode, kernel.iterator, split) == ("multiple", "analytic", 1), kernel.name
                assert kernel.tile.threadblock[1] == 64 and kernel.tile.threadblock[2] == 32
                assert problem.alignment == (4 if problem.c == 128 else 8)
                assert f"_a{problem.alignment}_analytic_multiplegroup_" in kernel.name


def test_wide_groups_take_the_single_group_kernels():
    """128 output channels per group (two groups of 256): tiles 64 or 128 wide stay within a group
    (optimized iterators), a 256-wide one spans both; the heuristic keeps one group per CTA."""
    problem = Conv2dProblem(8, 28, 28, 256, 256, 3, 3, 28, 28, (1, 1), groups=2)
    modes = {t.threadblock[1]: Conv2dKernel(problem, RELU, t).group_mode for t in conv2d_tiles(problem, 80)}
    assert modes == {64: "single", 128: "single", 256: "multiple"}
    kernel, split = choose_conv2d_kernel(problem, RELU, 80)
    assert kernel.group_mode == "single" and kernel.iterator == "optimized" and split == 1


def test_a_kernel_record_refuses_what_its_tile_cannot_run():
    problem = Conv2dProblem(1, 8, 8, 96, 96, 3, 3, 8, 8, (1, 1), groups=2)  # 48 per group
    (tile, *_) = conv2d_tiles(Conv2dProblem(1, 8, 8, 96, 96, 3, 3, 8, 8, (1, 1)), 80)
    with pytest.raises(ValueError, match="no grouped conv2d kernel for .* straddles the groups of K/groups=48"):
        Conv2dKernel(problem, Epilogue(), tile)
    grouped = Conv2dProblem(1, 8, 8, 64, 64, 3, 3, 8, 8, (1, 1), groups=4)
    with pytest.raises(ValueError, match="no grouped fprop kernel with the residual-block epilogue"):
        Conv2dKernel(grouped, Epilogue(residual=True), conv2d_tiles(grouped, 80)[0])


@pytest.mark.parametrize(
    "c,k,groups,reason,merged_groups",
    [
        (32, 48, 2, "K/groups=24 output channels per group", 1),  # 24 neither divides nor is a multiple of 64
        (24, 24, 8, "C/groups=3 input channels per group", 1),
        (32, 64, 32, "C/groups=1 input channels per group", 1),  # a depthwise multiplier of 2
        (16, 18, 2, "K/groups=9 output channels per group", 1),
        (18, 9, 3, "K=9 must both be even", None),  # 3 per group fit no tile either
    ],
)
def test_grouped_convs_the_kernels_cannot_run_stay_in_tvm_with_the_reason(c, k, groups, reason, merged_groups):
    """With the filter given at run time, the grouped kernels' rules decide; a bound filter is
    merged into super-groups first (here all groups: a dense block-diagonal conv, which takes even
    channel counts of any width), so only an odd K keeps the conv in TVM then."""
    mod = conv2d_epilogue_model(2, 8, 8, c, k, groups=groups, activation="relu")
    partitioned, _ = offload_for_cpu(mod)
    report = relax_cutlass.offload_report(partitioned)
    assert not report.offloaded
    (row,) = report.left_in_tvm
    assert row["op"] == "conv2d" and any(reason in r for r in row["reasons"]), row
    bound = _bound(mod)
    _, _, rewritten = compare_on_cpu(bound, random_inputs(bound))
    report = relax_cutlass.offload_report(rewritten)
    assert [r["conv"]["groups"] for r in report.offloaded] == ([] if merged_groups is None else [merged_groups])


def test_rules_relax_enforces_before_them_still_hold():
    """Depthwise convs are the depthwise kind's; channel counts that are not multiples of groups
    (Relax's type inference refuses those already) are refused by CUTLASS's can_implement too."""
    assert grouped_conv_problems(32, 32, 32, {64}) == ["a depthwise conv2d (groups == C == K): the depthwise kind's"]
    assert grouped_conv_problems(30, 32, 4, {64}) == ["C=30 and K=32 must be multiples of groups=4"]


@pytest.mark.parametrize(
    "case",
    [
        dict(c=32, k=32, groups=8, activation="relu"),  # ResNeXt's 4 channels per group, 64-wide tile
        dict(c=64, k=64, groups=4, stride=2, activation="silu"),  # 16 per group, stride 2
        dict(c=256, k=128, groups=2, activation="identity", hw=5),  # 64 per group: single-group kernel
        dict(c=48, k=96, groups=3, kernel=(1, 3), padding=(0, 1, 0, 1), dilation=2, activation="gelu"),
        dict(c=32, k=64, groups=4, kernel=3, padding=(1, 0, 2, 1), bias=False),  # asymmetric padding
        dict(c=64, k=64, groups=32, stride=2, activation="hardswish", hw=11),  # 2 per group: 2-element vectors
    ],
    ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()),
)
@pytest.mark.parametrize("bound", [True, False], ids=["bound", "runtime_filter"])
def test_grouped_convs_match_the_original(case, bound):
    """Bound filters of narrow groups are merged into 64-channel super-groups (block-diagonal);
    filters given at run time keep their groups (kMultipleGroup kernels where groups are narrow)."""
    case = dict(case)
    hw = case.pop("hw", 9)
    c, k = case.pop("c"), case.pop("k")
    mod = conv2d_epilogue_model(2, hw, hw + 1, c, k, **case)
    mod = _bound(mod) if bound else mod
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod))
    report = relax_cutlass.offload_report(rewritten)
    (row,) = report.offloaded
    groups = case["groups"] // super_group_size(case["groups"], k) if bound else case["groups"]
    assert row["op"] == "conv2d" and row["conv"]["groups"] == groups and not report.left_in_tvm
    assert ("group_" in row["kernel"]) == (groups > 1)
    if bound:
        assert "multiplegroup" not in row["kernel"]  # a super-group fills whole 64-wide tiles
    if groups > 1:
        assert row["conv"]["split_k"] == 1 and f"groups {groups}" in str(report)


def test_super_groups():
    # (groups, K) -> groups merged: 64 channels at least, whole tiles, or all of them
    assert [super_group_size(32, k) for k in (128, 256, 512, 1024, 2048)] == [16, 8, 4, 2, 1]
    assert super_group_size(2, 96) == 2  # 48 per group: 4 groups would make 192, not a divisor of 2
    assert super_group_size(8, 192) == 8 and super_group_size(16, 384) == 8  # 24 per group: 8 -> 192
    rng = np.random.default_rng(0)
    filters = rng.uniform(-1, 1, (16, 3, 3, 2)).astype("float16")  # 8 groups of 2 -> 2 groups of 4
    merged = block_diagonal(filters, 8, 4)
    assert merged.shape == (16, 3, 3, 8)
    for out in range(16):
        group = out // 2
        place = group % 4
        assert (merged[out, :, :, 2 * place : 2 * place + 2] == filters[out]).all()
        assert np.count_nonzero(np.delete(merged[out], np.s_[2 * place : 2 * place + 2], axis=-1)) == 0


def test_symbolic_batch_grouped_conv_matches_for_several_batches():
    """A run-time filter keeps the groups: ResNeXt's 4 per group on the kMultipleGroup kernels."""
    mod = conv2d_epilogue_model("n", 8, 8, 64, 64, groups=16, activation="relu")
    for n in (1, 3):
        _, _, rewritten = compare_on_cpu(mod, random_inputs(mod, n=n))
    (row,) = relax_cutlass.offload_report(rewritten).offloaded
    assert row["mnk"] == ["dynamic", 64, 4 * 9] and "multiplegroup" in row["kernel"]
    bound = _bound(mod)
    _, _, rewritten = compare_on_cpu(bound, random_inputs(bound, n=2))
    (row,) = relax_cutlass.offload_report(rewritten).offloaded
    assert row["mnk"] == ["dynamic", 64, 64 * 9] and row["conv"]["groups"] == 1  # 16 groups of 4: one dense conv


def test_a_residual_after_a_grouped_conv_stays_in_tvm_and_the_conv_is_offloaded():
    """No grouped kernel fuses a residual: the conv + bias + relu is offloaded, the add stays."""
    mod = conv2d_epilogue_model(2, 8, 8, 128, 128, groups=8, activation="relu", residual=True)
    for bound in (False, True):  # 16 per group; bound: 2 super-groups of 64, still grouped
        case = _bound(mod) if bound else mod
        _, _, rewritten = compare_on_cpu(case, random_inputs(case))
        report = relax_cutlass.offload_report(rewritten)
        (row,) = report.offloaded
        assert row["epilogue"] == "bias+relu" and not report.left_in_tvm
        assert row["conv"]["groups"] == (2 if bound else 8)
        (refused,) = report.not_fused
        assert "no grouped fprop kernel with the residual-block epilogue" in refused["refused"][0]["reasons"][0]


def test_resnext_from_torch_offloads_every_conv():
    """ResNeXt-50 32x4d with one bottleneck per stage, written in PyTorch (the builder is
    torchvision's resnext50_32x4d: same parameter count) through torch.export: batch norm folded,
    NHWC, and all 4 grouped convs (4, 8, 16, 32 channels per group; strides 1, 2, 2, 2) offloaded with
    their bias + relu, as 64-channel super-groups, next to the 13 ungrouped convs and the classifier."""
    torch_models = pytest.importorskip(
        "relax_cutlass.testing.models.torch_models", reason="needs the 'models' extra (torch)"
    )
    from relax_cutlass.prepare import bind_float16

    full = torch_models.resnet50(groups=32, width_per_group=4)
    assert sum(p.numel() for p in full.parameters()) == 25_028_904
    mod, weights = torch_models.import_exported(
        torch_models.resnet50(groups=32, width_per_group=4, blocks=(1, 1, 1, 1), num_classes=10),
        (torch_models.import_torch().zeros(1, 3, 32, 32),),
    )
    mod = bind_float16(mod, weights)
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod))
    report = relax_cutlass.offload_report(rewritten)
    grouped = [r for r in report.offloaded if r["op"] == "conv2d" and r["conv"]["groups"] > 1]
    assert [r["shapes"]["data"][-1] for r in grouped] == [128, 256, 512, 1024]
    assert [r["conv"]["stride"] for r in grouped] == [[1, 1], [2, 2], [2, 2], [2, 2]]
    # 4, 8, 16, 32 per group: super-groups of 64 channels, on the single-group kernels
    assert [r["conv"]["groups"] for r in grouped] == [2, 4, 8, 16]
    assert all(r["epilogue"] == "bias+relu" and "singlegroup" in r["kernel"] for r in grouped)
    assert sum(r["op"] == "conv2d" for r in report.offloaded) == 17
    assert not report.left_in_tvm and report.offloaded_flop_fraction == 1


@pytest.mark.parametrize(
    "geometry",
    [
        dict(groups=4, stride=1, dilation=1, pad=(1, 1)),
        dict(groups=8, stride=2, dilation=1, pad=(1, 0)),
        dict(groups=2, stride=1, dilation=2, pad=(2, 2)),
        dict(groups=1, stride=2, dilation=1, pad=(0, 1)),
    ],
)
def test_reference_is_torchs_grouped_conv(geometry):
    """The kind's numpy reference (no CUDA here: its im2col path) against torch's float64 conv."""
    import torch

    from relax_cutlass.kinds.conv2d.reference import conv2d_reference

    groups, stride, dilation, (pad_h, pad_w) = (geometry[k] for k in ("groups", "stride", "dilation", "pad"))
    n, h, w, c, k, r = 2, 9, 7, 16, 24, 3
    p = (h + 2 * pad_h - dilation * (r - 1) - 1) // stride + 1
    q = (w + 2 * pad_w - dilation * (r - 1) - 1) // stride + 1
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (n, h, w, c)).astype("float16")
    wt = rng.uniform(-1, 1, (k, r, r, c // groups)).astype("float16")
    got = conv2d_reference(x, wt, [n, h, w, c, k, r, r, p, q, pad_h, pad_w, stride, stride, dilation, dilation, groups])
    want = torch.nn.functional.conv2d(
        torch.from_numpy(x).double().permute(0, 3, 1, 2), torch.from_numpy(wt).double().permute(0, 3, 1, 2),
        stride=stride, padding=(pad_h, pad_w), dilation=dilation, groups=groups,
    ).permute(0, 2, 3, 1).numpy()  # fmt: skip
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def _region(mod):
    from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
    from relax_cutlass.stages.constants import offloaded_functions

    partitioned, _ = offload_for_cpu(mod)
    (region,) = plan_regions([f for _, f in offloaded_functions(partitioned)], CodegenOptions())
    return region


def test_grouped_kernel_and_glue_sources():
    """The kernel is cutlass_library's DefaultConv2dGroupFprop instance; the glue checks the filter's
    C/groups channels and passes the group count, never a split-K."""
    from relax_cutlass.stages.emit import emit_glue, emit_kernel

    # the filter given at run time: a bound one would be merged into one dense conv (supergroups.py)
    region = _region(conv2d_epilogue_model(2, 8, 8, 64, 64, groups=16, activation="relu", layout="NHWC"))
    source = emit_kernel(region.kernel)
    assert source.family == "sm80"  # the SASS guard expects HMMA
    text = source.text
    assert "DefaultConv2dGroupFprop" in text and "cutlass::conv::GroupMode::kMultipleGroup" in text
    assert "IteratorAlgorithm::kAnalytic" in text and "p->c / p->groups" in text
    glue = emit_glue([region], "m").text
    assert 'CheckDim(fn, "weight I", weight->shape[3], 4, weight)' in glue
    assert "1, 1, 1, 1, 16, 1," in glue  # ... stride, dilation, groups=16, split_k=1
    ungrouped = emit_kernel(_region(_bound(conv2d_epilogue_model(2, 8, 8, 64, 64, layout="NHWC"))).kernel).text
    assert "DefaultConv2dGroupFprop" not in ungrouped and "default_conv2d_group_fprop.h" not in ungrouped


def test_profiling_a_grouped_conv_times_legal_unsplit_kernels(tmp_path):
    """Stage 1 times the heuristic's kernel and the next-ranked tiles, each in the group mode its
    width gives, never split; the key and the runner's shape carry the group count; stage 2 picks
    from the same legal tiles."""
    from relax_cutlass.kinds import kind_named
    from relax_cutlass.stages.profile import plan_epilogue_jobs, plan_jobs
    from relax_cutlass.toolkit.tuning import TuningDatabase, TuningRecord

    problem = Conv2dProblem(1, 14, 14, 256, 256, 3, 3, 14, 14, (1, 1), groups=2)  # 128 per group
    tiles = conv2d_tiles(problem, 80)
    (job,) = plan_jobs([problem], 80, limit=len(tiles))
    assert len(job.candidates) == len(tiles) and all(split == 1 for _, split in job.candidates)
    # a 256-wide CTA spans both groups, narrower ones stay within one
    assert all(k.group_mode == ("multiple" if k.tile.threadblock[1] == 256 else "single") for k in job.kernels)
    assert {k.group_mode for k in job.kernels} == {"single", "multiple"}
    assert job.key.geometry[-1] == 2 and len(conv2d_key(Conv2dProblem(1, 8, 8, 8, 8, 3, 3, 8, 8), 80).geometry) == 6
    assert kind_named("conv2d").profiling.job_fields(job)["conv"][15] == 2
    labels = [job_kernel.tile.describe() for job_kernel, _ in job.candidates]
    db = TuningDatabase(tmp_path / "t.jsonl")
    timings = {label: 0.01 + 0.001 * i for i, label in enumerate(reversed(labels))}
    db.add([TuningRecord(job.key, labels[-1], 0.01, candidates=timings, device="g", heuristic=labels[0])])
    tuned, split = choose_conv2d_kernel(problem, Epilogue(), 80, db=db)
    assert tuned.selected_by == "tuned" and tuned.tile.describe() == labels[-1] and split == 1
    (stage2,) = plan_epilogue_jobs([(problem, RELU)], 80, db, top_k=3)
    assert len(stage2.candidates) == 4 and all(split == 1 for _, split in stage2.candidates)
    assert all(k.group_mode == group_mode(2, 256, k.tile.threadblock[1]) for k in stage2.kernels)


@pytest.mark.nvcc
def test_grouped_kernels_of_both_modes_compile_with_tensor_core_mma():
    """ResNeXt's 4-channels-per-group conv (kMultipleGroup, analytic, 4-element vectors, bias + relu)
    and a 128-per-group one (kSingleGroup, optimized, bias + silu), built for sm_80: HMMA in their
    SASS (compile_all's guard checks the "sm80" family too). About 1-2 minutes each on 2 cores."""
    from relax_cutlass.stages.emit import emit_kernel
    from relax_cutlass.toolkit.compile import compile_all
    from relax_cutlass.toolkit.sass_check import mma_counts

    multiple, _ = choose_conv2d_kernel(resnext50_grouped_convs(1)[0], RELU, 80)
    single_problem = Conv2dProblem(8, 28, 28, 256, 256, 3, 3, 28, 28, (1, 1), groups=2)
    single, _ = choose_conv2d_kernel(single_problem, Epilogue(bias=True, activation="silu"), 80)
    assert (multiple.group_mode, single.group_mode) == ("multiple", "single")
    objects = compile_all([emit_kernel(multiple), emit_kernel(single)], 80)
    for kernel in (multiple, single):
        obj, _ = objects[kernel.name]
        counts, sass, _ = mma_counts(obj, ("HMMA",))
        assert sass == ["sm_80"] and counts["HMMA"] > 0, (kernel.name, counts)
