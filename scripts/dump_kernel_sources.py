"""Write every kernel, glue and profiler source relax_cutlass generates for the test and GPU-suite
models into one folder (no nvcc), plus each case's offload-report rows, to compare generated C++
byte for byte before and after a refactor:

    python scripts/dump_kernel_sources.py build/sources-before
    ... change the code ...
    python scripts/dump_kernel_sources.py build/sources-after
    diff -r build/sources-before build/sources-after

Cases: the GPU suite's correctness, benchmark, sweep, conv2d, random-graph, attention and frontend
cases (relax_cutlass.testing's gpu_cases and suite_cases), the BERT layer, small torch.export
models (ResNet-50, MobileNetV3, ViT, BERT, the LLaMA MLP), for sm_80, sm_90a (native and CUTLASS 2.x families) and
sm_100a. The profiler's stage-1 sources of every case's problems are written too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import traceback
from pathlib import Path

from relax_cutlass.pipeline import partition_as_offloaded
from relax_cutlass.stages import profile
from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
from relax_cutlass.stages.constants import offloaded_functions
from relax_cutlass.stages.emit import emit_glue, emit_kernel
from relax_cutlass.testing import gpu_build, gpu_cases, suite_cases

ARCHES = (("sm_80", ("auto",)), ("sm_90a", ("auto", "sm80")), ("sm_100a", ("auto",)))


def cases() -> list[tuple[str, object, bool, dict]]:
    """(name, module, bind weights, codegen options)."""
    from relax_cutlass.testing.models import bert_encoder_layer, dense_epilogue_model

    gpu_cases.register_quick_gelu()
    out = []
    for name, kwargs, options in gpu_cases.TEST_CASES:
        mod, bind = gpu_cases.dense_case_model(kwargs)
        out.append((name, mod, bind, options))
    for name, kwargs, options in gpu_cases.CONV_TEST_CASES:
        mod, bind = gpu_cases.conv_case_model(kwargs)
        out.append((name, mod, bind, options))
    for epi, kwargs in suite_cases.BENCH_EPILOGUES.items():
        for m in suite_cases.BENCH_M:
            for k, n in suite_cases.BENCH_KN:
                out.append((f"bench_{epi}_m{m}_k{k}_n{n}", dense_epilogue_model(m, n, k, **kwargs), False, {}))
    sweep = dense_epilogue_model("m", 4096, 1024, activation="gelu")
    out += [(f"sweep_{tile}", sweep, False, {"tile": tile}) for tile in suite_cases.SWEEP_TILES]
    for b in (1, 32):
        for hw, c in suite_cases.CONV_STAGES:
            out.append((f"conv_stage_n{b}_{hw}_c{c}", gpu_build.stage_model(b, hw, c), False, {}))
    out.append(("bert_layer", bert_encoder_layer(), True, {}))
    out += [(name, mod, bind, {}) for name, mod, bind, _ in gpu_cases.graph_cases()]
    out += [(name, mod, False, {}) for name, mod, _, _ in gpu_cases.attention_cases()]
    out += [(name, factory(), False, {}) for name, factory in gpu_cases.frontend_cases()]
    out += torch_cases()
    return out


def torch_cases() -> list:
    from relax_cutlass.testing.models.torch_models import mobilenet_v3_module, resnet50_module, vit_module
    from relax_cutlass.testing.models.torch_transformers import bert_module, llama_mlp_module

    return [
        ("resnet50_small", gpu_build.shippable(*resnet50_module(batch=2, image=64)), False, {}),
        ("mobilenet_v3_small", gpu_build.shippable(*mobilenet_v3_module(batch=2, image=64)), False, {}),
        ("vit_small", gpu_build.shippable(*vit_module(batch=2, image=64)), False, {}),
        ("bert_small", gpu_build.shippable(*bert_module(batch=2, seq=32, layers=1, hidden=256, heads=4, ffn=512)),
         False, {}),
        ("llama_mlp", gpu_build.shippable(*llama_mlp_module()), False, {}),
    ]  # fmt: skip


def partition(mod, bind: bool, arch: str):
    if bind:
        mod = gpu_build.bind(mod, gpu_build.weight_names(mod))
    return partition_as_offloaded(mod, arch)


def profiler_sources(problems: list, arch: int, family: str) -> list:
    """The sources build_profiler would compile for these problems' stage-1 jobs (no compiler)."""
    captured = []

    def capture(sources, *_args, **_kwargs):
        captured.extend(sources)
        raise _Captured

    jobs = profile.plan_jobs(problems, arch, family)
    if not jobs:
        return []
    saved = profile.compile_all
    profile.compile_all = capture
    try:
        profile.build_profiler(jobs, arch, Path("/nonexistent-relax-cutlass-dump"))
    except (_Captured, OSError):
        pass
    finally:
        profile.compile_all = saved
    return captured


class _Captured(Exception):
    pass


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.no_torch:
        globals()["torch_cases"] = list
    written: dict[str, str] = {}

    def write(name: str, text: str) -> None:
        digest = hashlib.sha256(text.encode()).hexdigest()
        if written.get(name, digest) != digest:
            raise SystemExit(f"two different sources named {name}")
        written[name] = digest
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(text)

    reports = {}
    for case, mod, bind, options in cases():
        for arch, families in ARCHES:
            try:
                part = partition(mod, bind, arch)
            except Exception:  # noqa: BLE001
                reports[f"{case}@{arch}"] = {"error": traceback.format_exc(limit=1).splitlines()[-1]}
                continue
            funcs = [f for _, f in offloaded_functions(part)]
            for family in families:
                label = f"{case}@{arch}@{family}"
                try:
                    opts = CodegenOptions.create(arch, family=family, profile="never", **options)
                    regions = plan_regions(funcs, opts)
                except Exception:  # noqa: BLE001
                    reports[label] = {"error": traceback.format_exc(limit=1).splitlines()[-1]}
                    continue
                reports[label] = [r.report_row() for r in regions]
                if not regions:
                    continue
                for kernel in {k.name: k for r in regions for k in r.kernels}.values():
                    src = emit_kernel(kernel)
                    write(f"{arch}/{src.name}.{src.kind}", src.text)
                glue = emit_glue(regions, f"{case}_module")
                write(f"glue.{label.replace('@', '.')}.{glue.kind}", glue.text)
                if not options:
                    problems = [r.kernel.problem for r in regions]
                    for src in profiler_sources(problems, opts.arch, family):
                        name = src.name if src.name != "relax_cutlass_profiler_glue" else f"profiler.{label}"
                        write(f"{arch}/{name.replace('@', '.')}.{src.kind}", src.text)
        print(f"{case}: done", flush=True)
    (out / "reports.json").write_text(json.dumps(reports, indent=1, sort_keys=True))
    print(f"wrote {len(written)} sources and {len(reports)} reports to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
