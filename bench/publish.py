"""Publish a GPU run: copy its results JSON under bench/results/ and rewrite the README table.

python bench/publish.py /work/.device/N/gpu_results.json [--tag foundation]
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- BENCH-TABLE -->"


def table(results: dict) -> str:
    lines = [
        f"Measured on {results['device']} (kernels built for {results['arch']}; torch {results['torch']}), "
        "fp16 in/out, fp32 accumulation; median ms. relax_cutlass uses the target's native kernels (SM90 "
        "on sm_90a; the SM80 column is the CUTLASS 2.x kernels on the same GPU). `x TVM` = TVM default "
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
    tests = results["tests"]

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--tag", default="foundation")
    args = ap.parse_args()
    results = json.loads(Path(args.results).read_text())
    device = re.sub(r"[^a-z0-9]+", "-", results["device"].lower()).strip("-")
    out = ROOT / "bench" / "results" / f"{date.today()}-{args.tag}-{device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    readme = ROOT / "README.md"
    text = readme.read_text()
    head = text.split(MARK)[0]
    png = out.with_suffix(".png")
    figure = f"\n![TFLOP/s by shape]({png.relative_to(ROOT)})\n" if plot(results, png) else ""
    readme.write_text(f"{head}{MARK}\n{table(results)}\n{figure}\nRaw results: `{out.relative_to(ROOT)}`.\n")
    print(f"wrote {out} and the README table")


if __name__ == "__main__":
    main()
