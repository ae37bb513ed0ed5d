"""The GPU suite's benchmarks on a GPU host with the whole TVM (../shared/gpu/make-full-bundle): each
case built in-process (relax_cutlass's build and TVM's own, relax_cutlass/testing/gpu_build.py), then timed against
TVM's default build, torch eager (cuBLAS / cuDNN) and torch.compile; a table is printed and
OUT/gpu_results.json written (bench/publish.py turns it into docs/results.md's tables).

    python3 bench/gpu_suite.py --out build/gpu-bench [--only bench ...] [--match REGEX] [--rounds N]
        [--tuning-db tuning.jsonl] [--phase all|build|run|prewarm] [--no-compile]

Sections (`--only`, default: every benchmark section but the sweep): bench (dense + epilogue vs
cuBLAS), conv_bench (ResNet-50 stages vs cuDNN), attention_bench (BERT-large's fused attention vs
sdpa), sweep (SM90 tiles), model (one BERT-large layer), resnet, bert (BERT-large end to end). The
correctness sections (tests, conv, graphs, frontends, attention) are tests/test_gpu_suite.py's
(`--phase prewarm` compiles their kernels into the object cache ahead of it).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECKED = ("tests", "conv", "graphs", "frontends", "attention")  # correctness sections (check_case)
BENCHMARKS = ("bench", "conv_bench", "attention_bench", "sweep", "model", "resnet", "bert")
SECTIONS = CHECKED + BENCHMARKS
DEFAULT = tuple(s for s in BENCHMARKS if s != "sweep")


def select_cases(only: set[str], tuning_db: str = "", match: str = "") -> list:
    """The SuiteCases of the `only` sections whose name matches `match` (attention_bench: the
    attention section's benchmark cases)."""
    from relax_cutlass.testing.gpu_cases import correctness_cases
    from relax_cutlass.testing.suite_cases import benchmark_cases

    cases = [
        c for c in correctness_cases(tuning_db)
        if c.section in only or ("attention_bench" in only and c.spec and c.spec.get("bench"))
    ]  # fmt: skip
    return [c for c in cases + benchmark_cases(only, tuning_db) if re.search(match, c.name)]


def build_sections(only: set[str], arch: str, out: Path, tuning_db: str = "", match: str = "") -> dict:
    """Build every selected case into `out`, kernels compiled up front on all cores: -> {section:
    [manifest entries]} (attention_bench's entries are kept under "attention")."""
    from relax_cutlass.testing.gpu_build import prewarm

    cases = select_cases(only, tuning_db, match)
    out.mkdir(parents=True, exist_ok=True)
    prewarm(cases, arch, tuning_db)
    empty = {section: [] for section in SECTIONS if section != "attention_bench"}
    return empty | _build_all(cases, arch, out, tuning_db)


def _build_all(cases, arch: str, out: Path, tuning_db: str) -> dict[str, list[dict]]:
    from relax_cutlass.testing.gpu_build import build_case
    from relax_cutlass.testing.suite_cases import offloaded_flops

    manifest: dict[str, list[dict]] = {}
    for case in cases:
        entry = build_case(case, out, arch, tuning_db)
        if case.section == "bert":
            entry["offloaded_flops"] = offloaded_flops(entry)
        manifest.setdefault(case.section, []).append(entry)
    return manifest


# (header, key, format) of the summary table printed last.
COLUMNS = [
    ("case", "name", "36s"),
    ("cutlass ms", "relax_cutlass_ms", "10.4f"),
    ("tuned ms", "relax_cutlass_tuned_ms", "9.4f"),
    ("tuned x", "tuned_vs_heuristic", "7.2f"),
    ("TFLOP/s", "relax_cutlass_tflops", "8.1f"),
    ("sm80 ms", "relax_cutlass_sm80_ms", "8.4f"),
    ("tvm ms", "tvm_default_ms", "8.3f"),
    ("graph ms", "relax_cutlass_graph_ms", "8.4f"),
    ("eager ms", "torch_eager_ms", "8.4f"),
    ("compile ms", "torch_compile_ms", "10.4f"),
    ("cublas mm", "cublas_matmul_only_ms", "9.4f"),
    ("x tvm", "speedup_vs_tvm", "6.1f"),
    ("x eager", "speedup_vs_torch_eager", "7.2f"),
    ("x cublas", "vs_cublas_matmul", "8.2f"),
]


def print_summary(results: dict) -> None:
    tests = results["tests"] + [r for key in CHECKED if key != "tests" for r in results.get(key, [])]
    print(f"\n{results['device']}  arch {results['arch']}  torch {results['torch']}")
    print(
        f"correctness: {sum(r['ok'] for r in tests)}/{len(tests)} checks ok, "
        f"max err vs TVM {max((r.get('err_vs_tvm', math.inf) for r in tests), default=0):.2e}, "
        f"max err vs f64 {max((r.get('err_vs_f64', 0) for r in tests), default=0):.2e}"
    )
    print(" ".join(f"{h:>{f.split('.')[0].rstrip('sf')}}" for h, _, f in COLUMNS))
    rows = results["bench"] + results.get("conv_bench", [])
    rows += [r for key in ("model", "resnet", "bert") for r in results.get(key, []) if "error" not in r]
    for row in rows:
        cells = []
        for _, key, fmt in COLUMNS:
            value = row.get(key)
            width = fmt.split(".")[0].rstrip("sf")
            cells.append(format(value, fmt) if value is not None else f"{'-':>{width}}")
        print(" ".join(cells))


def _guarded(results: dict, key: str, case: dict, fn, *args) -> None:
    """Run one case, recording an error row instead of stopping the suite."""
    try:
        out = fn(case, *args)
        results[key] += out if isinstance(out, list) else [out]
    except Exception as e:  # report every case, never stop at the first failure
        results[key].append(
            {"case": case["name"], "name": case["name"], "ok": False, "error": f"{type(e).__name__}: {e}"}
        )


def run_sections(
    manifest: dict, build: Path, out: Path, only: set[str], use_compile: bool = True, rounds: int = 3
) -> int:
    """Check and time the built cases of the `only` sections (a failed case is a row, never the end
    of the run), write out/gpu_results.json as it goes and print the summary: -> failed rows."""
    import suite_timing
    import torch
    from suite_models import bert_case, model_case, resnet_case
    from suite_timing import attention_bench_case, bench_case, bench_conv_case, sweep, warm_up_gpu

    from relax_cutlass.testing.gpu_checks import (
        check_back_to_back,
        check_case,
        check_conv_glue_errors,
        check_gelu_every_fp16,
        check_glue_errors,
    )

    suite_timing.BENCH_ROUNDS[0] = rounds
    # torch peers get cuDNN's autotuner (what a user timing a conv net turns on): the strongest baseline.
    torch.backends.cudnn.benchmark = True
    results = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "arch": manifest["arch"],
        "bench_rounds": rounds,
    } | {key: [] for key in SECTIONS}
    if not set(CHECKED) & only:  # bench/publish.py says where the correctness checks ran instead
        results["checks_note"] = "Correctness: tests/test_gpu_suite.py (pytest -m gpu) on the same GPU host."
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)

    def save():  # partial results survive a timeout
        (out / "gpu_results.json").write_text(json.dumps(results, indent=1))

    for key in CHECKED:
        for case in manifest.get(key, []) if key in only else []:
            _guarded(results, key, case, check_case, build)
            ok = all(r["ok"] for r in results[key] if r["case"] == case["name"])
            print(f"{key} {case['name']}: {'ok' if ok else 'FAIL'}", flush=True)
    if "conv" in only and manifest.get("conv"):
        results["conv_glue"] = check_conv_glue_errors(manifest, build)
        print(f"conv glue argument checks: {'ok' if all(r['ok'] for r in results['conv_glue']) else 'FAIL'}")
    if "graphs" in only or "frontends" in only:
        results["back_to_back"] = check_back_to_back(manifest, build)
        for row in results["back_to_back"]:
            print(f"back to back {row['case']} {row['dims']}: {'ok' if row['ok'] else 'FAIL'}", flush=True)
    if "tests" in only:
        results["glue"] = check_glue_errors(manifest, build)
        print(f"glue argument checks: {'ok' if all(r['ok'] for r in results['glue']) else 'FAIL'}", flush=True)
        results["gelu16"] = check_gelu_every_fp16(manifest, build)
        for row in results["gelu16"]:
            print(f"{row['check']}: max {row['max_ulps']} ulp, {row['differing']}/{row['inputs']} differ", flush=True)
    save()
    warm_up_gpu()
    for key, fn in (("bench", bench_case), ("conv_bench", bench_conv_case)):
        for case in manifest.get(key, []) if key in only else []:
            _guarded(results, key, case, fn, build, use_compile)
            save()
            print(f"{key} {case['name']} done ({time.time() - t0:.0f}s)", flush=True)
    for case in manifest.get("attention", []) if {"attention", "attention_bench"} & only else []:
        if case["spec"].get("bench"):
            _guarded(results, "attention_bench", case, attention_bench_case, build, use_compile)
            save()
            row = results["attention_bench"][-1]
            if "error" not in row:
                print(
                    f"attention {case['name']}: relax_cutlass {row['relax_cutlass_ms']:.4f} ms, "
                    f"TVM {row['tvm_ms']:.4f}, "
                    f"torch eager {row['torch_eager_ms']:.4f}, torch sdpa {row['torch_sdpa_ms']:.4f}",
                    flush=True,
                )
    if manifest.get("sweep") and "sweep" in only:
        results["sweep"] = sweep(manifest, build)
        save()
        for key in sorted({(r["k"], r["n"], r["m"]) for r in results["sweep"]}):
            rows = sorted((r for r in results["sweep"] if (r["k"], r["n"], r["m"]) == key), key=lambda r: r["ms"])
            print(
                f"sweep k={key[0]} n={key[1]} m={key[2]}: "
                + ", ".join(f"{r['tile']} {r['tflops']:.0f}" for r in rows[:4])
            )
    for key, fn in (("model", model_case), ("resnet", resnet_case), ("bert", bert_case)):
        for case in manifest.get(key, []) if key in only else []:
            _guarded(results, key, case, fn, build, use_compile)
            save()
            print(f"{key} {case['name']} done ({time.time() - t0:.0f}s)", flush=True)
    save()

    tuning = out / "tuning.jsonl"  # a tuning run's records, where one wrote them beside the suite
    if tuning.exists():
        results["tuning"] = [json.loads(line) for line in tuning.read_text().splitlines() if line.strip()]
        save()
    failed = [r for key in SECTIONS if key != "sweep" for r in results[key] if not r.get("ok", True)]
    checks = ("glue", "conv_glue", "gelu16", "back_to_back")
    failed += [r for key in checks for r in results.get(key, []) if not r["ok"]]
    for r in failed:
        print("FAILED:", json.dumps(r))
    print_summary(results)
    print("PASS" if not failed else f"FAIL ({len(failed)} failed)")
    return len(failed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-bench")
    ap.add_argument("--arch", default="", help="target arch (default: this machine's GPU)")
    ap.add_argument("--only", choices=SECTIONS, action="append", help="run only these sections")
    ap.add_argument("--match", default="", help="only the cases whose name matches this regex")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per benchmark case")
    ap.add_argument("--tuning-db", default="", help="also build each case with this tuning database's kernels")
    ap.add_argument(
        "--phase", choices=("all", "build", "run", "prewarm"), default="all",
        help="prewarm: only compile the sections' kernels into the object cache (RELAX_CUTLASS_CACHE_DIR)",
    )  # fmt: skip
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile peers")
    args = ap.parse_args()
    only, build = set(args.only or DEFAULT), args.out / "build"
    if args.phase in ("all", "build", "prewarm"):
        from relax_cutlass.testing.gpu_build import local_arch, prewarm

        arch = args.arch or local_arch()
        if args.phase == "prewarm":
            prewarm(select_cases(only, args.tuning_db, args.match), arch, args.tuning_db)
            return 0
        manifest = {"arch": arch} | build_sections(only, arch, build, args.tuning_db, args.match)
        (build / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if args.phase == "build":
        return 0
    manifest = json.loads((build / "manifest.json").read_text())
    if args.match:
        manifest = {k: [c for c in v if re.search(args.match, c["name"])] if isinstance(v, list) else v
                    for k, v in manifest.items()}  # fmt: skip
    return 1 if run_sections(manifest, build, args.out, only, not args.no_compile, args.rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
