"""Kernel choice: candidates come from cutlass_library; the heuristic is legal and deterministic."""

from relax_cutlass.arch import SMEM_LIMIT
from relax_cutlass.kinds.epilogue import Epilogue
from relax_cutlass.kinds.gemm.records import GemmProblem
from relax_cutlass.kinds.gemm.select import candidate_tiles, choose_kernel, estimate_cost, tile_smem_bytes


def test_candidates_are_cutlass_library_sm80_tiles():
    for acc in ("float32", "float16"):
        tiles = candidate_tiles(acc)
        assert len(tiles) == 22  # GenerateSM80_TensorOp_16816's tile list
        assert all(t.instruction == (16, 8, 16) for t in tiles)
        assert ((256, 128, 32), (4, 2, 1), 3) in {(t.threadblock, t.warps, t.stages) for t in tiles}


def test_choice_fits_shared_memory_and_is_deterministic():
    for arch in (80, 86, 90):
        for m, n, k in [(1, 64, 64), (1024, 4096, 1024), (8192, 1024, 4096), (None, 768, 3072)]:
            p = GemmProblem(m, n, k, True)
            a, b = choose_kernel(p, Epilogue(), arch), choose_kernel(p, Epilogue(), arch)
            assert a == b and tile_smem_bytes(a.tile) <= SMEM_LIMIT[arch]
            assert a.selected_by == "heuristic"


def test_wave_quantization_prefers_one_full_wave():
    """1024x4096 on an H100 (132 SMs): 128 CTAs of 256x128 beat 256 CTAs of 128x128 (2 waves)."""
    p = GemmProblem(1024, 4096, 1024, True)
    tiles = {t.threadblock: t for t in candidate_tiles("float32")}
    assert estimate_cost(p, tiles[(256, 128, 64)], 90) < estimate_cost(p, tiles[(128, 128, 64)], 90)
    assert choose_kernel(p, Epilogue(), 90).tile.threadblock[:2] in {(256, 128), (128, 256)}
