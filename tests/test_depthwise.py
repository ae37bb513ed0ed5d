"""The depthwise conv2d kind (groups == C == K): patterns, legality, the offload report and
semantics on the CPU (regions served by their llvm-built composites), and real nvcc builds of its
CUTLASS direct-convolution kernels."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from harness import compare_on_cpu, offload_for_cpu
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.depthwise_conv2d.records import DepthwiseProblem
from relax_cutlass.kinds.depthwise_conv2d.select import choose_depthwise_kernel
from relax_cutlass.kinds.epilogue import Epilogue


def test_depthwise_kind_is_registered_by_default_and_the_old_opt_in_still_works(monkeypatch):
    """On by default since its kernels passed on the H200 (session 13); the opt-in spellings of
    the sessions before stay accepted (a no-op)."""
    from relax_cutlass import kinds

    assert kinds.is_registered("depthwise_conv2d")
    assert kinds.enable("depthwise_conv2d").name == "depthwise_conv2d"
    monkeypatch.setenv(kinds.ENABLE_ENV, "depthwise_conv2d")
    assert [k.name for k in kinds.kinds()].count("depthwise_conv2d") == 1


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


def test_grouped_conv_is_the_conv2d_kinds_not_the_depthwise_ones():
    """1 < groups < C: CUTLASS's grouped implicit-GEMM kernels (tests/test_grouped_conv2d.py); with
    8 channels per group and a bound filter, merged into one dense block-diagonal conv."""
    mod = depthwise_module(c=32, groups=4)
    _, _, rewritten = compare_on_cpu(mod, [_input(mod)])
    report = relax_cutlass.offload_report(rewritten)
    (row,) = report.offloaded
    assert row["op"] == "conv2d" and row["conv"]["groups"] == 1 and not report.left_in_tvm, str(report)


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
    assert kernel.tile.groups_per_cta == 32  # 96 channels: 3 tiles of 32, not 2 of 64 (one half idle)
    # ConvNeXt's 7x7 convs: 8x8 x 32 channels where C is not a multiple of 64 (C = 96), else 4x4 x 64
    # (8x8 x 64 spills with 7x7); bench/depthwise_tiles.py measured these fastest on an H200
    for c, tile in ((96, (8, 8, 32)), (192, (4, 4, 64)), (768, (4, 4, 64))):
        large = DepthwiseProblem(32, 56, 56, c, 7, 7, 56, 56, (3, 3))
        t = choose_depthwise_kernel(large, Epilogue(), 90)[0].tile
        assert (t.tile_p, t.tile_q, t.groups_per_cta) == tile
    # 3x3 / 5x5: 64 channels where C allows and the output is 14x14 or more, else 32
    for c, hw, groups in ((480, 14, 32), (1152, 7, 32), (512, 14, 64), (144, 56, 32)):
        problem = DepthwiseProblem(32, hw, hw, c, 5, 5, hw, hw, (2, 2))
        assert choose_depthwise_kernel(problem, Epilogue(), 90)[0].tile.groups_per_cta == groups
    dilated = DepthwiseProblem(1, 16, 16, 32, 3, 3, 16, 16, (2, 2), (1, 1), (2, 2))
    kernel, split = choose_depthwise_kernel(dilated, Epilogue(), 90)
    assert not kernel.fixed_stride and "run time" in kernel.note
    assert split <= 4  # never more CTAs per channel group than output tiles (N=1: 2x2 tiles of 8x8)


@pytest.mark.parametrize(
    "r, stride, dilation, one_tile",
    [
        (3, 1, 1, True),  # 10x10 fp16 activations (12.8 KB) < 8x8 float32 sums (16 KB)
        (3, 2, 1, False),  # 17x17 activations
        (5, 1, 1, False),  # 12x12: 18.4 KB
        (3, 1, 2, False),  # the run-time-stride kernel's 12x12
        (7, 1, 1, False),  # the 4x4 tile: 10x10 activations, 4 KB of sums
    ],
)
def test_one_output_tile_per_cta_where_the_sums_outgrow_an_activation_stage(r, stride, dilation, one_tile):
    """Regression (MobileNetV3-Large at batch 32 on the H200: inf): CUTLASS's direct convolution
    stages its float32 sums in the activation stage it has read, overrunning the next stage where
    the sums are larger; a CTA that then computes a second tile reads corrupted activations. Those
    kernels get one tile per CTA: every tile of the batch, counted by the glue at run time."""
    hw = 112
    pad = dilation * (r // 2)
    p = (hw + 2 * pad - dilation * (r - 1) - 1) // stride + 1
    problem = DepthwiseProblem(32, hw, hw, 16, r, r, p, p, (pad, pad), (stride, stride), (dilation, dilation))
    kernel, split = choose_depthwise_kernel(problem, Epilogue(bias=True), 90)
    tiles = kernel.tile.tiles(problem, 32)
    assert kernel.tile.one_tile_per_cta(problem) == one_tile
    assert (split == tiles) if one_tile else (split < tiles)  # otherwise CTAs share tiles to fill the GPU


def _depthwise_glue(mod) -> str:
    from relax_cutlass.stages.constants import offloaded_functions
    from relax_cutlass.stages.emit import emit_glue
    from relax_cutlass.stages.regions import analyze, make_region

    partitioned, _ = offload_for_cpu(mod)
    ((_, func),) = offloaded_functions(partitioned)
    symbol = str(func.attrs["global_symbol"])
    spec, roles, problem, composite, aliases = analyze(func, symbol)
    kernel, split = choose_depthwise_kernel(problem, spec.epilogue, 90)
    return emit_glue([make_region(func, symbol, kernel, roles, composite, aliases, split_k=split)], "m").text


@pytest.mark.parametrize("n", [32, "n"])
def test_one_tile_per_cta_glue_launches_every_tile_of_the_batch(n):
    """A symbolic batch too: the glue counts the tiles (7 x 7 of 8x8 per image at 56x56) at run
    time and refuses a batch whose tiles exceed the grid with a clear error."""
    if n == "n":
        n = tvm.tirx.Var("n", "int64")
        # regression: a symbolic batch made the conv "grouped" in the report and it stayed in TVM
        mod = depthwise_module(c=16, hw=56, n=n)
        x = np.random.default_rng(1).uniform(-1, 1, (3, 56, 56, 16)).astype("float16")
        _, _, rewritten = compare_on_cpu(mod, [x])
        assert [row["op"] for row in relax_cutlass.offload_report(rewritten).offloaded] == ["dwconv2d"]
    glue = _depthwise_glue(depthwise_module(c=16, hw=56, n=n))
    assert "const int64_t tiles = n * 49;" in glue and "static_cast<int>(tiles)," in glue
    assert "split the batch" in glue
    other = _depthwise_glue(depthwise_module(c=16, hw=56, n=n, stride=2))
    assert "const int64_t tiles" not in other


def test_a_batch_with_more_tiles_than_one_launch_holds_stays_in_tvm():
    mod = depthwise_module(c=16, hw=112, n=400)  # 400 x 14 x 14 = 78400 tiles of 8x8
    partitioned, _ = offload_for_cpu(mod)
    (row,) = relax_cutlass.offload_report(partitioned).left_in_tvm
    assert "78400 output tiles per channel group" in row["reasons"][0], row


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


def test_a_pinned_tile_is_used_and_a_misspelt_one_says_how_to_spell_it():
    from relax_cutlass.kinds.depthwise_conv2d.select import parse_tile

    problem = DepthwiseProblem(32, 56, 56, 96, 7, 7, 56, 56, (3, 3))
    kernel, _ = choose_depthwise_kernel(problem, Epilogue(), 90, tile="p4q8g32w4s3")
    assert kernel.tile.describe() == "p4q8g32w4s3" and kernel.selected_by == "pinned"
    with pytest.raises(ValueError, match="p<P>q<Q>g<groups>w<warps>s<stages>"):
        parse_tile("128x128x64")
    with pytest.raises(ValueError, match="multiple of 8"):
        parse_tile("p4q4g12w4s4")
