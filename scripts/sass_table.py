"""For every arch spelling a user may write, build the kernels of a BERT-large encoder layer (dense
GEMMs with bias / gelu / residual epilogues, fused attention) and a ResNet-style conv block exactly
as `offload_pipeline` plans and compiles them (the SASS guard included), then print each kernel's
family and the tensor-core instruction counts of its SASS: arch -> family -> instruction counts.

    python scripts/sass_table.py [--arches sm_90a,sm_100a,...] [--json OUT]

No GPU needed (nvcc and cuobjdump only); every object is cached, so a second run is quick.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from relax_cutlass.arch import arch_name, parse_arch
from relax_cutlass.pipeline import partition_as_offloaded
from relax_cutlass.prepare import bind_weights
from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
from relax_cutlass.stages.constants import offloaded_functions
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing.models import bert_encoder_layer, conv2d_epilogue_model, random_weights
from relax_cutlass.toolkit.compile import compile_all
from relax_cutlass.toolkit.sass_check import FAMILIES, mma_counts

ARCHES = ("sm_80", "sm_90a", "sm_100", "sm_100a", "sm_100f", "sm_103a", "sm_110", "sm_120", "sm_121")
OPCODES = ("HMMA", "HGMMA", "UTCHMMA", "FFMA")


def models():
    bert = bert_encoder_layer(batch=8, seq=128)
    # ResNet-50's stage-2 block shape (C = 128: the CUTLASS 3.x conv families take it; C = 64 stays SM80)
    conv = conv2d_epilogue_model(8, 28, 28, 128, 128, kernel=3, padding=1, residual=True, residual_relu=True)
    return [bind_weights(m, random_weights(m)) for m in (bert, conv)]


def kernels_for(arch: str) -> list:
    sm = parse_arch(arch)
    options = CodegenOptions.create(arch, profile="never")  # the heuristic's kernels; a GPU host would tune
    kernels = {}
    for mod in models():
        part = partition_as_offloaded(mod, sm)
        for region in plan_regions([f for _, f in offloaded_functions(part)], options):
            for kernel in getattr(region, "kernels", (region.kernel,)):
                kernels[kernel.name] = kernel
    return list(kernels.values())


def table(arches) -> list[dict]:
    rows = []
    for arch in arches:
        sm = parse_arch(arch)
        kernels = kernels_for(arch)
        sources = [emit_kernel(k) for k in kernels]
        objects = compile_all(sources, sm)  # the guard refuses any stub here
        for kernel, source in zip(kernels, sources, strict=True):
            counts, sass, _ = mma_counts(objects[kernel.name][0], OPCODES)
            rows.append(
                {
                    "arch": arch,
                    "target": arch_name(sm),
                    "sass": sass,
                    "kernel": kernel.name,
                    "family": source.family,
                    "needs": FAMILIES[source.family][1],
                    "counts": counts,
                }
            )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arches", default=",".join(ARCHES))
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = table(args.arches.split(","))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("| arch | SASS | family | kernels | MMA instructions (sum over the kernels) |")
    print("|---|---|---|---|---|")
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["arch"], ",".join(row["sass"]), row["family"]), []).append(row)
    bad = 0
    for (arch, sass, family), members in groups.items():
        total = sum((Counter(r["counts"]) for r in members), Counter())
        bad += sum(1 for r in members if not any(r["counts"].get(op, 0) for op in r["needs"]))
        counts = ", ".join(f"{op} {total.get(op, 0)}" for op in OPCODES)
        print(f"| {arch} | {sass} | {family} | {len(members)} | {counts} |")
    print(f"{len(rows)} kernels, {bad} without their family's instructions")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
