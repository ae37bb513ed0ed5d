"""DenseNet-121's convolutions at batch 32 (fp16, NHWC), every candidate kernel timed by the
profiler against the heuristic's choice: the growth convs (3x3, 128 -> 32 channels) of each dense
block, whose 32 output channels fill few CTAs, and the bottleneck 1x1 convs (-> 128) of the two
smaller blocks, which the heuristic gives SM80 split-K kernels or SM90 128x64 tiles.

    python bench/densenet_convs.py [--out DIR]

Writes DIR/densenet-convs.json (per problem: the heuristic's kernel and time, the best candidate
and every candidate's time) and DIR/tuning.jsonl. Needs a Hopper GPU and TVM's compiler (the GPU
host with the full bundle).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

# (batch, H=W, C, K, groups, R, stride, dilation, bias, activation), as gpu_convs' cases
CASES = [
    *[(32, hw, 128, 32, 1, 3, 1, 1, False, "identity") for hw in (56, 28, 14, 7)],
    (32, 28, 256, 128, 1, 1, 1, 1, True, "relu"),
    (32, 14, 512, 128, 1, 1, 1, 1, True, "relu"),
    (32, 14, 992, 128, 1, 1, 1, 1, True, "relu"),
    (32, 7, 512, 128, 1, 1, 1, 1, True, "relu"),
    (32, 7, 992, 128, 1, 1, 1, 1, True, "relu"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "build/densenet_convs")))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import relax_cutlass
    from relax_cutlass.testing import gpu_convs

    db = args.out / "tuning.jsonl"
    mod, _, _ = gpu_convs.module_and_references(CASES)
    t0 = time.time()
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="auto", tuning_db=str(db))(mod)
    build_s = time.time() - t0
    print(relax_cutlass.offload_report(offloaded), flush=True)
    rows = []
    for line in db.read_text().splitlines():
        record = json.loads(line)
        if record["key"]["op"] != "conv2d":
            continue
        candidates = record.get("candidates", {})
        heuristic = record.get("heuristic")
        rows.append(
            {
                "shape": record["key"]["shape"],
                "geometry": record["key"].get("geometry"),
                "epilogue": record["key"]["epilogue"],
                "family": record["key"]["family"],
                "heuristic": heuristic,
                "heuristic_ms": candidates.get(heuristic),
                "best": record["tile"],
                "best_ms": record["ms"],
                "split_k": record.get("split_k", 1),
                "candidates": candidates,
            }
        )
    for r in rows:
        gain = r["heuristic_ms"] / r["best_ms"] if r["heuristic_ms"] else float("nan")
        print(
            f"{r['shape']} {r['epilogue'] or 'none'} family {r['family']}: heuristic {r['heuristic']} "
            f"{r['heuristic_ms']} ms, best {r['best']} (split-K {r['split_k']}) {r['best_ms']:.4f} ms ({gain:.2f}x)"
        )
    (args.out / "densenet-convs.json").write_text(
        json.dumps({"cases": CASES, "build_and_profile_s": build_s, "problems": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
