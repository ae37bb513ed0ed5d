"""Profiling conv2d: the (tile, split-K) candidates timed per problem and the timing function of a
candidate kernel."""

from __future__ import annotations

import itertools
from string import Template

from ..epilogue import Epilogue
from ..gemm.records import TileConfig
from ..gemm.select import under_fills
from .records import Conv2dProblem, conv_family
from .select import choose_conv2d_kernel, choose_split_k, ranked_conv2d_tiles, splits_k


def conv2d_candidates(
    problem: Conv2dProblem, arch: int, limit: int, family: str = "auto"
) -> list[tuple[TileConfig, int]]:
    """The heuristic's (tile, split-K), other split-K counts for it when its tiles under-fill the
    GPU (where the kernel may split: an ungrouped SM80 one), then the next-ranked tiles with their
    own split-K, the two families' (on sm_90a) taking turns, up to `limit`."""
    gemm = problem.implicit_gemm()
    chosen, split = choose_conv2d_kernel(problem, Epilogue(), arch, family=family)
    candidates = [(chosen.tile, split)]
    if splits_k(problem, Epilogue(), chosen.tile) and under_fills(gemm.m, gemm.n, chosen.tile.threadblock, arch):
        iterations = -(-gemm.k // chosen.tile.threadblock[2])
        candidates += [(chosen.tile, s) for s in (1, 2, 4, 8, 16) if s != split and iterations >= 4 * s]
    ranked = ranked_conv2d_tiles(problem, arch, family=family)
    by_family = [[t for t in ranked if conv_family(t) == f] for f in (90, 100, 80)]
    for tile in (t for pair in itertools.zip_longest(*by_family) for t in pair if t is not None):
        candidates.append(
            (tile, choose_split_k(gemm, tile, arch, Epilogue()) if splits_k(problem, Epilogue(), tile) else 1)
        )
    return list(dict.fromkeys(candidates))[:limit]


def split_k_uncertain(problem: Conv2dProblem, arch: int, family: str = "auto") -> str | None:
    """Why profile="uncertain" times `problem`: its output under-fills the GPU where split-K is
    legal, so the heuristic weighs splitting K. Profiling beat the heuristic by 1.07-1.65x on every
    batch-1 conv it split (29 of ResNet-50's on the H100,
    bench/results/2026-11-23-gpu-suite-tuning-conv-nvidia-h100.json: no split, or fewer slices;
    ResNet-50 at batch 1 ran 1.18x faster tuned) and on DenseNet-121's under-filled convs on the
    H200 (2026-12-02-densenet-convs-nvidia-h200.json); the heuristic now splits fewer of them,
    and they stay profiled. Elsewhere profiling gained a median 1.00-1.06x (docs/tuning.md): the
    heuristic stands."""
    if problem.n is None:  # a symbolic batch takes no split-K
        return None
    _, split = choose_conv2d_kernel(problem, Epilogue(), arch, family=family)
    if split > 1:
        return f"the heuristic splits K {split} ways"
    gemm = problem.implicit_gemm()
    sm80 = next((t for t in ranked_conv2d_tiles(problem, arch, family=family) if conv_family(t) == 80), None)
    if sm80 is not None and splits_k(problem, Epilogue()) and under_fills(gemm.m, gemm.n, sm80.threadblock, arch):
        return "its output under-fills the GPU (the heuristic keeps K whole)"
    return None


PROFILE_CONV2D = Template("""\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_relax_cutlass_profile_${index}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny* result) {
  const char* fn = "relax_cutlass_profile_${index}";
  TRY(CheckArgCount(fn, num_args, 8, "x, w, bias, residual, d, shape, split_k, iterations"));
  const DLTensor *x, *w, *bias, *residual, *d;
  const int64_t* shape;
  int64_t split_k, iterations;
  TRY(TensorArg(fn, ffi_args, 0, "x", &x));
  TRY(TensorArg(fn, ffi_args, 1, "w", &w));
  TRY(TensorArg(fn, ffi_args, 2, "bias", &bias));
  TRY(TensorArg(fn, ffi_args, 3, "residual", &residual));
  TRY(TensorArg(fn, ffi_args, 4, "d", &d));
  // shape: n, h, w, c, k, r, s, p, q, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w, groups
  TRY(ShapeArg(fn, ffi_args, 5, "shape", 16, &shape));
  TRY(IntArg(fn, ffi_args, 6, "split_k", &split_k));
  TRY(IntArg(fn, ffi_args, 7, "iterations", &iterations));
  int v[16];
  for (int i = 0; i < 16; ++i) v[i] = static_cast<int>(shape[i]);
  RelaxCutlassConv2dArgs args{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10],
                              v[11], v[12], v[13], v[14], v[15], static_cast<int>(split_k),
                              Data(x), Data(w), ${bias}, ${residual}, const_cast<void*>(Data(d))};
  return TimeLaunches(d, iterations, result, [&](void* stream) { return ${kernel}_run(&args, stream); });
}
""")
