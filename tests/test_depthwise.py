"""The depthwise conv2d kind (groups == C == K): patterns, legality, the offload report and
semantics on the CPU (regions served by their llvm-built composites), and real nvcc builds of its
CUTLASS direct-convolution kernels."""

from __future__ import annotations

import numpy as np
import pytest
from harness import compare_on_cpu
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.depthwise_conv2d.records import DepthwiseProblem
from relax_cutlass.kinds.depthwise_conv2d.select import choose_depthwise_kernel
from relax_cutlass.kinds.epilogue import Epilogue


@pytest.fixture(autouse=True)
def depthwise_kind():
    """The kind is opt-in until its kernels have run on a GPU."""
    from relax_cutlass import kinds

    yield kinds.enable("depthwise_conv2d")
    kinds.unregister("depthwise_conv2d")


def test_depthwise_kind_is_opt_in_and_the_report_says_how_to_enable_it():
    from relax_cutlass import kinds

    kinds.unregister("depthwise_conv2d")
    mod = depthwise_module()
    _, _, rewritten = compare_on_cpu(mod, [_input(mod)])
    (row,) = relax_cutlass.offload_report(rewritten).left_in_tvm
    assert row["op"] == "conv2d" and "kinds.enable('depthwise_conv2d')" in row["reasons"][0]


ACTIVATIONS = {"identity": None, "relu": relax.op.nn.relu, "silu": relax.op.nn.silu, "gelu": relax.op.nn.gelu}


def depthwise_module(c=32, r=3, stride=1, dilation=1, activation="relu", bias=True, n=2, hw=16, groups=None):
    """x (n, hw, hw, c) fp16 -> depthwise conv2d NHWC/OHWI, "same" padding [+ bias] [-> activation]."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, hw, hw, c), "float16"))
    rng = np.random.default_rng(0)
    groups = groups or c
    w = relax.const((rng.uniform(-1, 1, (c, r, r, c // groups)) / r).astype("float16"))
    b = relax.const(rng.uniform(-1, 1, (c,)).astype("float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x, w, strides=stride, padding=dilation * (r // 2), dilation=dilation, groups=groups,
                    data_layout="NHWC", kernel_layout="OHWI", out_dtype="float16",
                )
            )  # fmt: skip
            if bias:
                y = bb.emit(relax.op.add(y, b))
            if ACTIVATIONS[activation] is not None:
                y = bb.emit(ACTIVATIONS[activation](y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _input(mod):
    shape = [int(d) for d in mod["main"].params[0].ty.shape]
    return np.random.default_rng(1).uniform(-1, 1, shape).astype("float16")


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"r": 5, "stride": 2, "activation": "silu"},
        {"r": 7, "activation": "gelu", "hw": 14},  # ConvNeXt's 7x7
        {"r": 3, "dilation": 2, "bias": False, "activation": "identity"},  # the run-time-stride kernel
        {"c": 72, "hw": 15, "stride": 2},  # odd spatial size, C not a multiple of the 64-channel tile
    ],
)
def test_depthwise_conv_is_offloaded_with_its_epilogue(options):
    mod = depthwise_module(**options)
    _, _, rewritten = compare_on_cpu(mod, [_input(mod)])
    report = relax_cutlass.offload_report(rewritten)
    (row,) = report.offloaded
    assert row["op"] == "dwconv2d" and not report.left_in_tvm and not report.not_fused, str(report)
    bias, activation = options.get("bias", True), options.get("activation", "relu")
    assert row["epilogue"] == Epilogue(bias=bias, activation=activation).describe()
    assert row["family"] == "sm80" and "SIMT direct convolution" in row["note"]


@pytest.mark.parametrize(
    "options,reason",
    [
        ({"c": 12}, "C=12 must be a multiple of 8"),
        ({"r": 9}, "9x9 filter is larger than"),
    ],
)
def test_depthwise_conv_the_kernel_cannot_run_stays_in_tvm_with_the_reason(options, reason):
    mod = depthwise_module(**options)
    _, _, rewritten = compare_on_cpu(mod, [_input(mod)])
    report = relax_cutlass.offload_report(rewritten)
    assert not report.offloaded
    (row,) = report.left_in_tvm
    assert row["op"] == "dwconv2d" and reason in row["reasons"][0], row


def test_grouped_conv_is_reported_by_the_conv2d_kind_and_stays_in_tvm():
    mod = depthwise_module(c=32, groups=4)
    _, _, rewritten = compare_on_cpu(mod, [_input(mod)])
    (row,) = relax_cutlass.offload_report(rewritten).left_in_tvm
    assert row["op"] == "conv2d" and "grouped conv2d" in row["reasons"][0]


@pytest.mark.parametrize("r,stride,dilation,hw", [(3, 1, 1, 16), (5, 2, 1, 15), (7, 1, 1, 14), (3, 2, 2, 17)])
def test_reference_is_tvms_depthwise_conv(r, stride, dilation, hw):
    """The kind's numpy reference against TVM's llvm build of the same conv2d (no epilogue)."""
    from harness import build_cpu, run_vm

    from relax_cutlass.kinds.depthwise_conv2d.reference import depthwise_reference

    mod = depthwise_module(c=16, r=r, stride=stride, dilation=dilation, hw=hw, bias=False, activation="identity")
    x = _input(mod)
    got = run_vm(build_cpu(mod), [x]).astype("float32")
    conv = mod["main"].body.blocks[0].bindings[0].value
    w = conv.args[1].value.numpy()
    pad = dilation * (r // 2)
    want = depthwise_reference(x, w, got.shape[1:3], (pad, pad), (stride, stride), (dilation, dilation))
    assert np.abs(got - want).max() < 1e-2 * np.abs(want).max()


def test_kernel_choice_by_filter_size_and_geometry():
    small = DepthwiseProblem(32, 56, 56, 96, 3, 3, 56, 56, (1, 1))
    kernel, split = choose_depthwise_kernel(small, Epilogue(bias=True), 90)
    assert (kernel.tile.tile_p, kernel.fixed_stride) == (8, True) and split > 1
    large = DepthwiseProblem(32, 56, 56, 96, 7, 7, 56, 56, (3, 3))
    assert choose_depthwise_kernel(large, Epilogue(), 90)[0].tile.tile_p == 4  # 8x8 spills with 7x7
    dilated = DepthwiseProblem(1, 16, 16, 32, 3, 3, 16, 16, (2, 2), (1, 1), (2, 2))
    kernel, split = choose_depthwise_kernel(dilated, Epilogue(), 90)
    assert not kernel.fixed_stride and "run time" in kernel.note
    assert split <= 4  # never more CTAs per channel group than output tiles (N=1: 2x2 tiles of 8x8)


@pytest.mark.nvcc
def test_depthwise_kernels_compile_and_hold_fma_instructions():
    """One 3x3 (fixed stride) and one 7x7 stride-2 kernel, built for sm_90a and sm_80: CUDA-core
    FMAs in their SASS (the stub guard's "simt" family), no tensor-core MMA."""
    from relax_cutlass.stages.compile import compile_all
    from relax_cutlass.stages.emit import emit_kernel
    from relax_cutlass.stages.sass_check import mma_counts

    for arch, r, stride in ((90, 3, (1, 1)), (80, 7, (2, 2))):
        problem = DepthwiseProblem(2, 16, 16, 32, r, r, 16 // stride[0], 16 // stride[1], (r // 2, r // 2), stride)
        kernel, _ = choose_depthwise_kernel(problem, Epilogue(bias=True, activation="silu"), arch)
        ((obj, _),) = compile_all([emit_kernel(kernel)], arch).values()
        counts, sass, _ = mma_counts(obj, ("FFMA", "HFMA2", "HMMA"))
        assert sass == [f"sm_{arch}{'a' if arch == 90 else ''}"] and counts["FFMA"] + counts["HFMA2"] > 0
        assert counts["HMMA"] == 0
