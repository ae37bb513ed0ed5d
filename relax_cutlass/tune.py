"""`python -m relax_cutlass tune`: build a model's profiler here, run it on the GPU host, keep the records.

    python -m relax_cutlass tune build --model bert --db tuning.jsonl --out build/tune   # here (TVM + nvcc)
    python -m relax_cutlass tune run build/tune tuning.jsonl                            # GPU host (runtime)
    (repeat both: the second round times the fastest main loops with each region's epilogue)
    python -m relax_cutlass ... with RELAX_CUTLASS_TUNING_DB=tuning.jsonl               # builds use the records

`tune build` builds what `--db` still lacks: main-loop candidates (stage 1) for problems without a
record, then the epilogue stage for regions whose problem has one. It says when nothing is left.
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
BENCH_EPILOGUES = ({"activation": "gelu"}, {"residual": True})  # the GPU suite's bench cases (bias + ...)


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
    if model == "bench":  # the dense benchmark cases of bench/ (weights as parameters: (N, K) "dense" B)
        shapes = [(m, k, n) for m in (1024, 4096, 8192) for k, n in ((1024, 4096), (4096, 1024))]
        mods = [
            dense_epilogue_model(m, n, k, **epilogue)
            for m, k, n in [*shapes, (8192, 8192, 8192)]
            for epilogue in BENCH_EPILOGUES
        ]
        return [*mods, dense_epilogue_model("m", 4096, 1024)]  # symbolic M: tuned per M bucket
    if model == "conv_bench":  # the ResNet-50 3x3 stages of bench/, batch 32 and 1
        stages = ((56, 64), (28, 128), (14, 256), (7, 512))
        return [
            conv2d_epilogue_model(b, hw, hw, c, c, activation="relu", layout="NHWC")
            for b in (32, 1)
            for hw, c in stages
        ]
    if model == "bert_large":  # transformers BERT-large as benchmarked; one layer has every GEMM shape
        from .models.torch_transformers import bert_module

        return [bind_float16(*bert_module(batch=b, seq=seq, layers=1)) for b in BERT_LARGE_BATCHES]
    from .models.torch_models import resnet50_module  # ResNet-50 at the benchmarked batch sizes

    return [bind_float16(*resnet50_module(batch=b)) for b in RESNET_BATCHES]


def _model_regions(model: str, arch: int, batch: int, seq: int):
    """(problem, epilogue) of every offloaded region of an embedded model, as the pipeline plans them."""
    from .pipeline import partition_as_offloaded
    from .stages.codegen import CodegenOptions, plan_regions
    from .stages.constants import offloaded_functions

    pairs = []
    for mod in _model_modules(model, batch, seq):
        part = partition_as_offloaded(mod, arch)
        options = CodegenOptions(arch=arch, compile=False, profile="never")
        regions = plan_regions([f for _, f in offloaded_functions(part)], options)
        pairs += [(r.kernel.problem, r.kernel.epilogue) for r in regions]
    return pairs


def build(argv: list[str]) -> int:
    from .arch import parse_arch
    from .stages.profile import (
        DEFAULT_MAX_CANDIDATES,
        DEFAULT_TOP_K,
        build_profiler,
        plan_epilogue_jobs,
        plan_jobs,
        retime_reason,
    )
    from .toolkit.tuning import TuningDatabase

    ap = argparse.ArgumentParser(prog="python -m relax_cutlass tune build")
    ap.add_argument("--model", choices=MODELS, action="append", help=f"one of {MODELS} (default bert); repeatable")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--batch", type=int, default=8, help="bert's batch (bert_large: 8 and 1; ResNet-50: 32 and 1)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--db", type=Path, help="tuning database so far: build only what it lacks (both stages)")
    ap.add_argument("--max-candidates", type=int, default=DEFAULT_MAX_CANDIDATES, help="stage 1, per problem")
    ap.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="stage 2: main loops re-timed with the epilogue")
    ap.add_argument("--out", type=Path, default=Path("build/tune"))
    args = ap.parse_args(argv)
    arch = parse_arch(args.arch)
    t0 = time.time()
    regions = [r for model in args.model or ["bert"] for r in _model_regions(model, arch, args.batch, args.seq)]
    db = TuningDatabase(args.db) if args.db else None
    main_loops = [
        job
        for job in plan_jobs([p for p, _ in regions], arch, limit=args.max_candidates)
        if db is None or retime_reason(job, db.lookup(job.key))
    ]
    fused = []
    if db is not None:
        fused = [
            job
            for job in plan_epilogue_jobs(regions, arch, db, top_k=args.top_k)
            if retime_reason(job, db.lookup(job.key))
        ]
    jobs = main_loops + fused
    kernels = {k.name for job in jobs for k in job.kernels}
    print(
        f"stage 1 (main loops): {len(main_loops)} problem(s); stage 2 (with epilogues): {len(fused)} region kind(s); "
        f"{len(kernels)} distinct kernel(s)"
    )
    if not jobs:
        print("nothing to tune: the database has every record these models use")
        return 0
    library = build_profiler(jobs, arch, args.out)
    rerun = " then `tune build` again with --db for the epilogue stage" if main_loops else ""
    print(
        f"built {library} in {time.time() - t0:.0f}s; run `python -m relax_cutlass tune run {args.out} DB` "
        f"on the GPU{rerun}"
    )
    return 0


def run(argv: list[str]) -> int:
    from .toolkit.profile_runner import main as runner_main

    return runner_main(argv)


def main(argv: list[str]) -> int:
    commands = {"build": build, "run": run}
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
