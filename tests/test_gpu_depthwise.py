"""Depthwise conv2d kernels on the GPU, built in-process as a user on a GPU machine builds them (the
GPU host with the full TVM bundle): every filter size, stride, dilation and epilogue the kind
takes, odd shapes included, against torch float64 on the same fp16 inputs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)

import relax_cutlass  # noqa: E402

# (N, H=W, C, R, stride, dilation, bias, activation); groups == C == K: MobileNetV3's 3x3/5x5 (s1, s2) with relu or
# hardswish, ConvNeXt's 7x7 + bias, a dilated one (run-time stride kernel), odd sizes, C = 8
CASES = [
    (4, 56, 64, 3, 1, 1, True, "relu"),
    (4, 28, 72, 5, 2, 1, True, "hardswish"),
    (2, 56, 96, 7, 1, 1, True, "identity"),
    (2, 15, 24, 3, 2, 1, False, "silu"),
    (1, 17, 8, 3, 1, 2, True, "gelu"),
    (3, 7, 768, 7, 1, 1, True, "identity"),
    (1, 33, 40, 5, 1, 1, True, "relu"),
    # MobileNetV3-Large's at batch 32, where CTAs take several tiles each (its 3x3 stride-1 ones
    # must not: one tile per CTA, DirectConvTile.one_tile_per_cta; they gave inf before)
    (32, 112, 16, 3, 1, 1, True, "relu"),
    (32, 14, 200, 3, 1, 1, True, "hardswish"),
    (32, 56, 64, 3, 2, 1, True, "relu"),
    (32, 28, 120, 5, 1, 1, True, "relu"),
    (32, 14, 672, 5, 2, 1, True, "hardswish"),
    (8, 56, 96, 7, 1, 1, True, "identity"),
]
# as gpu_convs' cases: (N, H=W, C, K, groups, R, stride, dilation, bias, activation)
CONVS = [(n, hw, c, c, c, *rest) for n, hw, c, *rest in CASES]


def test_depthwise_kernels_match_torch_float64():
    mod, inputs, expected = gpu_convs.module_and_references(CONVS)
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    report = relax_cutlass.offload_report(offloaded)
    assert len(report.offloaded) == len(CASES) and not report.left_in_tvm, str(report)
    gpu_convs.assert_outputs_match(offloaded, CONVS, inputs, expected)


def test_symbolic_batch_launches_every_tile():
    """A 3x3 stride-1 conv (one tile per CTA) with a symbolic batch: the glue counts the tiles at
    run time, at batch 3 and at batch 32 from one library."""
    mod, sample = gpu_convs.symbolic_batch_module((None, 56, 24, 24, 24, 3, 1, 1, True, "relu"))
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    assert [r["op"] for r in relax_cutlass.offload_report(offloaded).offloaded] == ["dwconv2d"]
    gpu_convs.assert_symbolic_batch_runs(offloaded, sample)
