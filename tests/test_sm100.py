"""SM100 (datacenter Blackwell, tcgen05) kernel path: candidates, choice, fallback, emitted CUTLASS
3.x source. tests/test_nvcc.py compiles these kernels and checks their SASS; no
Blackwell GPU has run them."""

import dataclasses

import pytest

import relax_cutlass
from relax_cutlass.kinds.epilogue import Epilogue
from relax_cutlass.kinds.gemm.profile import gemm_candidates
from relax_cutlass.kinds.gemm.records import GemmProblem
from relax_cutlass.kinds.gemm.select import choose_kernel
from relax_cutlass.kinds.gemm.sm100 import HEURISTIC_TILES, candidate_tiles_sm100, cta_tile, heuristic_pool
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing.models import dense_epilogue_model

GEMM = GemmProblem(1024, 4096, 1024, True)


def test_candidates_come_from_cutlass_library_sm100_generator():
    tiles = candidate_tiles_sm100("float32")
    assert {t.schedule for t in tiles} == {"1sm", "2sm"}
    assert {t.scheduler for t in tiles} == {"default", "streamk"}
    assert all(0 not in t.cluster for t in tiles)  # dynamic clusters need a run-time shape: left out
    # 2-SM MMAs span a pair of SMs: their cluster's M is even
    assert all(t.cluster[0] % 2 == 0 for t in tiles if t.schedule == "2sm")
    assert {(256, 128, 64), (256, 256, 64), (128, 256, 64)} <= {t.threadblock for t in tiles}
    assert candidate_tiles_sm100("float32", "bfloat16")  # bf16 inputs have the same configurations


def test_heuristic_pool_is_one_configuration_per_tile_on_its_smallest_cluster():
    pool = heuristic_pool(GEMM)
    assert {(t.threadblock[0], t.threadblock[1], t.schedule) for t in pool} == HEURISTIC_TILES
    assert all(t.cluster == ((2, 1, 1) if t.schedule == "2sm" else (1, 1, 1)) for t in pool)


@pytest.mark.parametrize(
    "m,n,k,expected",
    [
        (8192, 8192, 8192, "tb256x256x64_c2x1x1_2sm"),  # large: the widest per-SM tile
        (1024, 4096, 1024, "tb256x256x64_c2x1x1_2sm"),  # 64 MMA tiles on 128 of 148 SMs: one wave
        (512, 768, 768, "tb128x128x64_c2x1x1_2sm"),  # GPT-2 at 1 x 512: more, smaller tiles
    ],
)
def test_heuristic_choice(m, n, k, expected):
    kernel = choose_kernel(GemmProblem(m, n, k, True), Epilogue(bias=True), 100)
    assert kernel.arch == 100 and kernel.target == 100 and kernel.tile.describe() == expected
    assert kernel.selected_by == "heuristic" and "not yet run on Blackwell hardware" in kernel.note


def test_unaligned_problem_falls_back_to_sm80_with_the_reason():
    kernel = choose_kernel(GemmProblem(512, 100, 256, True), Epilogue(), 100)
    assert kernel.arch == 80 and "TMA needs 16-byte rows" in kernel.note


def test_pinned_and_profiled_candidates():
    name = "tb128x256x64_c1x1x1_1sm_streamk"
    pinned = choose_kernel(GEMM, Epilogue(), 100, tile=name)
    assert pinned.arch == 100 and pinned.tile.describe() == name and pinned.selected_by == "pinned"
    with pytest.raises(ValueError, match="not an SM100 candidate"):
        choose_kernel(GEMM, Epilogue(), 100, tile="tb128x128x64_c2x1x1_cooperative")
    candidates = gemm_candidates(GEMM, 100, 100, 6)
    assert candidates[0] == choose_kernel(GEMM, Epilogue(), 100).tile  # the heuristic's own first
    assert len(set(candidates)) == 6 and all(t in candidate_tiles_sm100("float32") for t in candidates)


def test_emitted_source_is_a_tcgen05_kernel_with_the_evt_epilogue():
    kernel = choose_kernel(GEMM, Epilogue(bias=True, activation="gelu"), 100)
    text = emit_kernel(kernel).text
    assert "cutlass::arch::Sm100" in text and "cutlass::arch::Sm90," not in text
    assert "KernelTmaWarpSpecialized2SmSm100" in text and "epilogue::TmaWarpSpecialized2Sm," in text
    # the MMA tile spans the SM pair; the EVT's bias broadcast tiles by one CTA's half of it
    assert "using MmaTileShape = cute::Shape<cute::_256, cute::_256, cute::_64>;" in text
    assert "using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;" in text
    assert "Sm90RowBroadcast<0, TileShape" in text and "RelaxCutlassGelu16" in text
    assert "CUTLASS_ENABLE_GDC_FOR_SM100" in text and "cc == 100" in text
    assert cta_tile(kernel.tile) == (128, 256, 64)
    streamk = choose_kernel(GEMM, Epilogue(residual=True), 100, tile="tb128x256x64_c1x1x1_1sm_streamk")
    text = emit_kernel(streamk).text
    assert "CUTLASS_ENABLE_GDC" not in text and "StreamKScheduler" in text  # launched plainly
    assert "KernelTmaWarpSpecialized1SmSm100" in text and "Sm90SrcFetch" in text
    assert "using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;" in text


def test_offload_report_for_every_tcgen05_target():
    mod = dense_epilogue_model(512, 256, 128)
    for arch, name in (("sm_100a", "sm_100a"), ("sm_100f", "sm_100a"), ("10.3", "sm_103a"), ("sm_110", "sm_110a")):
        (row,) = relax_cutlass.offload_report(mod, arch).offloaded
        assert row["family"] == "sm100" and row["target"] == name, (arch, row)
    (row,) = relax_cutlass.offload_report(mod, "sm_100a", family="sm80").offloaded
    assert row["family"] == "sm80" and row["note"] == "SM80 kernel requested (family='sm80')"


def test_kernel_records_differ_by_family():
    sm90 = choose_kernel(GEMM, Epilogue(), 90)
    sm100 = choose_kernel(GEMM, Epilogue(), 100)
    assert sm90.name.startswith("sm90_") and sm100.name.startswith("sm100_") and sm90 != sm100
    assert dataclasses.replace(sm100, note="x") == sm100  # notes do not make kernels differ
