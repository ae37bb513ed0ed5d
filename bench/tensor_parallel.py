"""Tensor parallelism on 1, 2 and 4 GPUs of one host: a Llama-70B-shaped decoder stack (hidden 8192,
64 heads over 8 kv heads, intermediate 28672; `--layers` of them), fp16, sharded with
`relax_cutlass.parallel` (Megatron splits, NCCL all-reduces through TVM's disco, CUTLASS kernels
in every rank) against PyTorch with the same sharding (`parallel.shard_model` in every rank, its
all-reduce torch.distributed's over NCCL) under torch.compile(mode="reduce-overhead") where it runs,
else eager.

    python bench/tensor_parallel.py [--world-sizes 1,2,4] [--layers 4] [--out tp.json]

Shapes (`--shapes`): a prefill of 1 x 2048 tokens and a decode-sized batch of 32 sequences of one
token. Each world size and shape is its own build: every rank's shard imported and offloaded on the
CPU (about 50 s per 0.35 B parameters on 2 cores), so the full 4-layer stack takes many minutes;
`--small` or `--layers 1` first. Per
world size: relax_cutlass's output against the unsharded model in float32 on GPU 0 (relative
error), its median ms (TVM's CUDA-graph build, disco's dispatch included) and the scaling
efficiency t(1) / (n * t(n)), torch's median ms. NCCL_NVLS_ENABLE=0 (NVLink multicast off on the
lent hosts). Needs the GPU host (torch, transformers, a GPU per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

SHAPES = {"prefill_1x2048": (1, 2048), "decode_32x1": (32, 1)}


def config(layers: int, small: bool = False):
    import transformers

    sizes = dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8)
    if small:  # a quick run of the same code path
        sizes = dict(hidden_size=1024, intermediate_size=3584, num_attention_heads=8, num_key_value_heads=8)
    return transformers.LlamaConfig(num_hidden_layers=layers, vocab_size=32000, **sizes)


def _ms(run, repeat: int = 10, number: int = 10) -> float:
    run(3)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        run(number)
        samples.append((time.perf_counter() - start) * 1e3 / number)
    return statistics.median(samples)


def relax_cutlass_rows(model, world_sizes, arch, target, want, log) -> list[dict]:
    import numpy as np
    import torch
    import tvm

    from relax_cutlass.parallel import TensorParallelModule, offload_tensor_parallel
    from relax_cutlass.testing.errors import rel_error

    rows = []
    for name, (batch, seq) in SHAPES.items():
        ids = torch.randint(0, 32000, (batch, seq), generator=torch.Generator().manual_seed(1))
        for n in world_sizes:
            t0 = time.perf_counter()
            build = offload_tensor_parallel(model, (ids,), n, arch)
            library = Path(tempfile.mkdtemp()) / f"tp{n}_{name}.so"
            with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
                tvm.compile(build.module, target).export_library(str(library))
            built = time.perf_counter() - t0
            group = TensorParallelModule(str(library), build.params)
            try:
                got = group(ids.numpy())
                tokens = ids.numpy()
                ms = _ms(lambda k, g=group, i=tokens: g.run_only(i, repeat=k))
            finally:
                group.shutdown()
            error = rel_error(got, want[name]) if name in want else float("nan")
            rows.append(dict(shape=name, world_size=n, relax_cutlass_ms=ms, error_vs_fp32=error, build_s=built))
            log(f"relax_cutlass {name} tp{n}: {ms:.3f} ms, error {error:.2e}, built in {built:.0f} s")
            assert np.isfinite(got).all()
    return rows


def _torch_rank(rank: int, world_size: int, layers: int, small: bool, queue) -> None:
    """One rank of torch's tensor-parallel run: its shard (random weights), compiled, timed."""
    import torch
    import torch.distributed as dist

    from relax_cutlass.parallel import shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=torch.device("cuda", rank))
    import transformers

    with torch.device("meta"):
        full = transformers.LlamaModel(config(layers, small))
    shard = shard_model(full, rank, world_size)
    shard = shard.to_empty(device=f"cuda:{rank}").half()
    with torch.device(f"cuda:{rank}"):  # its frequencies, which a meta model leaves unset (float32)
        shard.rotary_emb = type(shard.rotary_emb)(config=shard.config)
    with torch.no_grad():
        for p in shard.parameters():
            p.normal_(0, 0.02)
    results = {}
    for name, (batch, seq) in SHAPES.items():
        ids = torch.randint(0, 32000, (batch, seq), device=f"cuda:{rank}")
        mode = "reduce-overhead"
        try:
            fn = torch.compile(shard, mode=mode)
            with torch.no_grad():
                for _ in range(3):
                    fn(ids)
        except Exception as err:  # noqa: BLE001 - recorded: eager is then the baseline
            mode, fn = f"eager ({type(err).__name__})", shard
        torch.cuda.synchronize()
        dist.barrier()

        def run(k, fn=fn, ids=ids):
            with torch.no_grad():
                for _ in range(k):
                    fn(ids)
            torch.cuda.synchronize()

        results[name] = (_ms(run), mode)
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def torch_rows(world_sizes, layers, small, log) -> list[dict]:
    import torch.multiprocessing as mp

    rows = []
    for n in world_sizes:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_torch_rank, args=(r, n, layers, small, queue)) for r in range(n)]
        [p.start() for p in procs]
        try:
            results = queue.get(timeout=1200)
        except Exception as err:  # noqa: BLE001
            results = {}
            log(f"torch tp{n}: no result ({type(err).__name__})")
        [p.join(timeout=60) for p in procs]
        for name, (ms, mode) in results.items():
            rows.append(dict(shape=name, world_size=n, torch_ms=ms, torch_mode=mode))
            log(f"torch {name} tp{n}: {ms:.3f} ms ({mode})")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default=None, help="comma-separated; default 1, 2, 4 up to the GPUs visible")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--small", action="store_true", help="hidden 1024: the same code path, quickly")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--out", type=Path, default=Path("tensor_parallel.json"))
    args = ap.parse_args()
    unknown = set(args.shapes.split(",")) - set(SHAPES)
    if unknown:
        ap.error(f"--shapes: unknown {sorted(unknown)}; use names from {list(SHAPES)}")
    for name in set(SHAPES) - set(args.shapes.split(",")):
        del SHAPES[name]
    import torch
    import tvm

    from relax_cutlass.arch import local_gpu_arch

    gpus = torch.cuda.device_count()
    sizes = [int(s) for s in args.world_sizes.split(",")] if args.world_sizes else [n for n in (1, 2, 4) if n <= gpus]
    log = lambda line: print(line, flush=True)  # noqa: E731
    sm = local_gpu_arch()
    arch = f"sm_{sm}{'a' if sm == 90 else ''}"
    target = tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = __import__("transformers").LlamaModel(config(args.layers, args.small)).eval()
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, {time.perf_counter() - t0:.0f} s")
    want = {}
    with torch.no_grad():
        reference = model.cuda()
        for name, (batch, seq) in SHAPES.items():
            ids = torch.randint(0, 32000, (batch, seq), generator=torch.Generator().manual_seed(1))
            want[name] = reference(ids.cuda()).last_hidden_state.float().cpu().numpy()
        model = reference.cpu()
    torch.cuda.empty_cache()
    rows = relax_cutlass_rows(model, sizes, arch, target, want, log)
    if not args.no_torch:
        del model
        rows += torch_rows(sizes, args.layers, args.small, log)
    by_shape: dict[str, dict[int, dict]] = {}
    for r in rows:
        by_shape.setdefault(r["shape"], {}).setdefault(r["world_size"], {}).update(r)
    table = []
    for per_n in by_shape.values():
        base = per_n.get(1, {}).get("relax_cutlass_ms")
        for n, r in sorted(per_n.items()):
            ours, theirs = r.get("relax_cutlass_ms"), r.get("torch_ms")
            r["scaling_efficiency"] = base / (n * ours) if base and ours else None
            r["vs_torch"] = theirs / ours if ours and theirs else None
            table.append(r)
    result = dict(
        device=torch.cuda.get_device_name(0), gpus=gpus, arch=arch, layers=args.layers, small=args.small,
        torch=torch.__version__, nccl_nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"), rows=table,
    )  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    log("| shape | GPUs | relax_cutlass ms | scaling eff. | torch ms (mode) | vs torch | error vs fp32 |")
    log("|---|---|---|---|---|---|---|")
    for r in table:
        eff = f"{r['scaling_efficiency']:.2f}" if r.get("scaling_efficiency") else "-"
        vs = f"{r['vs_torch']:.2f}x" if r.get("vs_torch") else "-"
        log(
            f"| {r['shape']} | {r['world_size']} | {r.get('relax_cutlass_ms', float('nan')):.3f} | {eff} "
            f"| {r.get('torch_ms', float('nan')):.3f} ({r.get('torch_mode', '-')}) | {vs} "
            f"| {r.get('error_vs_fp32', float('nan')):.1e} |"
        )


if __name__ == "__main__":
    sys.exit(main())
