"""Grouped conv2d kernels on the GPU (CUTLASS's kSingleGroup / kMultipleGroup implicit GEMMs), built
in-process as a user on a GPU machine builds them (the GPU host with the full TVM bundle): every
grouped conv of ResNeXt-50 32x4d and odd ones (2 channels per group, C != K, a group's channels not
a multiple of the K tile, dilation, 5x5 and 1x1 filters, the single-group kernels) against torch
float64 on the same fp16 inputs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

import relax_cutlass  # noqa: E402
from relax_cutlass.kinds.conv2d.supergroups import super_group_size  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)

# (N, H=W, C, K, groups, R, stride, dilation, bias, activation)
CASES = [
    # ResNeXt-50 32x4d at batch 8: 4, 8, 16, 32 channels per group, each stage's stride-2 first block
    (8, 56, 128, 128, 32, 3, 1, 1, True, "relu"),
    (8, 56, 256, 256, 32, 3, 2, 1, True, "relu"),
    (8, 28, 256, 256, 32, 3, 1, 1, True, "relu"),
    (8, 28, 512, 512, 32, 3, 2, 1, True, "relu"),
    (8, 14, 512, 512, 32, 3, 1, 1, True, "relu"),
    (8, 14, 1024, 1024, 32, 3, 2, 1, True, "relu"),
    (8, 7, 1024, 1024, 32, 3, 1, 1, True, "relu"),
    # ResNeXt-50's last stage at batch 1: few CTAs
    (1, 7, 1024, 1024, 32, 3, 1, 1, True, "relu"),
    # 128, 64 and 256 output channels per group: the heuristic keeps one group per CTA on SM80/SM90
    # (kSingleGroup, the optimized iterators)
    (4, 28, 256, 256, 2, 3, 1, 1, True, "silu"),
    (2, 14, 128, 128, 2, 3, 1, 1, False, "identity"),
    # 2 channels per group (2-element vectors), odd size, stride 2
    (2, 17, 64, 64, 32, 3, 2, 1, True, "hardswish"),
    # C != K: 16 input and 64 output channels per group
    (2, 20, 64, 256, 4, 3, 1, 1, True, "relu"),
    # 48 input channels per group: the K tile's second chunk reads the next group's channels, which
    # must meet zero filter columns
    (2, 12, 96, 128, 2, 3, 1, 1, True, "relu"),
    # 32 per group, 5x5 dilated, odd size
    (3, 15, 96, 96, 3, 5, 1, 2, True, "gelu"),
    # a grouped 1x1 conv, 256 output channels per group
    (1, 8, 512, 512, 2, 1, 1, 1, True, "identity"),
]


def test_grouped_kernels_match_torch_float64():
    mod, inputs, expected = gpu_convs.module_and_references(CASES)
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    report = relax_cutlass.offload_report(offloaded)
    assert len(report.offloaded) == len(CASES) and not report.left_in_tvm, str(report)
    # Bound filters with fewer than 64 output channels per group are merged into super-groups of
    # 64 (block-diagonal filters, supergroups.py), which run on the single-group kernels.
    rows = {(*r["shapes"]["data"], r["shapes"]["weight"][0]): r for r in report.offloaded}
    for n, hw, c, k, groups, *_ in CASES:
        row = rows[(n, hw, hw, c, k)]
        merged = groups // super_group_size(groups, k)
        assert row["conv"]["groups"] == merged and "_multiplegroup_" not in row["kernel"], row
    assert any("_singlegroup_" in r["kernel"] for r in report.offloaded), str(report)
    gpu_convs.assert_outputs_match(offloaded, CASES, inputs, expected)


def test_multiple_group_kernels_with_filters_given_at_run_time():
    """Filters passed at run time keep their groups: narrow ones run on the kMultipleGroup kernels
    (ResNeXt's 4 and 32 per group, 2 per group, 48 input channels per group)."""
    cases = [case for case in CASES if case[3] // case[4] < 64]
    mod, inputs, expected = gpu_convs.module_and_references(cases, runtime_filters=True)
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    report = relax_cutlass.offload_report(offloaded)
    assert len(report.offloaded) == len(cases) and not report.left_in_tvm, str(report)
    assert all("_multiplegroup_" in r["kernel"] for r in report.offloaded), str(report)
    gpu_convs.assert_outputs_match(offloaded, cases, inputs, expected)


def test_symbolic_batch_grouped_conv():
    """ResNeXt's stage-1 conv (4 channels per group: two super-groups of 64) with a symbolic batch:
    one library at batch 3 and at batch 32."""
    mod, sample = gpu_convs.symbolic_batch_module((None, 56, 128, 128, 32, 3, 1, 1, True, "relu"))
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    (row,) = relax_cutlass.offload_report(offloaded).offloaded
    assert row["mnk"][0] == "dynamic" and row["conv"]["groups"] == 2 and "_singlegroup_" in row["kernel"]
    gpu_convs.assert_symbolic_batch_runs(offloaded, sample)
