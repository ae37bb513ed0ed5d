"""The depthwise conv2d kind (groups == C == K): patterns, legality, the offload report and
semantics on the CPU (regions served by their llvm-built composites), and real nvcc builds of its
CUTLASS direct-convolution kernels."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.depthwise_conv2d.records import DepthwiseProblem
from relax_cutlass.kinds.depthwise_conv2d.select import choose_depthwise_kernel
from relax_cutlass.kinds.epilogue import Epilogue
from relax_cutlass.testing.harness import compare_on_cpu, offload_for_cpu


def test_depthwise_kind_is_registered_by_default_and_the_old_opt_in_still_works(monkeypatch):
    """On by default (its kernels pass the GPU tests on the H200); the older opt-in spellings stay
    accepted (a no-op)."""
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
    assert row["family"] == "sm80"
    dilated = options.get("dilation", 1) > 1  # CUTLASS's kernel; the rest the blocked direct one
    assert ("CUTLASS 2.x SIMT direct convolution" in row["note"]) == dilated
    assert ("_direct_p" in row["kernel"]) == (not dilated) and ("blocked direct" in row["note"])


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
    from relax_cutlass.kinds.depthwise_conv2d.reference import depthwise_reference
    from relax_cutlass.testing.harness import build_cpu, run_vm

    mod = depthwise_module(c=16, r=r, stride=stride, dilation=dilation, hw=hw, bias=False, activation="identity")
    x = _input(mod)
    got = run_vm(build_cpu(mod), [x]).astype("float32")
    conv = mod["main"].body.blocks[0].bindings[0].value
    w = conv.args[1].value.numpy()
    pad = dilation * (r // 2)
    want = depthwise_reference(x, w, got.shape[1:3], (pad, pad), (stride, stride), (dilation, dilation))
    assert np.abs(got - want).max() < 1e-2 * np.abs(want).max()


def test_cutlass_tile_choice_by_filter_size_and_geometry():
    """CUTLASS's direct convolution (the kind's fallback family, and tile= pins): its tile heuristic."""
    from relax_cutlass.kinds.depthwise_conv2d.select import split_for, tile_for

    small = DepthwiseProblem(32, 56, 56, 96, 3, 3, 56, 56, (1, 1))
    tile = tile_for(small)
    assert tile.tile_p == 8 and split_for(small, tile) > 1
    assert tile.groups_per_cta == 32  # 96 channels: 3 tiles of 32, not 2 of 64 (one half idle)
    # ConvNeXt's 7x7 convs: 8x8 x 32 channels where C is not a multiple of 64 (C = 96), else 4x4 x 64
    # (8x8 x 64 spills with 7x7); bench/depthwise_tiles.py measured these fastest on an H200
    for c, want in ((96, (8, 8, 32)), (192, (4, 4, 64)), (768, (4, 4, 64))):
        t = tile_for(DepthwiseProblem(32, 56, 56, c, 7, 7, 56, 56, (3, 3)))
        assert (t.tile_p, t.tile_q, t.groups_per_cta) == want
    # 3x3 / 5x5: 64 channels where C allows and the output is 14x14 or more, else 32
    for c, hw, groups in ((480, 14, 32), (1152, 7, 32), (512, 14, 64), (144, 56, 32)):
        assert tile_for(DepthwiseProblem(32, hw, hw, c, 5, 5, hw, hw, (2, 2))).groups_per_cta == groups
    dilated = DepthwiseProblem(1, 16, 16, 32, 3, 3, 16, 16, (2, 2), (1, 1), (2, 2))
    kernel, split = choose_depthwise_kernel(dilated, Epilogue(), 90)
    assert not kernel.direct and not kernel.fixed_stride and "run time" in kernel.note
    assert "not the blocked direct kernel: dilation (2, 2)" in kernel.note
    assert split <= 4  # never more CTAs per channel group than output tiles (N=1: 2x2 tiles of 8x8)


def _problem(n, hw, c, r, stride=1, dilation=1, pad=None, element="float16"):
    pad = (r // 2, r // 2) if pad is None else pad
    out = (hw + pad[0] + pad[1] - dilation * (r - 1) - 1) // stride + 1
    return DepthwiseProblem(n, hw, hw, c, r, r, out, out, pad, (stride, stride), (dilation, dilation), element)


@pytest.mark.parametrize(
    "problem, covered",
    [
        (_problem(32, 56, 96, 7), True),  # ConvNeXt
        (_problem(32, 14, 672, 5, stride=2), True),  # EfficientNet
        (_problem(None, 13, 24, 3, stride=2, pad=(1, 0)), True),  # symbolic batch, asymmetric padding
        (_problem(2, 17, 8, 3, dilation=2), False),
        (_problem(2, 17, 8, 3, stride=3), False),
    ],
)
def test_the_blocked_direct_kernel_is_the_default_where_it_applies(problem, covered):
    kernel, split = choose_depthwise_kernel(problem, Epilogue(bias=True, activation="relu"), 90)
    assert kernel.direct == covered and kernel.selected_by == "heuristic"
    if covered:
        assert split == 1 and "blocked direct" in kernel.note and "1.5-1.9x slower than cuDNN" in kernel.note
        assert kernel.tile.halo_bytes(problem) <= 48 * 1024 and kernel.tile.threads <= 1024
        assert kernel.name.startswith("sm80_dwconv2d_fprop_nhwc_f16_f32acc_") and "_direct_p" in kernel.name
    else:
        assert "CUTLASS 2.x SIMT" in kernel.note and "not the blocked direct kernel" in kernel.note


def test_direct_tiles_by_problem():
    """Channels per CTA leave the fewest idle channels; 8x16 output pixels per CTA, smaller where the
    halo would outgrow 48 KB (7x7 stride 2) or the grid would hold fewer than 2 CTAs per SM."""
    from relax_cutlass.kinds.depthwise_conv2d.select import direct_tile_for

    def tile(*args, **kw):
        return direct_tile_for(_problem(*args, **kw), 90).describe()

    assert tile(32, 56, 96, 7) == "direct_p8q16g32t4x4"
    assert tile(32, 7, 768, 7) == "direct_p8q8g32t4x4"  # 7 output columns: one 8-wide tile
    assert tile(32, 56, 144, 3) == "direct_p8q16g16t4x4"  # 144 = 9 x 16 (24-channel groups measured slower)
    assert tile(32, 112, 16, 3) == "direct_p8q16g16t4x4"
    assert tile(32, 56, 96, 7, stride=2) == "direct_p8q8g32t4x4"  # p8q16: a 21x37 halo, 49.7 KB
    assert tile(1, 7, 768, 7) == "direct_p4q4g32t4x4"  # batch 1: 24 CTAs of 8x8 fill nothing
    assert tile(None, 7, 768, 7) == "direct_p8q8g32t4x4"  # a symbolic batch counts as 16 images
    for n, hw, c, r, s in [(32, 56, 96, 7, 1), (32, 7, 768, 7, 1), (32, 112, 32, 3, 1), (32, 14, 672, 5, 2)]:
        p = _problem(n, hw, c, r, stride=s)
        assert direct_tile_for(p, 90).ctas(p, n) >= 2 * 132


def test_direct_tile_pins_and_their_spelling():
    from relax_cutlass.kinds.depthwise_conv2d.select import parse_direct_tile

    problem = _problem(32, 56, 96, 7)
    kernel, split = choose_depthwise_kernel(problem, Epilogue(), 90, tile="direct_p4q8g16")
    assert kernel.direct and kernel.selected_by == "pinned" and split == 1
    assert kernel.tile.describe() == "direct_p4q8g16t4x4"
    assert parse_direct_tile("direct_p8q16g32t2x8").describe() == "direct_p8q16g32t2x8"
    assert parse_direct_tile("direct_p2q2g8").describe() == "direct_p2q2g8t2x2"
    # a CUTLASS spelling still pins CUTLASS's kernel, even where the direct one is the default
    kernel, _ = choose_depthwise_kernel(problem, Epilogue(), 90, tile="p4q4g64w4s4")
    assert not kernel.direct and kernel.tile.describe() == "p4q4g64w4s4"
    for bad, match in [
        ("direct_p8q16", "direct_p<P>q<Q>g<channels>"),
        ("direct_p8q16g12", "multiple of 8"),
        ("direct_p8q16g32t3x4", "must divide"),
        ("direct_p32q32g64", "more than CUDA's 1024"),
    ]:
        with pytest.raises(ValueError, match=re.escape(match)):
            parse_direct_tile(bad)
    with pytest.raises(ValueError, match="shared memory"):
        choose_depthwise_kernel(_problem(32, 56, 96, 7, stride=2), Epilogue(), 90, tile="direct_p8q16g64")
    with pytest.raises(ValueError, match="dilation"):
        choose_depthwise_kernel(_problem(2, 17, 8, 3, dilation=2), Epilogue(), 90, tile="direct_p8q8g8")
    with pytest.raises(ValueError, match="bfloat16 depthwise convs run only on the blocked direct kernel"):
        choose_depthwise_kernel(_problem(2, 17, 8, 3, element="bfloat16"), Epilogue(), 90, tile="p8q8g32w4s3")


def test_direct_kernel_names_are_unique_across_what_is_compiled_in():
    """Everything the TU compiles in is in its name (one object per name in the cache and library)."""
    from relax_cutlass.kinds.depthwise_conv2d.emit import direct_kernel_text

    kernels = {}
    for element in ("float16", "bfloat16"):
        for r in (3, 5, 7):
            for stride in (1, 2):
                for epilogue in (Epilogue(), Epilogue(bias=True), Epilogue(bias=True, activation="gelu")):
                    problem = _problem(8, 28, 64, r, stride=stride, element=element)
                    kernel, _ = choose_depthwise_kernel(problem, epilogue, 90, tile="direct_p8q8g32")
                    kernels.setdefault(kernel.name, set()).add(direct_kernel_text(kernel))
    assert len(kernels) == 2 * 3 * 2 * 3 and all(len(texts) == 1 for texts in kernels.values())
    (bf16,) = [n for n in kernels if "bf16" in n and "r7s7_s2x2" in n and n.endswith("bias_gelu")]
    assert bf16 == "sm80_dwconv2d_fprop_nhwc_bf16_f32acc_r7s7_s2x2d1x1_direct_p8q8g32t4x4_bias_gelu"


def test_direct_kernel_source_shape():
    from relax_cutlass.stages.emit import emit_kernel

    problem = _problem(None, 13, 24, 3, stride=2, pad=(1, 0), element="bfloat16")
    kernel, _ = choose_depthwise_kernel(problem, Epilogue(bias=True, activation="gelu"), 90)
    src = emit_kernel(kernel)
    assert src.family == "simt" and src.kind == "cuda"
    text = src.text
    assert f'extern "C" __attribute__((visibility("default"))) const char* {kernel.name}_run(' in text
    assert "relax_cutlass_dw::Shape<3, 3, 2, 2, " in text and "using Element = __nv_bfloat16;" in text
    assert "using Act = RelaxCutlassGelu16<float>;" in text and "struct RelaxCutlassGelu16" in text
    assert "constexpr bool kBias = true;" in text
    # nothing allocated, reordered or synchronized per call; no CUTLASS device operator
    for absent in ("cudaMalloc", "cudaFree", "ReorderedFilter", "cudaStreamSynchronize", "DirectConvolution"):
        assert absent not in text
    identity = emit_kernel(choose_depthwise_kernel(problem, Epilogue(), 90)[0]).text
    assert "using Act = cutlass::epilogue::thread::Identity<float>;" in identity
    assert "constexpr bool kBias = false;" in identity


@pytest.mark.parametrize(
    "n, c, r, stride, dilation",
    [
        (32, 16, 3, 1, 1),  # MobileNetV3-Large at batch 32: its sums outgrow an activation stage (inf)
        (32, 120, 5, 1, 1),  # 5x5 stride 1, a partial channel group: a few wrong outputs (7.2e-3)
        (32, 16, 3, 2, 1),
        (32, 16, 3, 1, 2),  # the run-time-stride kernel (dilation 2: the production path)
        (8, 96, 7, 1, 1),  # the 7x7 filters' tile
        (1, 40, 5, 1, 1),
    ],
)
def test_cutlass_direct_conv_computes_one_output_tile_per_cta(n, c, r, stride, dilation):
    """Regression (the H200: MobileNetV3-Large at batch 32 gave inf, a 5x5 stride-1 conv at batch 32
    a 7.2e-3 relative error): CUTLASS's direct convolution stages a tile's float32 sums in the
    activation stage the CTA's next tile prefetches into, with no barrier between, so a CTA that
    computes a second tile races with itself. Every tile of the batch gets its own CTA, whatever
    the filter, stride or channel count (the glue counts the tiles at run time)."""
    hw = 112
    pad = dilation * (r // 2)
    p = (hw + 2 * pad - dilation * (r - 1) - 1) // stride + 1
    problem = DepthwiseProblem(n, hw, hw, c, r, r, p, p, (pad, pad), (stride, stride), (dilation, dilation))
    from relax_cutlass.kinds.depthwise_conv2d.select import tile_for

    # CUTLASS's kernel only where the blocked direct one does not apply (dilation 2), or pinned
    kernel, split = choose_depthwise_kernel(problem, Epilogue(bias=True), 90, tile=tile_for(problem).describe())
    assert kernel.tile.one_tile_per_cta(problem)
    assert split == kernel.tile.tiles(problem, n)


def _depthwise_glue(mod, tile: str | None = None) -> str:
    """The glue of `mod`'s one depthwise region: CUTLASS's kernel with its heuristic's tile (tile
    None), else the kind's choice with `tile` pinned ("" for none)."""
    from relax_cutlass.stages.constants import offloaded_functions
    from relax_cutlass.stages.emit import emit_glue
    from relax_cutlass.stages.regions import analyze, make_region

    partitioned, _ = offload_for_cpu(mod)
    ((_, func),) = offloaded_functions(partitioned)
    symbol = str(func.attrs["global_symbol"])
    spec, roles, problem, composite, aliases = analyze(func, symbol)
    if tile is None:
        from relax_cutlass.kinds.depthwise_conv2d.select import tile_for

        tile = tile_for(problem).describe()
    kernel, split = choose_depthwise_kernel(problem, spec.epilogue, 90, tile=tile)
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
    # stride 2: 4 x 4 tiles of 8x8 per image at 28x28, one CTA each too
    assert "const int64_t tiles = n * 16;" in _depthwise_glue(depthwise_module(c=16, hw=56, n=n, stride=2))
    # the blocked direct kernel (the default here) launches every tile itself: no count in the glue
    direct = _depthwise_glue(depthwise_module(c=16, hw=56, n=n), tile="")
    assert "const int64_t tiles" not in direct and "_direct_p8q16g16t4x4_bias_relu_run(&args, stream)" in direct
    assert 'TRY(CheckDim(fn, "weight I", weight->shape[3], 1, weight));' in direct
    assert 'TRY(CheckTensor(fn, "data", data, kDLFloat, 16, 16, device_id));' in direct


def test_a_batch_with_more_tiles_than_one_cutlass_launch_holds_runs_on_the_direct_kernel():
    """400 x 14 x 14 = 78400 tiles of 8x8 exceed CUTLASS's one-tile-per-CTA grid (65535); the
    blocked direct kernel's grid (x up to 2^31 - 1) takes them."""
    mod = depthwise_module(c=16, hw=112, n=400)
    partitioned, _ = offload_for_cpu(mod)
    report = relax_cutlass.offload_report(partitioned)
    (row,) = report.offloaded
    assert not report.left_in_tvm and "_direct_" in row["kernel"], str(report)


@pytest.mark.nvcc
def test_depthwise_kernels_compile_and_hold_fma_instructions():
    """CUTLASS's kernels: one 3x3 (fixed stride) and one 7x7 stride-2 kernel (their tiles pinned),
    built for sm_90a and sm_80: CUDA-core FMAs in their SASS (the stub guard's "simt" family), no
    tensor-core MMA."""
    from relax_cutlass.kinds.depthwise_conv2d.select import tile_for
    from relax_cutlass.stages.emit import emit_kernel
    from relax_cutlass.toolkit.compile import compile_all
    from relax_cutlass.toolkit.sass_check import mma_counts

    for arch, r, stride in ((90, 3, (1, 1)), (80, 7, (2, 2))):
        problem = DepthwiseProblem(2, 16, 16, 32, r, r, 16 // stride[0], 16 // stride[1], (r // 2, r // 2), stride)
        epilogue = Epilogue(bias=True, activation="silu")
        kernel, _ = choose_depthwise_kernel(problem, epilogue, arch, tile=tile_for(problem).describe())
        assert not kernel.direct
        ((obj, _),) = compile_all([emit_kernel(kernel)], arch).values()
        counts, sass, _ = mma_counts(obj, ("FFMA", "HFMA2", "HMMA"))
        assert sass == [f"sm_{arch}{'a' if arch == 90 else ''}"] and counts["FFMA"] + counts["HFMA2"] > 0
        assert counts["HMMA"] == 0


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "arch, r, stride, activation",
    [(80, 3, 2, "hardswish"), (90, 3, 2, "relu"), (80, 7, 1, "identity"), (90, 7, 1, "identity")],
)
def test_direct_kernels_compile_and_hold_fp32_fmas(arch, r, stride, activation):
    """The blocked direct kernel (MobileNet's 3x3 stride 2 + bias + hardswish/relu, ConvNeXt's 7x7
    + bias) for sm_80 and sm_90a: float32 FMAs in its SASS, R*S*2 per output pixel of a thread's
    block (its sums are float32), no tensor-core MMA."""
    from relax_cutlass.stages.emit import emit_kernel
    from relax_cutlass.toolkit.compile import compile_all
    from relax_cutlass.toolkit.sass_check import mma_counts

    problem = _problem(2, 56, 96, r, stride=stride)
    kernel, _ = choose_depthwise_kernel(problem, Epilogue(bias=True, activation=activation), arch)
    assert kernel.direct
    ((obj, _),) = compile_all([emit_kernel(kernel)], arch).values()
    counts, sass, _ = mma_counts(obj, ("FFMA", "HFMA2", "HMMA"))
    assert sass == [f"sm_{arch}{'a' if arch == 90 else ''}"] and counts["HMMA"] == 0
    t = kernel.tile
    assert counts["FFMA"] >= r * r * 2 * t.rows_per_thread * t.cols_per_thread, counts


_EPILOGUES = {
    "identity": lambda v: v,
    "relu": lambda v: np.maximum(v, 0),
    "hardswish": lambda v: v * np.clip(v + 3, 0, 6) / 6,
    "silu": lambda v: v / (1 + np.exp(-v)),
    "gelu": lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
}


def _emulate(kernel, x, w, b, workdir):
    """The blocked direct kernel's own code run on the CPU (`<kernel>_emulate`: every CTA's load and
    compute phases, one thread after another), built with nvcc into a shared library."""
    import ctypes
    import subprocess

    from relax_cutlass.kinds.depthwise_conv2d.emit import direct_kernel_text
    from relax_cutlass.toolkit.compile import toolchain

    tc = toolchain()
    src = workdir / f"{kernel.name}.cu"
    lib = src.with_suffix(".so")
    src.write_text(direct_kernel_text(kernel))
    subprocess.run(
        [
            tc.nvcc, "-shared", "-std=c++17", "-O1", "-Xcompiler=-fPIC", "-w", "--expt-relaxed-constexpr",
            "-DRELAX_CUTLASS_DW_EMULATE", "-arch=sm_80", *(f"-I{p}" for p in tc.includes_cuda),
            str(src), "-o", str(lib),
        ],
        check=True,
    )  # fmt: skip
    p = kernel.problem
    out = np.full((x.shape[0], p.p, p.q, p.c), np.nan, x.dtype)  # every element must be written

    class Args(ctypes.Structure):  # RelaxCutlassDwConv2dArgs
        _fields_ = [
            *((f, ctypes.c_int) for f in "n h w c r s p q pad_h pad_w stride_h stride_w dil_h dil_w split_k".split()),
            *((f, ctypes.c_void_p) for f in ("data", "weight", "bias", "out")),
        ]

    bias = b.ctypes.data if b is not None else None
    args = Args(x.shape[0], p.h, p.w, p.c, p.r, p.s, p.p, p.q, *p.pad, *p.stride, *p.dilation, 1,
                x.ctypes.data, w.ctypes.data, bias, out.ctypes.data)  # fmt: skip
    emulate = getattr(ctypes.CDLL(str(lib)), f"{kernel.name}_emulate")
    emulate.restype = ctypes.c_char_p
    assert emulate(ctypes.byref(args)) is None
    return out


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "problem, epilogue, tile",
    [
        # an odd size, stride 2, asymmetric padding, C = 24 (one 24-channel group), 4x4 tiles
        (_problem(2, 13, 24, 3, stride=2, pad=(1, 0)), Epilogue(bias=True, activation="relu"), ""),
        # ConvNeXt's 7x7, C = 40: a 32-channel tile whose second group is three quarters idle
        (_problem(2, 13, 40, 7), Epilogue(bias=True), "direct_p8q16g32"),
        # 5x5 stride 2 in bfloat16 with gelu; partial tiles at the bottom/right edge
        (_problem(3, 17, 16, 5, stride=2, element="bfloat16"), Epilogue(bias=True, activation="gelu"), ""),
        # stride 1 x 2 and a 3 x 5 filter, no bias, a 2x8 per-thread block
        (
            DepthwiseProblem(1, 11, 19, 8, 3, 5, 9, 10, (0, 2), (1, 2)),
            Epilogue(activation="hardswish"),
            "direct_p4q8g8t2x8",
        ),
        # a 7x7 output with 7x7 filter on a 4x4 tile: more halo than output
        (_problem(2, 7, 32, 7), Epilogue(bias=True, activation="silu"), "direct_p4q4g16"),
    ],
)
def test_direct_kernel_code_matches_the_float64_reference_on_the_cpu(problem, epilogue, tile, tmp_path):
    """The index math of the blocked direct kernel (halo origin, padding, stride, partial tiles and
    channel groups, the per-thread window, epilogue) against a float64 reference: the kernel's own
    phases emulated on the CPU, so that a wrong tap (a CUTLASS tile gave 3-4e-2 relative errors on
    5x5 filters in the H200 sweep) cannot hide until a GPU run."""
    from relax_cutlass.kinds.depthwise_conv2d.reference import depthwise_reference

    kernel, _ = choose_depthwise_kernel(problem, epilogue, 90, tile=tile)
    assert kernel.direct
    import ml_dtypes  # noqa: F401  (numpy's bfloat16)

    rng = np.random.default_rng(0)
    dtype, n = problem.element, problem.n
    x = rng.uniform(-2, 2, (n, problem.h, problem.w, problem.c)).astype(dtype)
    w = (rng.uniform(-1, 1, (problem.c, problem.r, problem.s, 1)) / problem.r).astype(dtype)
    b = rng.uniform(-1, 1, (problem.c,)).astype(dtype) if epilogue.bias else None
    got = _emulate(kernel, x, w, b, tmp_path).astype("float64")
    sums = depthwise_reference(x.astype("float64"), w.astype("float64"), (problem.p, problem.q), problem.pad,
                               problem.stride).astype("float64")  # fmt: skip
    want = _EPILOGUES[epilogue.activation](sums + (b.astype("float64") if b is not None else 0))
    assert not np.isnan(got).any()
    ulp = 2.0**-8 if dtype == "bfloat16" else 2.0**-11  # one rounding of the output
    assert np.abs(got - want).max() <= 2 * ulp * max(1.0, np.abs(want).max()), np.abs(got - want).max()


def test_a_pinned_tile_is_used_and_a_misspelt_one_says_how_to_spell_it():
    from relax_cutlass.kinds.depthwise_conv2d.select import parse_tile

    problem = DepthwiseProblem(32, 56, 56, 96, 7, 7, 56, 56, (3, 3))
    kernel, _ = choose_depthwise_kernel(problem, Epilogue(), 90, tile="p4q8g32w4s3")
    assert kernel.tile.describe() == "p4q8g32w4s3" and kernel.selected_by == "pinned"
    with pytest.raises(ValueError, match="p<P>q<Q>g<groups>w<warps>s<stages>"):
        parse_tile("128x128x64")
    with pytest.raises(ValueError, match="multiple of 8"):
        parse_tile("p4q4g12w4s4")


def test_bfloat16_depthwise_runs_on_the_direct_kernel_and_a_dilated_one_stays_in_tvm():
    """bfloat16 is the blocked direct kernel's alone: offloaded where it applies; a dilated bf16
    conv (CUTLASS's kernel is built for fp16 only) stays in TVM, saying why."""
    import ml_dtypes

    def module(dilation):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((2, 16, 16, 32), "bfloat16"))
        w = relax.const(np.ones((32, 3, 3, 1), ml_dtypes.bfloat16))
        with bb.function("main", [x]):
            with bb.dataflow():
                y = bb.emit(
                    relax.op.nn.conv2d(
                        x, w, padding=dilation, dilation=dilation, groups=32,
                        data_layout="NHWC", kernel_layout="OHWI", out_dtype="bfloat16",
                    )
                )  # fmt: skip
                out = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
            bb.emit_func_output(out)
        return bb.get()

    report = relax_cutlass.offload_report(offload_for_cpu(module(1))[0])
    (row,) = report.offloaded
    assert "_bf16_f32acc_r3s3_s1x1d1x1_direct_" in row["kernel"] and row["epilogue"] == "relu", str(report)
    report = relax_cutlass.offload_report(offload_for_cpu(module(2))[0])
    (row,) = report.left_in_tvm
    assert "bfloat16 runs only on the blocked direct kernel" in row["reasons"][0] and "dilation" in row["reasons"][0]
