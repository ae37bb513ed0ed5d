"""`python -m relax_cutlass tune`: build a model's profiler here, run it on the GPU host, keep the records.

    python -m relax_cutlass tune build --model bert --arch sm_90a --out build/tune    # here (TVM + nvcc)
    python -m relax_cutlass tune run build/tune tuning.jsonl                         # GPU host (runtime)
    python -m relax_cutlass ... with RELAX_CUTLASS_TUNING_DB=tuning.jsonl            # builds use the records

GEMM and conv2d regions are tuned (a symbolic-batch conv keeps the heuristic; the report says so).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

MODELS = ("bert", "bench", "resnet50", "conv_bench", "bert_large")
RESNET_BATCHES = (32, 1)
BERT_LARGE_BATCHES = (8, 1)  # x seq: the BERT-large benchmark's shapes


def _model_modules(model: str, batch: int, seq: int) -> list:
    from .models import (
        bert_encoder_layer,
        bind_float16,
        bind_weights,
        conv2d_epilogue_model,
        dense_epilogue_model,
        random_weights,
    )

    if model == "bert":
        mod = bert_encoder_layer(batch=batch, seq=seq)
        return [bind_weights(mod, random_weights(mod))]
    if model == "bench":  # the dense benchmark shapes of bench/ (weights as parameters: (N, K) "dense" B)
        shapes = [(m, k, n) for m in (1024, 4096, 8192) for k, n in ((1024, 4096), (4096, 1024))]
        mods = [dense_epilogue_model(m, n, k) for m, k, n in [*shapes, (8192, 8192, 8192)]]
        return [*mods, dense_epilogue_model("m", 4096, 1024)]  # symbolic M: tuned per M bucket
    if model == "conv_bench":  # the ResNet-50 3x3 stages of bench/, batch 32 and 1
        stages = ((56, 64), (28, 128), (14, 256), (7, 512))
        return [
            conv2d_epilogue_model(b, hw, hw, c, c, activation="relu", layout="NHWC")
            for b in (32, 1)
            for hw, c in stages
        ]
    if model == "bert_large":  # transformers BERT-large as benchmarked; one layer has every GEMM shape
        from .torch_models import bert_module

        return [bind_float16(*bert_module(batch=b, seq=seq, layers=1)) for b in BERT_LARGE_BATCHES]
    from .torch_models import resnet50_module  # ResNet-50 at the benchmarked batch sizes

    return [bind_float16(*resnet50_module(batch=b)) for b in RESNET_BATCHES]


def _model_problems(model: str, arch: int, batch: int, seq: int):
    """The GEMM and conv2d problems of an embedded model, as the offload pipeline plans them."""
    from .codegen import CodegenOptions, plan_regions
    from .constants import offloaded_functions
    from .transform import ConvertToNHWC, LiftConstants, PartitionForCutlass

    problems = []
    for mod in _model_modules(model, batch, seq):
        part = LiftConstants()(PartitionForCutlass(arch)(ConvertToNHWC()(mod)))
        regions = plan_regions([f for _, f in offloaded_functions(part)], CodegenOptions(arch=arch, compile=False))
        problems += [r.kernel.problem for r in regions]
    return problems


def build(argv: list[str]) -> int:
    from .arch import parse_arch
    from .profile import DEFAULT_MAX_CANDIDATES, build_profiler, plan_jobs

    ap = argparse.ArgumentParser(prog="python -m relax_cutlass tune build")
    ap.add_argument("--model", choices=MODELS, action="append", help=f"one of {MODELS} (default bert); repeatable")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--batch", type=int, default=8, help="bert's batch (bert_large: 8 and 1; ResNet-50: 32 and 1)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--max-candidates", type=int, default=DEFAULT_MAX_CANDIDATES)
    ap.add_argument("--out", type=Path, default=Path("build/tune"))
    args = ap.parse_args(argv)
    arch = parse_arch(args.arch)
    t0 = time.time()
    problems = [p for model in args.model or ["bert"] for p in _model_problems(model, arch, args.batch, args.seq)]
    jobs = plan_jobs(problems, arch, limit=args.max_candidates)
    kernels = {k.name for job in jobs for k in job.kernels}
    print(f"{len(jobs)} problem(s), {len(kernels)} distinct candidate kernel(s) (no epilogue)")
    library = build_profiler(jobs, arch, args.out)
    print(
        f"built {library} in {time.time() - t0:.0f}s; run `python -m relax_cutlass tune run {args.out} DB` on the GPU"
    )
    return 0


def run(argv: list[str]) -> int:
    from .profile_runner import main as runner_main

    return runner_main(argv)


def main(argv: list[str]) -> int:
    commands = {"build": build, "run": run}
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
