"""Publish GPU runs: results JSON under bench/results/, named by date and GPU; docs/results.md and the
README's results table generated from the latest run of each benchmark per GPU.

    python bench/publish.py                                   # regenerate docs/results.md and the README table
    python bench/publish.py gpu_results.json [--tag gpu-suite]   # a GPU suite run (bench/gpu_suite.py), then regenerate
    python bench/publish.py --zoo zoo.json --gpu nvidia-h100  # a zoo run (bench/zoo.py), then regenerate

bench/results keeps the latest run of each benchmark per GPU; earlier runs live in git history.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import date
from pathlib import Path

from relax_cutlass.toolkit.tuning import parse_label

ROOT = Path(__file__).resolve().parent.parent


def _timing(results: dict) -> str:
    """How the run timed relax_cutlass against its peers (older runs: one after the other)."""
    rounds = results.get("bench_rounds")
    return f" (relax_cutlass, cuBLAS and torch eager timed in turn, {rounds} rounds)" if rounds else ""


def table(results: dict) -> str:
    lines = [
        f"Measured on {results['device']} (kernels built for {results['arch']}; torch {results['torch']}), "
        f"fp16 in/out, fp32 accumulation; median ms{_timing(results)}. "
        "relax_cutlass uses the target's native kernels (SM90 on sm_90a; the SM80 column is the CUTLASS 2.x "
        "kernels on the same GPU). `x TVM` = TVM default "
        "build time / relax_cutlass time; `vs cuBLAS mm` = cuBLAS plain matmul (no epilogue) time / "
        "relax_cutlass time (with its fused epilogue).",
        "",
        "| case | M | K | N | relax_cutlass ms | TFLOP/s | SM80 kernels ms | TVM default ms | torch eager ms "
        "| torch.compile ms | cuBLAS matmul ms | x TVM | x eager | vs cuBLAS mm |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["bench"]:
        compile_ms = f"{r['torch_compile_ms']:.4f}" if "torch_compile_ms" in r else "-"
        sm80 = f"{r['relax_cutlass_sm80_ms']:.4f}" if "relax_cutlass_sm80_ms" in r else "-"
        lines.append(
            f"| {r['epilogue']} | {r['m']} | {r['k']} | {r['n']} | {r['relax_cutlass_ms']:.4f} "
            f"| {r['relax_cutlass_tflops']:.0f} | {sm80} | {r['tvm_default_ms']:.3f} | {r['torch_eager_ms']:.4f} "
            f"| {compile_ms} "
            f"| {r['cublas_matmul_only_ms']:.4f} | {r['speedup_vs_tvm']:.1f} | {r['speedup_vs_torch_eager']:.2f} "
            f"| {r['cublas_matmul_only_ms'] / r['relax_cutlass_ms']:.2f} |"
        )
    for r in results.get("model", []):
        if "error" in r:
            continue
        compile_ms = f"{r['torch_compile_ms']:.3f}" if "torch_compile_ms" in r else "-"
        lines.append(
            f"| BERT-large layer ({r['offloaded_regions']} regions offloaded) | 1024 | | | "
            f"{r['relax_cutlass_ms']:.3f} | | | {r['tvm_default_ms']:.3f} | {r['torch_eager_ms']:.3f} | {compile_ms} "
            f"| | {r['speedup_vs_tvm']:.1f} | {r['speedup_vs_torch_eager']:.2f} | |"
        )
    tests = results.get("tests", [])
    if not tests:  # correctness checked by another run: say so, never "0/0"
        return "\n".join([*lines, "", results.get("checks_note", "No correctness checks in this run.")])

    def worst(key, dtypes):
        return max((t.get(key, 0) for t in tests if t.get("dtype") in dtypes), default=0)

    lines += [
        "",
        f"Correctness in the same run: {sum(t['ok'] for t in tests)}/{len(tests)} checks passed. Max relative "
        f"error of fp16/fp32-output cases: {worst('err_vs_tvm', ('float16', 'float32')):.1e} vs TVM's own build, "
        f"{worst('err_vs_f64', ('float16', 'float32')):.1e} vs float64; bf16 cases: "
        f"{worst('err_vs_f64', ('bfloat16',)):.1e} vs float64 ({worst('err_vs_tvm', ('bfloat16',)):.1e} vs TVM, "
        "whose default build accumulates bf16 matmuls in bf16).",
    ]
    return "\n".join(lines)


def conv_table(results: dict) -> str:
    conv, resnet = results.get("conv_bench", []), [r for r in results.get("resnet", []) if "error" not in r]
    lines = [
        f"Measured on {results['device']} (kernels built for {results['arch']}; torch {results['torch']}), fp16, "
        "fp32 accumulation, median ms. ResNet-50 3x3 stages, conv + bias + relu, NHWC; cuDNN = torch "
        "`F.conv2d` (+ relu) on channels_last tensors with `cudnn.benchmark` on. relax_cutlass runs SM80 "
        "implicit-GEMM kernels (no CUTLASS 3.x conv yet).",
        "",
        "| batch | H=W | C=K | relax_cutlass ms | TFLOP/s | TVM default ms | cuDNN ms | torch.compile ms "
        "| x TVM | x cuDNN | kernel | split-K |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in conv:
        if "error" in r:
            lines.append(f"| {r['name']} | | | error: {r['error'][:80]} |")
            continue
        compile_ms = f"{r['torch_compile_ms']:.4f}" if "torch_compile_ms" in r else "-"
        tile = r["kernel"].split("_optimized_")[-1].rsplit("_bias", 1)[0]
        lines.append(
            f"| {r['batch']} | {r['hw']} | {r['c']} | {r['relax_cutlass_ms']:.4f} | {r['relax_cutlass_tflops']:.0f} "
            f"| {r['tvm_default_ms']:.4f} | {r['torch_eager_ms']:.4f} | {compile_ms} | {r['speedup_vs_tvm']:.1f} "
            f"| {r['speedup_vs_torch_eager']:.2f} | {tile} | {r['split_k']} |"
        )
    if resnet:
        lines += [
            "",
            "Whole ResNet-50 (written in PyTorch, `torch.export` + `from_exported_program`, batch norm folded, "
            "NHWC, fp16, 224x224). relax_cutlass and TVM's default build run the same graph with the same weights "
            "(regenerated by name on the GPU host); torch eager and torch.compile run the same architecture in fp16 "
            "channels_last (batch norm unfused).",
            "",
            "| batch | relax_cutlass ms | TVM default ms | torch eager ms | torch.compile ms | x TVM | x eager "
            "| convs offloaded | with fused residual | with split-K | err vs TVM |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in resnet:
            compile_ms = f"{r['torch_compile_ms']:.3f}" if "torch_compile_ms" in r else "-"
            lines.append(
                f"| {r['batch']} | {r['relax_cutlass_ms']:.3f} | {r['tvm_default_ms']:.3f} | {r['torch_eager_ms']:.3f} "
                f"| {compile_ms} | {r['speedup_vs_tvm']:.1f} | {r['speedup_vs_torch_eager']:.2f} "
                f"| {r['offloaded_convs']} of 53 | {r['convs_with_fused_residual']} | {r['convs_with_split_k']} "
                f"| {r['err_vs_tvm']:.1e} |"
            )
    checks = results.get("conv", [])
    if checks:
        lines += [
            "",
            f"conv2d correctness (same artifacts): {sum(t['ok'] for t in checks)}/{len(checks)} checks passed; max "
            f"relative error {max(t.get('err_vs_tvm', 0) for t in checks):.1e} vs TVM's own build, "
            f"{max(t.get('err_vs_f64', 0) for t in checks):.1e} vs float64.",
        ]
    return "\n".join(lines)


def _label(record: dict) -> str:
    return record["tile"] + (f"_splitk{record['split_k']}" if record.get("split_k", 1) > 1 else "")


def _shape(key: dict) -> str:
    return "x".join(map(str, key["shape"]))


def tuning_table(records: list[dict]) -> str:
    """Stage 2 (with epilogues) then stage 1 (main loops): per problem, the heuristic's kernel and
    the fastest correct candidate of the same run."""
    main_loops = [r for r in records if not r["key"].get("epilogue")]
    fused = [r for r in records if r["key"].get("epilogue")]
    stage1 = {json.dumps({**r["key"], "epilogue": ""}, sort_keys=True): r for r in main_loops}
    lines = []
    if fused:
        lines += [
            "**Stage 2: kernels with their epilogues.** Per (problem, epilogue) of the tuned models, the "
            "heuristic's kernel and stage 1's fastest main loops, each instantiated with the region's epilogue, "
            "checked and timed in one run (median of 7). A build takes the fastest unless the heuristic's kernel "
            "is within 3% of it (`select.TIE_MARGIN`; ties then keep the heuristic's, or an unsplit kernel), so "
            "the kernel built is within 3% of the fastest candidate of the run. `heuristic / fastest`: what "
            "tuning can save over the heuristic; `stage 1 / fastest`: what timing the epilogue saves over "
            "choosing by main loop alone.",
            "",
            "| op | shape | epilogue | heuristic | heuristic us | stage 1's pick | its us | fastest | fastest us "
            "| heuristic / fastest | stage 1 / fastest |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in fused:
            key, cands = r["key"], r["candidates"]
            heuristic = r.get("heuristic") or next(iter(cands))
            h_ms = cands.get(heuristic)
            first = stage1.get(json.dumps({**key, "epilogue": ""}, sort_keys=True))
            pick = _label(first) if first else None
            p_ms = cands.get(pick) if pick else None
            unsplit = parse_label(pick)[0] if pick else None
            if pick and p_ms is None and unsplit in cands:
                pick = unsplit  # with a residual, stage 2 times the tile unsplit
                p_ms = cands.get(pick)
            lines.append(
                f"| {key['op']} | {_shape(key)} | {key['epilogue']} | {heuristic} | {_us(h_ms)} | {pick or '-'} "
                f"| {_us(p_ms)} | {_label(r)} | {r['ms'] * 1e3:.1f} | {_ratio(h_ms, r['ms'])} "
                f"| {_ratio(p_ms, r['ms'])} |"
            )
        lines.append("")
    lines += [
        "**Stage 1: main loops.** Profiled without epilogue (`python -m relax_cutlass tune run`), median of 7; "
        "`heuristic / fastest` is what the measured main-loop choice saves.",
        "",
        "| op | shape | layout | candidates ok | heuristic | heuristic us | fastest | fastest us "
        "| heuristic / fastest |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in main_loops:
        key, cands = r["key"], r["candidates"]
        ok = {label: ms for label, ms in cands.items() if ms is not None}
        heuristic = r.get("heuristic") or next(iter(cands))
        h_ms = cands.get(heuristic)
        lines.append(
            f"| {key['op']} | {_shape(key)} | {key['layout']} | {len(ok)}/{len(cands)} "
            f"| {heuristic} | {_us(h_ms)} | {_label(r)} | {r['ms'] * 1e3:.1f} | {_ratio(h_ms, r['ms'])} |"
        )
    return "\n".join(lines)


def _us(ms) -> str:
    return f"{ms * 1e3:.1f}" if ms else "-"


def _ratio(ms, best) -> str:
    return f"{ms / best:.2f}" if ms else "-"


def tuned_e2e_table(results: dict) -> str:
    """Whole builds with the database's kernels against the heuristic's, timed in alternation."""
    rows = [r for key in ("bench", "conv_bench", "model", "resnet") for r in results.get(key, [])
            if "tuned_vs_heuristic" in r]  # fmt: skip
    if not rows:
        return ""
    lines = [
        "**End to end: tuned builds against the heuristic's**, same run, the two builds timed in alternation "
        "(heuristic, tuned, three times; medians). `kernels`: whether tuning changed any kernel (a conv's "
        "split-K count is a run-time argument and does not show there). Where tuning kept the heuristic's "
        "kernels, the ratio is this harness's noise.",
        "",
        "| case | heuristic ms | tuned ms | tuned speedup | kernels |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        same = "same" if r.get("tuned_same_kernels") else "changed"
        lines.append(
            f"| {r['name']} | {r['relax_cutlass_heuristic_alternating_ms']:.4f} | {r['relax_cutlass_tuned_ms']:.4f} "
            f"| {r['tuned_vs_heuristic']:.2f} | {same} |"
        )
    return "\n".join(lines)


def bert_table(results: dict) -> str:
    rows = results["bert"]
    lines = [
        f"Measured on {results['device']} (kernels built for {results['arch']}; torch {results['torch']}). The "
        "Hugging Face `transformers` BERT-large encoder (24 layers, hidden 1024, FFN 4096, random init) exported "
        "with `torch.export`, imported with `from_exported_program`, weights bound and folded, fp16 "
        "(`ToMixedPrecision`). relax_cutlass and TVM's default build run the same graph with the same weights "
        "(regenerated by name on the GPU host); torch eager and torch.compile run transformers' BertEncoder "
        "(plain torch, same computation, default sdpa attention) in fp16. Median ms. `CUDA graph` columns: "
        "the same modules compiled with TVM's CUDA-graph rewrite (`relax.backend.use_cuda_graph`), relax_cutlass's "
        "and TVM's; `x TVM (graph)` = TVM default / relax_cutlass with CUDA graph.",
        "",
        "| batch x seq | relax_cutlass ms | CUDA graph ms | TFLOP/s | TVM default ms | TVM CUDA graph ms "
        "| torch eager ms | torch.compile ms | x TVM | x TVM (graph) | x eager | x compile | regions offloaded "
        "| FLOPs offloaded | err vs TVM |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error'][:100]} |")
            continue
        compile_ms = f"{r['torch_compile_ms']:.3f}" if "torch_compile_ms" in r else "-"
        x_compile = f"{r['speedup_vs_torch_compile']:.2f}" if "speedup_vs_torch_compile" in r else "-"
        graph = f"{r['relax_cutlass_graph_ms']:.3f}" if "relax_cutlass_graph_ms" in r else "-"
        tvm_graph = f"{r['tvm_graph_ms']:.3f}" if "tvm_graph_ms" in r else "-"
        x_graph = f"{r['speedup_graph_vs_tvm']:.1f}" if "speedup_graph_vs_tvm" in r else "-"
        lines.append(
            f"| {r['batch']} x {r['seq']} | {r['relax_cutlass_ms']:.3f} | {graph} | {r['relax_cutlass_tflops']:.0f} "
            f"| {r['tvm_default_ms']:.3f} | {tvm_graph} | {r['torch_eager_ms']:.3f} | {compile_ms} "
            f"| {r['speedup_vs_tvm']:.2f} | {x_graph} | {r['speedup_vs_torch_eager']:.2f} | {x_compile} "
            f"| {r['offloaded_regions']} | {100 * r['offloaded_flop_fraction']:.1f}% | {r['err_vs_tvm']:.1e} |"
        )
    return "\n".join(lines)


def attention_table(results: dict) -> str:
    """The fused attention kernel against its peers, and the attention correctness cases."""
    lines = [
        f"Measured on {results['device']} (kernels built for {results['arch']}; torch {results['torch']}). One "
        "attention block as torch.export writes BERT's (q/k/v split into heads by reshape + permute, fp16 scale, "
        "fp32 softmax); relax_cutlass offloads all of it as one fused kernel; TVM's default build runs the same "
        "graph; torch eager runs the same math (cuBLAS batched matmuls + softmax), torch sdpa "
        "`F.scaled_dot_product_attention` (flash attention). Median ms.",
        "",
        "| case | kernel | relax_cutlass ms | TVM default ms | torch eager ms | torch sdpa ms | x TVM | x eager "
        "| x sdpa |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.get("attention_bench", []):
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error'][:100]} |")
            continue
        lines.append(
            f"| {r['name']} | {r['kernel']} | {r['relax_cutlass_ms']:.4f} | {r['tvm_ms']:.4f} "
            f"| {r['torch_eager_ms']:.4f} | {r['torch_sdpa_ms']:.4f} | {r['vs_tvm']:.1f} | {r['vs_torch_eager']:.1f} "
            f"| {r['vs_torch_sdpa']:.2f} |"
        )
    checks = results.get("attention", [])
    if checks:
        ok = sum(c["ok"] for c in checks)
        worst = max((c.get("err_vs_f64", 0) for c in checks), default=0)
        cases = sorted({c["case"] for c in checks})
        lines += [
            "",
            f"Correctness in the same run: {ok}/{len(checks)} checks of {len(cases)} attention cases passed "
            f"({', '.join(c.removeprefix('attention_') for c in cases)}); max relative error vs float64 "
            f"{worst:.1e}.",
        ]
    return "\n".join(lines)


def bert_plot(results: dict, path: Path) -> bool:
    """Milliseconds per BERT-large forward, by framework and batch."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in results["bert"] if "error" not in r]
    if not rows:
        return False
    series = {
        "relax_cutlass": "relax_cutlass_ms",
        "relax_cutlass + CUDA graph": "relax_cutlass_graph_ms",
        "TVM default": "tvm_default_ms",
        "torch eager": "torch_eager_ms",
        "torch.compile": "torch_compile_ms",
    }
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series.items()):
        xs = [j + i * width for j, r in enumerate(rows) if key in r]
        ax.bar(xs, [r[key] for r in rows if key in r], width, label=label)
    labels = [f"batch {r['batch']} x seq {r['seq']}" for r in rows]
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels)
    ax.set_yscale("log")
    ax.set_ylabel("ms per forward (log scale)")
    ax.set_title(f"BERT-large encoder, fp16, {results['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def replace_section(text: str, name: str, content: str) -> str:
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    if start not in text:
        raise SystemExit(f"README.md has no {start} ... {end} section")
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1] if end in rest else ""
    return f"{head}{start}\n{content}\n{end}{tail}"


def plot(results: dict, path: Path) -> bool:
    """TFLOP/s by shape: relax_cutlass (SM90 and SM80 kernels, fused epilogue) vs cuBLAS plain matmul
    and torch eager (matmul + separate epilogue). Needs matplotlib (the `bench` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = results["bench"]
    labels = [f"{r['epilogue']} {r['m']}x{r['k']}x{r['n']}" for r in rows]
    series = {
        "relax_cutlass (fused)": [r["relax_cutlass_ms"] for r in rows],
        "relax_cutlass SM80 kernels": [r.get("relax_cutlass_sm80_ms") for r in rows],
        "cuBLAS matmul only": [r["cublas_matmul_only_ms"] for r in rows],
        "torch eager (linear + epilogue)": [r["torch_eager_ms"] for r in rows],
        "TVM default": [r["tvm_default_ms"] for r in rows],
    }
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 0.9), 5))
    width = 0.8 / len(series)
    colors = ["#1f77b4", "#9ecae1", "#2ca02c", "#d62728", "#9467bd"]
    for i, (name, times) in enumerate(series.items()):
        xs = [j + i * width for j, t in enumerate(times) if t]
        ys = [r["flops"] / t / 1e9 for r, t in zip(rows, times, strict=True) if t]
        ax.bar(xs, ys, width, label=name, color=colors[i])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels, fontsize=7, rotation=35, ha="right")
    ax.set_ylabel("TFLOP/s (GEMM flops / time)")
    ax.set_title(f"dense + epilogue, fp16, {results['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


RESULTS = ROOT / "bench" / "results"
ZOO_FILE = r"\d{4}-\d{2}-\d{2}-zoo-nvidia-h\d00\.json"  # one per date and GPU: each model's latest record
GPU_NAMES = {"nvidia-h100": "NVIDIA H100", "nvidia-h200": "NVIDIA H200", "cpu": "CPU"}
ZOO_NOTE = (
    "`bench/zoo.py`: stock torchvision / transformers models (random init, no download), imported with "
    "`from_torch`, each built and timed in its own process; fp16 (bfloat16 where the row says so); median ms; "
    "relax_cutlass and TVM's default build also with TVM's CUDA-graph build (in parentheses). Errors are "
    "relative L2 against torch float64 on the GPU, torch's own 16-bit error beside it (a row passes at "
    "max(1e-2, 1.5x torch's)). `vs reduce-overhead` is torch.compile(mode='reduce-overhead') (CUDA graphs), "
    "torch's best here, over our best."
)


def gpu_of(path: Path) -> str:
    """The GPU a result file was measured on, from its name (`...-nvidia-h100.json`), or "cpu" / ""."""
    found = re.search(r"(nvidia-h\d00|cpu)(-[a-z]+)?\.(json|jsonl|png)$", path.name)
    return found.group(1) if found else ""


def _latest(paths: list[Path]) -> list[Path]:
    return sorted(paths, key=lambda p: p.name)


def zoo_runs() -> dict[str, list[tuple[str, list[dict]]]]:
    """{gpu: [(date, records)]}, newest first: the zoo files (one per date and GPU, the latest record of
    each model)."""
    runs: dict[str, list] = {}
    for path in _latest([p for p in RESULTS.glob("*-zoo-nvidia-*.json") if re.fullmatch(ZOO_FILE, p.name)]):
        records = json.loads(path.read_text())
        if isinstance(records, list):
            runs.setdefault(gpu_of(path), []).insert(0, (path.name[:10], records))
    return runs


def _best_ms(ms: dict) -> float | None:
    ours = [ms.get(k) for k in ("relax_cutlass", "relax_cutlass_graph") if ms.get(k)]
    return min(ours) if ours else None


def summary_table(days: int = 1) -> str:
    """The README's table: each zoo model's latest run per GPU against torch's best, where that run is
    at most `days` older than the GPU's newest (older ones measured an older relax_cutlass: they stay
    in docs/results.md, dated)."""
    from datetime import timedelta

    lines = [
        "| model | GPU (date) | relax_cutlass ms | torch.compile reduce-overhead ms | vs torch's best "
        "| error vs fp64 |",
        "|---|---|---|---|---|---|",
    ]
    for gpu, runs in sorted(zoo_runs().items()):
        seen: set[str] = set()
        newest = date.fromisoformat(runs[0][0])
        for day, records in runs:
            if date.fromisoformat(day) < newest - timedelta(days=days):
                continue
            for r in sorted(records, key=lambda r: r["model"]):
                best, torch_best = _best_ms(r.get("ms", {})), r.get("ms", {}).get("torch_compile_reduce-overhead")
                if r["model"] in seen or not best or not torch_best:
                    continue
                seen.add(r["model"])
                errors = [v for k, v in r["error"].items() if k.startswith("relax_cutlass")]
                ok = "ok" if r.get("ok") else "NOT OK"
                shape = f"b{r['batch']}" + (f"x{r['seq']}" if r.get("seq") else "")
                lines.append(
                    f"| {r['model']} {shape} | {GPU_NAMES.get(gpu, gpu)} ({day}) | {best:.3f} | {torch_best:.3f} "
                    f"| {torch_best / best:.2f}x | {max(errors, default=float('nan')):.1e} ({ok}) |"
                )
    return "\n".join(lines)


def _zoo_section() -> list[str]:
    from relax_cutlass.testing import zoo

    out = ["## The model zoo", "", ZOO_NOTE, ""]
    for gpu, runs in sorted(zoo_runs().items()):
        for day, records in runs:
            out += [f"### {GPU_NAMES.get(gpu, gpu)}, {day}", "", zoo.table(records), ""]
    return out


def _memcheck_section() -> list[str]:
    """The latest memcheck run per GPU."""
    latest_per_gpu = {gpu_of(p): p for p in _latest(list(RESULTS.glob("*-memcheck-zoo-*.json")))}
    out = ["## Memory checks", ""] if latest_per_gpu else []
    for gpu, path in sorted(latest_per_gpu.items()):
        data = json.loads(path.read_text())
        out += [f"### {GPU_NAMES.get(gpu, gpu)}, {data['date']}", "", data["what"][:1].upper() + data["what"][1:], ""]
        out += ["| model | memcheck errors | output finite |", "|---|---|---|"]
        out += [f"| {r['model']} | {r.get('errors')} | {r.get('output_finite')} |" for r in data["memcheck"]]
        out += ["", f"Raw results: `{path.relative_to(ROOT)}`.", ""]
    return out


def _tuning_tables(results: dict) -> str:
    """The tuned end-to-end table (where the run has one) and the tuning records' table."""
    e2e = tuned_e2e_table(results)
    return f"{e2e}\n\n{tuning_table(results['tuning'])}" if e2e else tuning_table(results["tuning"])


# (section title, results key, table function) of a GPU suite run (bench/gpu_suite.py)
SUITE_TABLES = (
    ("GEMM + epilogue", "bench", table),
    ("conv2d and ResNet-50", "conv_bench", conv_table),
    ("Fused attention", "attention_bench", attention_table),
    ("BERT-large end to end", "bert", bert_table),
    ("Tuning", "tuning", _tuning_tables),
)


def _suite_run(runs: dict[Path, dict], key: str) -> list[tuple[Path, dict]]:
    """The suite run a section's table comes from: the newest run published for that section (its
    name holds the section's word: `-gpu-suite-bert-`), else the newest run that has it."""
    word = key.split("_")[0]
    having = [(path, results) for path, results in runs.items() if results.get(key)]
    named = [(path, results) for path, results in having if f"-{word}-" in path.name or f"-{word}." in path.name]
    return (named or having)[-1:]


def _suite_section() -> list[str]:
    out = ["## GPU suite", ""]
    for gpu in sorted({gpu_of(p) for p in RESULTS.glob("*-gpu-suite*.json")}):
        paths = _latest([p for p in RESULTS.glob("*-gpu-suite*.json") if gpu_of(p) == gpu])
        runs = {path: json.loads(path.read_text()) for path in paths}  # oldest first
        for title, key, render in SUITE_TABLES:
            for path, results in _suite_run(runs, key):
                figure = path.with_suffix(".png")
                picture = f"\nPlot: `{figure.relative_to(ROOT)}`.\n" if key == "bench" and figure.exists() else ""
                out += [f"### {title} ({GPU_NAMES.get(gpu, gpu)}, {path.name[:10]})", "", render(results), picture]
                out += [f"Raw results: `{path.relative_to(ROOT)}`.", ""]
    return out


def _build_section() -> list[str]:
    import build_times  # bench/build_times.py, beside this script

    out = []
    for path in _latest(list(RESULTS.glob("*-build-times.json")))[-1:]:
        out += ["## Build times", "", build_times.table(json.loads(path.read_text()), path), ""]
    return out


def _other_section(listed: set[str]) -> list[str]:
    rest = [p for p in _latest(list(RESULTS.iterdir())) if p.name not in listed]
    out = ["## Other measurements", "", "The latest run of each other benchmark (each file says how it was made).", ""]
    out += ["| date | GPU | file |", "|---|---|---|"]
    out += [f"| {p.name[:10]} | {GPU_NAMES.get(gpu_of(p), '-')} | `{p.relative_to(ROOT)}` |" for p in rest]
    return out + [""]


def render() -> None:
    """docs/results.md from bench/results, and the README's RESULTS table."""
    text = [
        "# Results",
        "",
        "Generated by `python bench/publish.py` from `bench/results/`: the latest run of each benchmark per GPU "
        "(earlier runs are in git history). Do not edit by hand.",
        "",
    ]
    text += _zoo_section() + _memcheck_section() + _suite_section() + _build_section()
    listed = {m for m in re.findall(r"bench/results/([^`)\s]+)", "\n".join(text))}
    listed |= {p.name for p in RESULTS.iterdir() if re.fullmatch(ZOO_FILE, p.name) or p.suffix == ".png"}
    text += _other_section(listed)
    (ROOT / "docs" / "results.md").write_text("\n".join(text).rstrip() + "\n")
    readme = ROOT / "README.md"
    readme.write_text(replace_section(readme.read_text(), "RESULTS", summary_table()))


def _gpu_slug(device: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100'."""
    return "-".join(re.sub(r"[^a-z0-9 ]+", " ", device.lower()).split()[:2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", help="a GPU suite run's gpu_results.json to publish first")
    ap.add_argument("--tag", default="gpu-suite", help="the suite run's name in its file name")
    ap.add_argument("--zoo", type=Path, help="a zoo run's zoo.json to publish first")
    ap.add_argument("--gpu", help="the zoo run's GPU as results name it, e.g. nvidia-h100")
    args = ap.parse_args()
    if args.results:
        results = json.loads(Path(args.results).read_text())
        out = RESULTS / f"{date.today()}-{args.tag}-{_gpu_slug(results['device'])}.json"
        out.write_text(json.dumps(results, indent=1))
        if results.get("bench"):
            plot(results, out.with_suffix(".png"))
        print(f"wrote {out}")
    if args.zoo:
        if not args.gpu:
            ap.error("--zoo needs --gpu (e.g. nvidia-h100)")
        out = RESULTS / f"{date.today()}-zoo-{args.gpu}.json"
        records = {r["model"]: r for r in json.loads(out.read_text())} if out.exists() else {}
        records |= {r["model"]: r for r in json.loads(args.zoo.read_text())}
        out.write_text(json.dumps(sorted(records.values(), key=lambda r: r["model"]), indent=1))
        print(f"wrote {out}")
    render()
    print("wrote docs/results.md and the README's results table")


if __name__ == "__main__":
    main()
