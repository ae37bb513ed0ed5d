"""The model zoo: real models nobody here wrote, imported as users import them, offloaded, built,
checked and timed against PyTorch and TVM's own build on the GPU host.

    python bench/zoo.py [--models resnet50,bert_base,...] [--out DIR] [--torch-compile]

Every model runs in its own child process, so a crash (or a process abort inside a library) is a
row of the table, not the end of the run. Per model: torchvision / transformers construction with
random init (no download), `relax_cutlass.from_torch` (fp32 export -> bound fp16 module), the
offload report's summary, the offloaded build and TVM's default build of the same module (each
also with TVM's CUDA-graph build), the relative error of each against torch float32 on the GPU,
and the median time of each against torch eager (fp16, cudnn.benchmark, channels_last for conv
nets) and, with --torch-compile, torch.compile in its default and "reduce-overhead" modes. JSON
per model and a table last. Needs a GPU, torch, torchvision and transformers (the GPU host).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import time_torch  # noqa: E402  (bench/ is not a package)


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry: how to build it (random init) and its example inputs."""

    name: str
    family: str  # "vision" (channels_last for torch) or "transformer"
    batch: int
    seq: int = 0  # transformers: sequence length of the token ids

    def build(self):
        """-> (torch model in float32 eval mode, example inputs tuple)."""
        import torch

        torch.manual_seed(0)
        return BUILDERS[self.name](self, torch)


def _vision(constructor_name: str):
    def build(entry: ZooModel, torch):
        import torchvision

        model = getattr(torchvision.models, constructor_name)(weights=None)
        image = torch.randn(entry.batch, 3, 224, 224)
        return _calibrate_batch_norm(model, image, torch), (image,)

    return build


def _calibrate_batch_norm(model, image, torch):
    """Random init leaves batch norm at mean 0 / variance 1, so activations grow block after block
    (MobileNetV3's reach 1e5 and overflow fp16): set every batch norm's statistics from one batch,
    as a trained model's would be, then return the model in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for m in norms:
            m.momentum = None  # cumulative average: one batch sets the statistics exactly
            m.reset_running_stats()
        model.train()
        with torch.no_grad():
            model(image)
    return model.eval()


class _LastHiddenState:
    """Wraps a transformers model so the exported graph returns one tensor."""

    @staticmethod
    def wrap(model, torch):
        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids):
                return self.model(input_ids=input_ids).last_hidden_state

        return Wrapped().eval()


def _bert_base(entry: ZooModel, torch):
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(), add_pooling_layer=False).eval()  # default (sdpa) attention
    ids = torch.randint(0, 30000, (entry.batch, entry.seq))
    return _LastHiddenState.wrap(model, torch), (ids,)


def _gpt2(entry: ZooModel, torch):
    from transformers import GPT2Config, GPT2Model

    model = GPT2Model(GPT2Config()).eval()
    ids = torch.randint(0, 50000, (entry.batch, entry.seq))
    return _LastHiddenState.wrap(model, torch), (ids,)


def _llama(entry: ZooModel, torch):
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=4,
        vocab_size=32000,
    )
    model = LlamaModel(config).eval()
    ids = torch.randint(0, 32000, (entry.batch, entry.seq))
    return _LastHiddenState.wrap(model, torch), (ids,)


BUILDERS = {
    "resnet50": _vision("resnet50"),
    "vit_b_16": _vision("vit_b_16"),
    "mobilenet_v3_large": _vision("mobilenet_v3_large"),
    "convnext_tiny": _vision("convnext_tiny"),
    "bert_base": _bert_base,
    "gpt2": _gpt2,
    "llama_gqa": _llama,
}

ZOO = (
    ZooModel("resnet50", "vision", 32),
    ZooModel("bert_base", "transformer", 8, 128),
    ZooModel("gpt2", "transformer", 1, 512),
    ZooModel("llama_gqa", "transformer", 1, 512),
    ZooModel("vit_b_16", "vision", 8),
    ZooModel("mobilenet_v3_large", "vision", 32),
    ZooModel("convnext_tiny", "vision", 32),
)


def _rel_error(got, expected) -> float:
    import numpy as np

    got, expected = np.asarray(got, "float64"), np.asarray(expected, "float64")
    if got.shape != expected.shape:
        return float("nan")
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - expected) / max(np.linalg.norm(expected), 1e-30))


def _tvm_build(mod, target, cuda_graph: bool):
    import tvm

    config = {"relax.backend.use_cuda_graph": True} if cuda_graph else {}
    with tvm.transform.PassContext(opt_level=3, config=config):
        return tvm.compile(mod, target)


def _tvm_runner(ex, inputs):
    """-> (output array, timer): one VM, the inputs on the GPU once."""
    import tvm

    dev = tvm.cuda(0)
    vm = tvm.relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]

    def call():
        out = vm["main"](*args)
        return out[0] if not hasattr(out, "numpy") else out

    out = call().numpy()
    timer = vm.time_evaluator("main", dev, number=10, repeat=10, min_repeat_ms=0)
    return out, lambda: float(statistics.median(timer(*args).results)) * 1e3


BUILDS = ("relax_cutlass", "relax_cutlass_graph", "tvm_default", "tvm_default_graph")


def run_one(entry: ZooModel, torch_compile: bool, arch: str, profile: str, builds_wanted=BUILDS) -> dict:
    """Everything for one model, in this process; returns the JSON record."""
    import numpy as np
    import torch
    import tvm

    import relax_cutlass
    from relax_cutlass.models import tvm_baseline

    record: dict = {"model": entry.name, "batch": entry.batch, "seq": entry.seq, "steps": {}}
    steps = record["steps"]
    torch.backends.cudnn.benchmark = True
    model, example = entry.build()
    inputs_np = [x.numpy() for x in example]

    t0 = time.time()
    mod = relax_cutlass.from_torch(model, example)
    steps["import_s"] = round(time.time() - t0, 1)

    t0 = time.time()
    offloaded = relax_cutlass.offload_pipeline(arch, profile=profile)(mod)
    steps["offload_s"] = round(time.time() - t0, 1)
    report = relax_cutlass.offload_report(offloaded)
    record["report"] = {
        "offloaded_regions": len(report.offloaded),
        "offloaded_calls": sum(r.get("calls", 1) for r in report.offloaded),
        "left_in_tvm": len(report.left_in_tvm),
        "flop_fraction": report.offloaded_flop_fraction,
        "kinds": sorted({r["op"] for r in report.offloaded}),
        "in_tvm_reasons": sorted({r["reasons"][0] for r in report.left_in_tvm}),
        "text": str(report),
    }
    print(report, flush=True)

    sm = relax_cutlass.arch.parse_arch(arch)
    target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{sm}{'a' if sm == 90 else ''}"}, host="llvm")
    builds = {}
    # TVM's own build of the same module; tvm_baseline makes the one rewrite TVM 0.27's CUDA build
    # needs for squeeze-excitation blocks (a broadcast out of a conv's kernel), values unchanged.
    for name, module in (("relax_cutlass", offloaded), ("tvm_default", tvm_baseline(mod))):
        for graph in (False, True):
            key = name + ("_graph" if graph else "")
            if key not in builds_wanted:
                continue
            t0 = time.time()
            try:
                builds[key] = _tvm_build(module, target, graph)
            except Exception as err:  # a baseline TVM cannot build is recorded, not fatal
                record.setdefault("build_errors", {})[key] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                print(f"{entry.name}: {key} build failed: {err}", flush=True)
                if name == "relax_cutlass":
                    raise
            steps[f"build_{key}_s"] = round(time.time() - t0, 1)

    # torch references: float32 (the accuracy reference) and fp16 eager.
    dev = torch.device("cuda")
    memory_format = torch.channels_last if entry.family == "vision" else torch.contiguous_format
    example_gpu = tuple(x.to(dev) for x in example)
    with torch.no_grad():
        ref32 = model.to(dev).float()(*example_gpu).float().cpu().numpy()
        half = model.to(dev).half().to(memory_format=memory_format)
        half_inputs = tuple(
            x.half().to(memory_format=memory_format) if x.is_floating_point() else x for x in example_gpu
        )
        ref16 = half(*half_inputs).float().cpu().numpy()
    record["error"] = {"torch_fp16_vs_fp32": _rel_error(ref16, ref32)}

    timers = {}
    for key, ex in builds.items():
        out, timer = _tvm_runner(ex, inputs_np)
        record["error"][f"{key}_vs_torch_fp32"] = _rel_error(out, ref32)
        timers[key] = timer

    def torch_timer(fn):
        def run():
            with torch.no_grad():
                return time_torch(fn, repeat=10, number=10)

        return run

    timers["torch_eager"] = torch_timer(lambda: half(*half_inputs))
    if torch_compile:
        for mode in ("default", "reduce-overhead"):
            t0 = time.time()
            compiled = torch.compile(half, mode=mode)
            with torch.no_grad():
                for _ in range(3):
                    compiled(*half_inputs)
            torch.cuda.synchronize()
            steps[f"torch_compile_{mode}_s"] = round(time.time() - t0, 1)
            timers[f"torch_compile_{mode}"] = torch_timer(lambda c=compiled: c(*half_inputs))

    times: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(3):  # rounds in turn: clocks drift over a run
        for key, timer in timers.items():
            times[key].append(timer())
    record["ms"] = {k: statistics.median(v) for k, v in times.items()}
    ours = [v for k, v in record["error"].items() if k.startswith("relax_cutlass")]
    record["ok"] = bool(np.isfinite(ref32).all()) and bool(ours) and max(ours) <= 1e-2
    return record


def _child(args) -> int:
    entry = next(e for e in ZOO if e.name == args.one)
    out = Path(args.json)
    try:
        record = run_one(entry, args.torch_compile, args.arch, args.profile, tuple(args.builds.split(",")))
    except Exception as err:
        record = {"model": entry.name, "failed": f"{type(err).__name__}: {str(err)[:2000]}"}
        traceback.print_exc()
    out.write_text(json.dumps(record, indent=1, default=str))
    return 0


def _ratio(a, b) -> str:
    return f"{b / a:.2f}x" if a and b else "-"


def table(records: list[dict]) -> str:
    head = (
        "| model | offloaded | FLOPs | err vs torch fp32 | relax_cutlass ms (graph) | TVM default ms (graph) "
        "| torch eager ms | torch.compile ms | reduce-overhead ms | vs TVM | vs eager | vs reduce-overhead |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in records:
        if "failed" in r:
            lines.append(f"| {r['model']} | FAILED: {r['failed'][:160]} |" + " |" * 10)
            continue
        ms, err, rep = r["ms"], r["error"], r["report"]
        ours = min(ms.get("relax_cutlass", 0) or 1e9, ms.get("relax_cutlass_graph", 0) or 1e9)
        tvm_best = min(ms.get("tvm_default", 0) or 1e9, ms.get("tvm_default_graph", 0) or 1e9)
        lines.append(
            f"| {r['model']} b{r['batch']}{'x' + str(r['seq']) if r['seq'] else ''} "
            f"| {rep['offloaded_calls']} calls, {rep['left_in_tvm']} in TVM | {rep['flop_fraction']:.1%} "
            f"| {err.get('relax_cutlass_graph_vs_torch_fp32', err.get('relax_cutlass_vs_torch_fp32')):.1e} "
            f"| {ms.get('relax_cutlass', 0):.3f} ({ms.get('relax_cutlass_graph', 0):.3f}) "
            f"| {ms.get('tvm_default', 0):.3f} ({ms.get('tvm_default_graph', 0):.3f}) "
            f"| {ms.get('torch_eager', 0):.3f} | {ms.get('torch_compile_default', 0):.3f} "
            f"| {ms.get('torch_compile_reduce-overhead', 0):.3f} | {_ratio(ours, tvm_best if tvm_best < 1e9 else 0)} "
            f"| {_ratio(ours, ms.get('torch_eager'))} | {_ratio(ours, ms.get('torch_compile_reduce-overhead'))} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(e.name for e in ZOO))
    ap.add_argument("--out", default=os.environ.get("OUT", "build/zoo"))
    ap.add_argument("--arch", default="auto")
    ap.add_argument("--profile", default="never", help="relax_cutlass profile= option (auto tunes on this GPU)")
    ap.add_argument("--torch-compile", action="store_true", help="also time torch.compile (default, reduce-overhead)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per model")
    ap.add_argument("--builds", default=",".join(BUILDS), help="which TVM builds to make and time")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return _child(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for name in args.models.split(","):
        path = out / f"zoo-{name}.json"
        path.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--one", name, "--json", str(path), "--arch", args.arch]
        cmd += ["--profile", args.profile, "--builds", args.builds]
        cmd += ["--torch-compile"] if args.torch_compile else []
        t0 = time.time()
        print(f"=== {name}", flush=True)
        try:
            proc = subprocess.run(cmd, timeout=args.timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        if path.exists():
            record = json.loads(path.read_text())
        else:
            record = {"model": name, "failed": f"process ended without a result (exit {code})"}
        record["wall_s"] = round(time.time() - t0, 1)
        path.write_text(json.dumps(record, indent=1, default=str))
        records.append(record)
        print(f"=== {name}: {'FAILED ' + record['failed'][:300] if 'failed' in record else 'done'}", flush=True)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
