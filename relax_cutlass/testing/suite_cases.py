"""The GPU suite's benchmark cases (bench/gpu_suite.py): dense + epilogue against cuBLAS, the SM90
tile sweep, ResNet-50's 3x3 stages against cuDNN, the fused attention of BERT-large, one BERT-large
layer, whole ResNet-50 and BERT-large. Building them needs TVM's compiler (relax_cutlass/testing/gpu_build.py)."""

from __future__ import annotations

import functools
import math

from .gpu_build import SuiteCase, bert_flops, shippable_bert_large, shippable_resnet50, stage_model
from .models import bert_encoder_layer, dense_epilogue_model

BENCH_M = (1024, 4096, 8192)
BENCH_KN = ((1024, 4096), (4096, 1024))
BENCH_EXTRA = ((8192, 8192, 8192),)  # (M, K, N): the peak-throughput shape
BENCH_EPILOGUES = {"bias_gelu": dict(activation="gelu"), "bias_residual": dict(residual=True)}
FAMILIES = ("auto", "sm80")
# SM90 configurations timed side by side (dense + bias + gelu, symbolic M) to calibrate the heuristic.
SWEEP_TILES = [
    f"tb{tile}_c{cluster}_{schedule}"
    for schedule, tiles in (
        ("cooperative", ("128x128x64", "128x256x64", "256x128x64")),
        ("pingpong", ("64x256x64", "128x128x64")),  # 128x256 ping-pong spills: not a candidate
    )
    for tile in tiles
    for cluster in ("2x1x1", "1x2x1")
] + ["tb128x128x64_c2x1x1_cooperative_streamk", "tb128x256x64_c2x1x1_cooperative_streamk"]
SWEEP_KN = ((1024, 4096), (4096, 1024), (8192, 8192))  # native kernels for the target (SM90 on sm_90a), and CUTLASS 2.x
# ResNet-50 3x3 stages (H=W, C=K) and batch sizes for the conv + bias + relu benchmark.
CONV_STAGES = ((56, 64), (28, 128), (14, 256), (7, 512))
CONV_BATCHES = (32, 1)
RESNET_BATCHES = (32, 1)
# BERT-large encoder benchmark: (batch, seq) and the layer count.
BERT_SHAPES = ((8, 128), (1, 128))
BERT_LAYERS = 24


def bench_shapes() -> list[tuple[int, int, int]]:
    """(M, K, N) of the dense benchmark."""
    return [(m, k, n) for m in BENCH_M for k, n in BENCH_KN] + list(BENCH_EXTRA)


def _unbound(build):
    """A module factory for SuiteCase (weights stay parameters), built once however often it is read."""
    return functools.cache(lambda: (build(), False))


def benchmark_cases(sections: set[str], tuning_db: str = "") -> list[SuiteCase]:
    """The benchmark sections' cases; with a tuning database, each also gets a "tuned" build."""
    tuned = ("tuned",) if tuning_db else ()
    cases = []
    if "bench" in sections:
        cases += [
            SuiteCase(
                "bench", f"dense_{epi}_m{m}_k{k}_n{n}",
                _unbound(lambda m=m, n=n, k=k, kw=kw: dense_epilogue_model(m, n, k, **kw)),
                families=FAMILIES + tuned, fields=dict(epilogue=epi, m=m, n=n, k=k, flops=2 * m * n * k),
            )
            for epi, kw in BENCH_EPILOGUES.items()
            for m, k, n in bench_shapes()
        ]  # fmt: skip
    if "conv_bench" in sections:
        cases += [
            SuiteCase(
                "conv_bench", f"conv3x3_n{b}_{hw}x{hw}_c{c}", _unbound(lambda b=b, hw=hw, c=c: stage_model(b, hw, c)),
                families=("auto", *tuned), fields=dict(batch=b, hw=hw, c=c, flops=2 * b * hw * hw * c * c * 9),
            )
            for b in CONV_BATCHES
            for hw, c in CONV_STAGES
        ]  # fmt: skip
    if "model" in sections:  # weights bound, as the layer a user builds
        layer = functools.cache(lambda: (bert_encoder_layer(), True))
        cases.append(SuiteCase("model", "bert_large_layer", layer, families=("auto", *tuned), cuda_graph=True))
    if "sweep" in sections:
        for k, n in SWEEP_KN:
            model = _unbound(lambda k=k, n=n: dense_epilogue_model("m", n, k, activation="gelu"))
            cases += [
                SuiteCase("sweep", f"sweep_k{k}_n{n}_{tile}", model, {"tile": tile},
                          fields=dict(k=k, n=n, tile=tile), with_reference=False)
                for tile in SWEEP_TILES
            ]  # fmt: skip
    if "resnet" in sections:
        cases += [
            SuiteCase("resnet", f"resnet50_n{b}", _unbound(lambda b=b: shippable_resnet50(b)),
                      families=("auto", *tuned), fields=dict(batch=b))
            for b in RESNET_BATCHES
        ]  # fmt: skip
    if "bert" in sections:
        cases += [
            SuiteCase(
                "bert", f"bert_large_b{b}_s{s}", _unbound(lambda b=b, s=s: shippable_bert_large(b, s, BERT_LAYERS)),
                families=("auto", *tuned), cuda_graph=True,
                fields=dict(batch=b, seq=s, layers=BERT_LAYERS, flops=bert_flops(b, s, BERT_LAYERS)),
            )
            for b, s in BERT_SHAPES
        ]  # fmt: skip
    return cases


def offloaded_flops(entry: dict) -> int:
    """FLOPs of a built model's offloaded regions, every call counted (the BERT table's fraction)."""
    return sum((r.get("flops") or 2 * math.prod(r["mnk"])) * r["calls"] for r in entry["offloaded"])
