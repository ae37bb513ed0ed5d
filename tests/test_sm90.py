"""SM90 (Hopper) kernel path: candidates, choice, fallback, emitted CUTLASS 3.x source."""

import dataclasses

import pytest

import relax_cutlass
from relax_cutlass.kinds.epilogue import ACTIVATIONS, Epilogue
from relax_cutlass.kinds.gemm.emit_sm90 import epilogue_tree
from relax_cutlass.kinds.gemm.profile import gemm_candidates
from relax_cutlass.kinds.gemm.records import SPLIT_K_MIN_ITERATIONS, GemmKernel, GemmProblem, TileConfig
from relax_cutlass.kinds.gemm.select import (
    SM90_MAX_ACCUMULATOR_REGISTERS,
    SM90_SMALL_TILES,
    accumulator_registers,
    candidate_tiles_sm90,
    choose_kernel,
    sm90_large_tile,
    under_fills,
)
from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
from relax_cutlass.stages.constants import offloaded_functions
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.stages.profile import DEFAULT_MAX_CANDIDATES
from relax_cutlass.testing.models import dense_epilogue_model
from relax_cutlass.transform import LiftConstants, PartitionForCutlass


def region(mod, arch="sm_90a", **options):
    part = LiftConstants()(PartitionForCutlass(arch)(mod))
    (r,) = plan_regions([f for _, f in offloaded_functions(part)], CodegenOptions.create(arch, **options))
    return r


def test_candidates_come_from_cutlass_library_sm90_generator():
    tiles = candidate_tiles_sm90("float32")
    assert {t.schedule for t in tiles} == {"cooperative", "pingpong"}
    assert {t.scheduler for t in tiles} == {"default", "streamk", "splitk"}
    # split-K is the stream-K scheduler in another mode: one per stream-K configuration
    assert {dataclasses.replace(t, scheduler="streamk") for t in tiles if t.scheduler == "splitk"} == {
        t for t in tiles if t.scheduler == "streamk"
    }
    assert {t.cluster for t in tiles} >= {(2, 1, 1), (1, 2, 1)}
    assert (128, 256, 64) in {t.threadblock for t in tiles}


@pytest.mark.parametrize(
    "m,k,n,expected",
    [  # the best (or within 3% of the best) configuration of the H100 sweeps for each shape
        (1024, 1024, 4096, "tb256x128x64_c1x2x1_cooperative"),
        (4096, 1024, 4096, "tb128x128x64_c2x1x1_pingpong"),
        (8192, 1024, 4096, "tb128x128x64_c2x1x1_pingpong"),
        (1024, 4096, 1024, "tb128x128x64_c2x1x1_cooperative"),
        (8192, 4096, 1024, "tb256x128x64_c1x2x1_cooperative"),
        (8192, 8192, 8192, "tb256x128x64_c1x2x1_cooperative"),
    ],
)
def test_heuristic_follows_the_measured_sweep(m, k, n, expected):
    """The sweep's data-parallel tiles (which the heuristic takes wherever 128x128 tiles fill more
    than half of the SMs)."""
    problem = GemmProblem(m, n, k, True)
    assert sm90_large_tile(problem, 90, m).describe() == expected
    if not under_fills(m, n, (128, 128), 90):
        kernel = choose_kernel(problem, Epilogue(bias=True, activation="gelu"), 90)
        assert kernel.arch == 90 and kernel.tile.describe() == expected


@pytest.mark.parametrize("m, n, k", [(1024, 1024, 4096), (1024, 1024, 1024), (512, 768, 3072), (128, 1024, 1024)])
def test_under_filled_problems_take_the_small_tile_that_tuning_picked(m, n, k):
    """Where 128x128 tiles fill at most half of the SMs, 64x128 ping-pong (H200 tuning:
    a small tile won every such BERT-large / GPT-2 problem, e.g. 15.8 vs 20.7 us at 1024x1024x4096);
    the profiler still times the large tile right after the small ones."""
    problem = GemmProblem(m, n, k, False)
    kernel = choose_kernel(problem, Epilogue(bias=True), 90)
    assert kernel.tile.describe() == "tb64x128x64_c2x1x1_pingpong" and kernel.selected_by == "heuristic"
    timed = gemm_candidates(problem, 90, 90, DEFAULT_MAX_CANDIDATES)
    assert timed[0] == kernel.tile and sm90_large_tile(problem, 90, m) in timed
    assert len(set(timed)) == len(timed)


@pytest.mark.parametrize("m, n, k", [(512, 2048, 5632), (512, 2048, 2048), (1024, 1024, 4096)])
def test_under_filled_float32_outputs_take_128x64_cooperative(m, n, k):
    """A float32 output (the residual stream's projections, e.g. a Llama's o and down GEMMs):
    128x64 cooperative on a 2x1 cluster, which beat 64x128 ping-pong by 17% at 512x2048x5632 and
    512x2048x2048 (H100 tuning of Llama-GQA); the profiler still times the ping-pong
    tile, and 16-bit outputs of the same shape keep it."""
    problem = GemmProblem(m, n, k, True, element_out="float32")
    kernel = choose_kernel(problem, Epilogue(), 90)
    assert kernel.tile.describe() == "tb128x64x64_c2x1x1_cooperative" and kernel.selected_by == "heuristic"
    timed = [t.describe() for t in gemm_candidates(problem, 90, 90, DEFAULT_MAX_CANDIDATES)]
    assert timed[0] == "tb128x64x64_c2x1x1_cooperative" and "tb64x128x64_c2x1x1_pingpong" in timed
    assert len(set(timed)) == len(timed)
    half = dataclasses.replace(problem, element_out="float16")
    assert choose_kernel(half, Epilogue(), 90).tile.describe() == "tb64x128x64_c2x1x1_pingpong"
    # where 128x128 tiles fill the GPU the output width changes nothing
    large = GemmProblem(2048, 4096, 4096, True, element_out="float32")
    assert choose_kernel(large, Epilogue(), 90).tile == sm90_large_tile(large, 90, 2048)


def test_heuristic_never_picks_256x256_stream_k_or_split_k():
    for m, k, n in [(m, k, n) for m in (1, 128, 1024, 8192) for k in (64, 1024, 8192) for n in (256, 4096, 16384)]:
        tile = choose_kernel(GemmProblem(m, n, k, True), Epilogue(), 90).tile
        assert tile.threadblock != (256, 256, 64) and tile.scheduler == "default"


def test_split_k_is_profiled_where_tiles_under_fill_the_gpu():
    """Measured slower than data-parallel tiles on BERT-large's shapes, split-K is not the
    heuristic's choice, but the profiler times it wherever it could win."""
    small = [t.describe() for t in gemm_candidates(GemmProblem(128, 1024, 4096, True), 90, 90, 6)]
    assert small[1] == "tb128x128x64_c1x2x1_cooperative_splitk"
    large = [t.describe() for t in gemm_candidates(GemmProblem(8192, 1024, 4096, True), 90, 90, 6)]
    assert not any(name.endswith("_splitk") for name in large)


SMALL_TILES = ["tb64x128x64_c2x1x1_pingpong", "tb128x64x64_c1x2x1_cooperative", "tb128x64x64_c1x2x1_pingpong"]
SMALL_TILES_OTHER_CLUSTER = [
    "tb64x128x64_c1x2x1_pingpong", "tb128x64x64_c2x1x1_cooperative", "tb128x64x64_c2x1x1_pingpong"
]  # fmt: skip

DEFAULT_LEVEL_FP32 = [  # the generator's default level, in candidate_tiles_sm90's order
    "tb64x256x64_c1x2x1_pingpong",
    "tb64x256x64_c2x1x1_pingpong",
    "tb128x128x64_c1x2x1_cooperative",
    "tb128x128x64_c1x2x1_cooperative_splitk",
    "tb128x128x64_c1x2x1_cooperative_streamk",
    "tb128x128x64_c1x2x1_pingpong",
    "tb128x128x64_c2x1x1_cooperative",
    "tb128x128x64_c2x1x1_cooperative_splitk",
    "tb128x128x64_c2x1x1_cooperative_streamk",
    "tb128x128x64_c2x1x1_pingpong",
    "tb128x256x64_c1x2x1_cooperative",
    "tb128x256x64_c1x2x1_cooperative_splitk",
    "tb128x256x64_c1x2x1_cooperative_streamk",
    "tb128x256x64_c2x1x1_cooperative",
    "tb128x256x64_c2x1x1_cooperative_splitk",
    "tb128x256x64_c2x1x1_cooperative_streamk",
    "tb256x128x64_c1x2x1_cooperative",
    "tb256x128x64_c1x2x1_cooperative_splitk",
    "tb256x128x64_c1x2x1_cooperative_streamk",
    "tb256x128x64_c2x1x1_cooperative",
    "tb256x128x64_c2x1x1_cooperative_splitk",
    "tb256x128x64_c2x1x1_cooperative_streamk",
]


@pytest.mark.parametrize("accumulator", ["float32", "float16"])
def test_small_tiles_come_after_the_default_level_configurations(accumulator):
    """64x128 ping-pong and 128x64 cooperative / ping-pong come from the generator's level 1112,
    appended: the default level's configurations keep their names and order (the 22 fp32 ones as
    they were), so no existing choice or emitted kernel changes."""
    names = [t.describe() for t in candidate_tiles_sm90(accumulator)]
    assert set(names[-6:]) == set(SMALL_TILES + SMALL_TILES_OTHER_CLUSTER)
    if accumulator == "float32":
        assert names[:-6] == DEFAULT_LEVEL_FP32
    small = [t for t in candidate_tiles_sm90(accumulator) if t.threadblock in SM90_SMALL_TILES]
    assert len(small) == 6 and all(t.scheduler == "default" for t in small)
    assert all(accumulator_registers(t, accumulator) <= SM90_MAX_ACCUMULATOR_REGISTERS for t in small)


@pytest.mark.parametrize("m,n,k", [(1024, 1024, 1024), (1024, 1024, 4096), (128, 1024, 4096)])
def test_small_tiles_are_profiled_where_128x128_tiles_under_fill_the_gpu(m, n, k):
    """BERT-large at batch 8: N = 1024 is 64 CTAs of 128x128 on 132 SMs. The profiler's default
    limit times the heuristic's kernel (a small tile there) first, then split-K, then each small
    tile and schedule, and the sweep's large tile."""
    problem = GemmProblem(m, n, k, True)
    names = [t.describe() for t in gemm_candidates(problem, 90, 90, DEFAULT_MAX_CANDIDATES)]
    assert names[0] == choose_kernel(problem, Epilogue(), 90).tile.describe() == "tb64x128x64_c2x1x1_pingpong"
    assert names[1] == "tb128x128x64_c1x2x1_cooperative_splitk"
    assert set(SMALL_TILES) <= set(names)
    assert "tb128x128x64_c2x1x1_cooperative" in names
    every = [t.describe() for t in gemm_candidates(problem, 90, 90, 100)]
    assert set(SMALL_TILES_OTHER_CLUSTER) <= set(every)


def test_small_tiles_are_not_profiled_on_large_problems():
    """Where 128x128 tiles fill more than half of the SMs the pools are what they were."""
    names = [t.describe() for t in gemm_candidates(GemmProblem(2048, 14336, 4096, True), 90, 90, 6)]
    assert names == [
        "tb256x128x64_c1x2x1_cooperative",
        "tb128x256x64_c1x2x1_cooperative",
        "tb128x256x64_c2x1x1_cooperative",
        "tb256x128x64_c2x1x1_cooperative",
        "tb128x128x64_c1x2x1_cooperative",
        "tb128x128x64_c1x2x1_pingpong",
    ]
    for m, n, k in [(1024, 4096, 1024), (8192, 1024, 4096), (4096, 4096, 1024), (2048, 1024, 1024)]:
        pool = gemm_candidates(GemmProblem(m, n, k, True), 90, 90, 100)
        assert not any(t.threadblock in SM90_SMALL_TILES for t in pool)


def test_small_tiles_emit_their_cta_tile_and_schedule():
    problem = GemmProblem(1024, 1024, 1024, True)
    pingpong = choose_kernel(problem, Epilogue(bias=True), 90, tile="tb64x128x64_c2x1x1_pingpong")
    text = emit_kernel(pingpong).text
    assert "using TileShape = cute::Shape<cute::_64, cute::_128, cute::_64>;" in text
    assert "ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>" in text
    assert "KernelTmaWarpSpecializedPingpong" in text and "Sm90RowBroadcast<0, TileShape" in text
    cooperative = choose_kernel(problem, Epilogue(), 90, tile="tb128x64x64_c1x2x1_cooperative")
    text = emit_kernel(cooperative).text
    assert "using TileShape = cute::Shape<cute::_128, cute::_64, cute::_64>;" in text
    assert "KernelTmaWarpSpecializedCooperative" in text


@pytest.mark.parametrize("m", [128, 1, "m"])
def test_split_k_kernel_sets_its_slices_per_call(m):
    """The slice count is computed in the kernel object from the call's shape and the device's SM
    count, so one object serves a symbolic M too; the residual epilogue stays exact (the
    scheduler reduces the partial sums before the epilogue)."""
    epilogue = Epilogue(bias=True, activation="gelu", residual=True)
    problem = GemmProblem(None if m == "m" else m, 1024, 4096, True)
    kernel = choose_kernel(problem, epilogue, 90, tile="tb128x128x64_c1x2x1_cooperative_splitk")
    assert kernel.name.endswith("_cooperative_splitk_bias_gelu_residual_add")
    text = emit_kernel(kernel).text
    assert "cutlass::gemm::StreamKScheduler" in text
    assert "DecompositionMode::SplitK" in text and "cudaDevAttrMultiProcessorCount" in text
    assert f"iterations / {SPLIT_K_MIN_ITERATIONS}" in text


def test_sm90_target_uses_sm90_kernels():
    r = region(dense_epilogue_model(512, 256, 128, activation="gelu"))
    assert r.kernel.arch == 90 and r.kernel.name.startswith("sm90_")
    text = emit_kernel(r.kernel).text
    assert "cutlass::arch::Sm90" in text and "CollectiveBuilder" in text
    assert "KernelTmaWarpSpecialized" in text
    assert "Sm90RowBroadcast" in text and ACTIVATIONS["gelu"].for_output("float16").functor in text
    assert "using ElementC = void;" in text  # no residual: the epilogue reads no source


def test_unaligned_problems_fall_back_to_sm80_and_say_why():
    mod = dense_epilogue_model(512, 130, 66, activation="relu")
    r = region(mod)
    assert r.kernel.arch == 80 and "TMA" in r.kernel.note
    report = str(relax_cutlass.offload_report(relax_cutlass.offload_pipeline("sm_90a", compile=False)(mod)))
    assert "not multiples of 8" in report


def test_family_sm80_forces_cutlass2_kernels():
    r = region(dense_epilogue_model(512, 256, 128), family="sm80")
    assert r.kernel.arch == 80 and "family='sm80'" in r.kernel.note
    with pytest.raises(ValueError, match="family"):
        CodegenOptions.create("sm_90a", family="sm100")


@pytest.mark.parametrize(
    "epilogue",
    [
        Epilogue(),
        Epilogue(bias=True),
        Epilogue(bias=True, activation="silu"),
        Epilogue(bias=True, activation="gelu", residual=True, residual_activation="relu"),
        Epilogue(residual=True),
    ],
    ids=lambda e: e.describe(),
)
def test_epilogue_tree_type_and_arguments_agree(epilogue):
    """One EVT node per step; the argument initializer nests exactly like the type."""
    kernel = GemmKernel(GemmProblem(None, 256, 128, True), epilogue, TileConfig((128, 128, 64)), arch=90)
    tree = epilogue_tree(kernel)
    # One node per step; the root converts to the output type and applies the post-residual
    # activation, so it is an extra node only when there is none.
    steps = len(epilogue.parts()) + (epilogue.residual_activation == "identity")
    assert tree.type.count("Sm90EVT<") == steps
    assert tree.args.count("{") == tree.args.count("}")
    assert ("Sm90SrcFetch" in tree.type) == epilogue.residual
    assert ("p->bias" in tree.args) == epilogue.bias
    assert tree.type.startswith(
        f"cutlass::epilogue::fusion::Sm90EVT<cutlass::epilogue::fusion::Sm90Compute<"
        f"{ACTIVATIONS[epilogue.residual_activation].for_output('float16').functor}, cutlass::half_t"
    )


def test_tile_can_be_pinned_and_bad_names_list_the_candidates():
    r = region(dense_epilogue_model(512, 256, 128), tile="tb64x256x64_c1x2x1_pingpong")
    assert r.kernel.selected_by == "pinned" and r.kernel.tile.schedule == "pingpong"
    with pytest.raises(ValueError, match="candidates"):  # spelt right, no candidate: the region's PlanError
        region(dense_epilogue_model(512, 256, 128), tile="tb1x1x1_c1x1x1_pingpong")
    with pytest.raises(ValueError, match="is no kernel configuration of any kind"):  # refused where it enters
        region(dense_epilogue_model(512, 256, 128), tile="tb1x1x1")
    with pytest.raises(ValueError, match="they spill"):
        region(dense_epilogue_model(512, 256, 128), tile="tb128x256x64_c1x2x1_pingpong")


def test_configurations_that_spill_their_accumulators_are_not_candidates():
    """A ping-pong warp group holds a whole CTA tile, a cooperative one half: 128x256 ping-pong and
    256x256 need 256 fp32 registers per thread (10-20x slower on the H100); fp16 accumulators halve
    that."""
    fp32 = {t.describe() for t in candidate_tiles_sm90("float32")}
    assert "tb128x128x64_c2x1x1_pingpong" in fp32 and "tb128x256x64_c1x2x1_cooperative" in fp32
    assert not {"tb128x256x64_c1x2x1_pingpong", "tb256x128x64_c1x2x1_pingpong"} & fp32
    assert not any(name.startswith("tb256x256") for name in fp32)
    assert "tb128x256x64_c1x2x1_pingpong" in {t.describe() for t in candidate_tiles_sm90("float16")}


def test_kernel_checks_the_device_before_launching():
    text = emit_kernel(region(dense_epilogue_model(512, 256, 128)).kernel).text
    assert "CheckDevice()" in text and "built for sm_90a" in text and "cc == 90" in text
    text80 = emit_kernel(region(dense_epilogue_model(512, 256, 128), arch="sm_80").kernel).text
    assert "cc >= 80" in text80


def test_choice_does_not_depend_on_the_hash_seed():
    """cutlass_library's generators iterate hash-ordered sets; the choice must not follow them."""
    import subprocess
    import sys

    script = (
        "from relax_cutlass.kinds.gemm.select import choose_kernel;"
        "from relax_cutlass.kinds.gemm.records import GemmProblem; from relax_cutlass.kinds.epilogue import Epilogue;"
        "print([choose_kernel(GemmProblem(m, n, k, True), Epilogue(bias=True), a).name"
        " for a in (80, 90) for m, k, n in ((1024, 4096, 1024), (1000, 384, 256), (8192, 8192, 8192))]);"
        "from relax_cutlass.kinds.gemm.profile import gemm_candidates;"
        "print([t.describe() for t in gemm_candidates(GemmProblem(1024, 1024, 1024, True), 90, 90, 100)])"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2, 3, 4)
    }
    assert len(runs) == 1, runs


@pytest.mark.parametrize(
    "value, modes, captured",
    [
        # default: the GEMMs keep PDL inside CUDA graphs up to PDL_IN_GRAPHS_MAX_FLOPS per launch,
        # the norms and attention do not (bench/pdl_ab.py on the H100)
        (None, (3, 1, 1), "1 0 1 0 0"),
        ("1", (3, 1, 1), "1 0 1 0 0"),
        ("0", (0, 0, 0), "0 0 0 0 0"),
        ("always", (2, 2, 2), "1 1 1 1 1"),
        ("always:gemm", (2, 1, 1), "1 1 1 0 0"),
        ("always:norm+attention", (1, 2, 2), "0 0 0 1 1"),
        ("always:none", (1, 1, 1), "0 0 0 0 0"),  # in graphs for no kind, for bench/pdl_ab.py
        # no settings: refused at run time (-1: the run functions return PdlSettingError() and launch
        # nothing) as at build time (toolkit.settings.check_pdl_setting)
        ("always:gem+normx", (-1, -1, -1), "0 0 0 0 0"),  # whole names only
        ("always:", (-1, -1, -1), "0 0 0 0 0"),
        ("always:gemm+", (-1, -1, -1), "0 0 0 0 0"),
        ("off", (-1, -1, -1), "0 0 0 0 0"),
        ("", (-1, -1, -1), "0 0 0 0 0"),
        ("2", (-1, -1, -1), "0 0 0 0 0"),
    ],
)
def test_pdl_switch_reads_the_kinds_kept_in_graphs(tmp_path, value, modes, captured):
    """RELAX_CUTLASS_PDL as each kind's kernel unit reads it (templates.pdl_switch), built with the
    host compiler: "always:" and "+"-joined kinds keep PDL inside CUDA graphs for those kinds only
    (bench/pdl_ab.py's way to find which kernels a graph loses on). `captured`: LaunchWithPdl on a
    stream being captured, for a GEMM of 8.6 GFLOP (BERT-large's largest), one of 69 GFLOP
    (llama_8b_2l's smallest) and one of unknown size, then a norm and an attention; outside a
    graph every mode but 0 launches with PDL."""
    import os
    import shutil
    import subprocess

    from relax_cutlass.toolkit.templates import pdl_switch

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    units = []
    for kind in ("gemm", "norm", "attention"):
        # each unit's anonymous namespace, as in its own translation unit
        unit = pdl_switch(kind).replace("namespace {", f"namespace {kind}_unit {{", 1)
        units.append(unit.replace("bool LaunchWithPdl(cudaStream_t stream,", "bool LaunchWithPdl(int capturing,", 1))
    main = (
        "\n".join(units)
        + """
#include <cstdio>
int main() {
  std::printf("%d %d %d\\n", gemm_unit::PdlMode(), norm_unit::PdlMode(), attention_unit::PdlMode());
  for (int capturing = 0; capturing < 2; ++capturing) {
    std::printf("%d %d %d %d %d\\n", gemm_unit::LaunchWithPdl(capturing, 8.6e9),
                gemm_unit::LaunchWithPdl(capturing, 6.9e10), gemm_unit::LaunchWithPdl(capturing),
                norm_unit::LaunchWithPdl(capturing), attention_unit::LaunchWithPdl(capturing));
  }
}
"""
    )
    # LaunchWithPdl needs the CUDA runtime; here `capturing` stands for the stream's capture status
    main = main.replace("cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;", "int capture = capturing;")
    main = main.replace("if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {", "if (false) {")
    main = main.replace("cudaGetLastError();", "")
    main = main.replace("if (capture == cudaStreamCaptureStatusNone) return true;", "if (capture == 0) return true;")
    (tmp_path / "pdl.cc").write_text(main)
    subprocess.run([cxx, "-O1", "-o", str(tmp_path / "pdl"), str(tmp_path / "pdl.cc")], check=True)
    env = {k: v for k, v in os.environ.items() if k != "RELAX_CUTLASS_PDL"}
    if value is not None:
        env["RELAX_CUTLASS_PDL"] = value
    out = subprocess.run([str(tmp_path / "pdl")], check=True, capture_output=True, text=True, env=env).stdout
    mode_line, outside, inside = out.splitlines()
    assert tuple(int(x) for x in mode_line.split()) == modes
    assert outside == ("0 0 0 0 0" if value == "0" or modes[0] < 0 else "1 1 1 1 1")
    assert inside == captured
    from relax_cutlass.toolkit.settings import SettingError, check_pdl_setting

    with pytest.MonkeyPatch.context() as env_patch:
        env_patch.delenv("RELAX_CUTLASS_PDL", raising=False)
        if value is not None:
            env_patch.setenv("RELAX_CUTLASS_PDL", value)
        if modes[0] < 0:  # the build refuses exactly what the kernels refuse
            with pytest.raises(SettingError, match="RELAX_CUTLASS_PDL=.* is not a setting"):
                check_pdl_setting()
        else:
            assert check_pdl_setting() == value


def test_sm90_kernels_launch_as_programmatic_dependents():
    """PDL hid 1.5-2 us of each back-to-back SM90 GEMM behind the previous kernel's tail on the H100
    (bench/results/2026-11-23-pdl-sweep-nvidia-h100.json). CUTLASS reads the switch when its
    headers are included, so it must come first; CUTLASS 2.x (SM80) kernels have no such launch."""
    text = emit_kernel(region(dense_epilogue_model(512, 256, 128)).kernel).text
    assert text.index("#define CUTLASS_ENABLE_GDC_FOR_SM90") < text.index("#include")
    assert (
        "/*launch_with_pdl=*/LaunchWithPdl(stream, 2.0 * m * n * k))" in text and 'getenv("RELAX_CUTLASS_PDL")' in text
    )
    # the switch asks whether the stream is being captured: in CUDA graphs only the GEMMs keep PDL
    # by default (bench/pdl_ab.py)
    assert "cudaStreamIsCapturing(stream, &capture)" in text
    text80 = emit_kernel(region(dense_epilogue_model(512, 256, 128), arch="sm_80").kernel).text
    assert "GDC" not in text80 and "status = op.run(stream);" in text80
    # CUTLASS 4.2's stream-K scheduler does not compile with it: those kernels launch plainly.
    split_k = choose_kernel(
        GemmProblem(128, 1024, 4096, True), Epilogue(), 90, tile="tb128x128x64_c1x2x1_cooperative_splitk"
    )
    text = emit_kernel(split_k).text
    assert "GDC" not in text and "status = op.run(stream);" in text


def test_epilogue_subtile_is_cutlass_choice_unless_set():
    kernel = choose_kernel(GemmProblem(4096, 1024, 4096, True), Epilogue(bias=True), 90)
    assert "EpilogueTileAuto" in emit_kernel(kernel).text
    tile = dataclasses.replace(kernel.tile, epilogue_tile=(128, 64))
    assert tile.describe() == kernel.tile.describe() + "_epi128x64"
    text = emit_kernel(dataclasses.replace(kernel, tile=tile)).text
    assert "cute::Shape<cute::_128, cute::_64>, float, float" in text and "EpilogueTileAuto" not in text
