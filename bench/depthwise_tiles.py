"""Depthwise tile sweep: the depthwise convs of ConvNeXt-tiny (7x7) and EfficientNet-B0 (3x3, 5x5)
at batch 32, each on every candidate output tile of both depthwise kernel families (CUTLASS's SIMT
direct convolution, "p4q4g64w4s4", and relax_cutlass's blocked direct kernel, "direct_p8q16g32";
`tile=` pinned; "auto" is the kind's own choice), against torch's cuDNN (fp16, channels_last,
cudnn.benchmark); every result checked against torch float64.

    python bench/depthwise_tiles.py [--batch 32] [--out DIR] [--jobs 8]

Each candidate tile is built in its own process (`--one TILE`: offload with the tile pinned,
tvm.compile, export DIR/TILE.so), `--jobs` at a time, then all are loaded and timed in this one.
A tile that does not build for a filter size (CUTLASS's static checks, register limits) is a row
of the table, not the end of the run. JSON under DIR. Needs a GPU, torch and TVM's compiler (the
GPU host with the full bundle).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from relax_cutlass.testing.gpu_common import time_torch

# (H=W of the input, C, filter R, stride, model, times the model runs it); padding R // 2
DEPTHWISE_CONVS = [
    (56, 96, 7, 1, "convnext_tiny", 3),
    (28, 192, 7, 1, "convnext_tiny", 3),
    (14, 384, 7, 1, "convnext_tiny", 9),
    (7, 768, 7, 1, "convnext_tiny", 3),
    (112, 32, 3, 1, "efficientnet_b0", 1),
    (56, 144, 3, 1, "efficientnet_b0", 1),
    (28, 240, 5, 1, "efficientnet_b0", 1),
    (14, 480, 3, 1, "efficientnet_b0", 2),
    (14, 672, 5, 1, "efficientnet_b0", 2),
    (7, 1152, 5, 1, "efficientnet_b0", 3),
]
# Output tiles of CUTLASS's kernel (P x Q, channels per CTA, warps, cp.async stages):
# cutlass_library's depthwise generator's (8x8 / 4x4 / 10x10 tiles of 16, 32 or 64 channels), plus
# narrower 7x7 tiles; then the blocked direct kernel's (P x Q pixels of G channels per CTA, each
# thread's block 4x4 unless t<rows>x<cols> says otherwise).
DIRECT_CANDIDATES = ["direct_p8q16g32", "direct_p8q8g32", "direct_p4q8g32", "direct_p8q16g16", "direct_p8q16g32t2x4"]
CANDIDATES = {
    7: ["p4q4g64w4s4", "p4q4g32w4s4", "p4q4g16w4s4", "p8q8g16w4s3", "p8q8g32w4s3", "p4q8g32w4s3", "p2q8g64w4s4"]
    + DIRECT_CANDIDATES,
    3: ["p8q8g64w4s3", "p8q8g32w4s3", "p8q8g16w4s3", "p4q4g64w4s4", "p4q4g32w4s4", "p10q10g64w4s2"]
    + DIRECT_CANDIDATES
    + ["direct_p8q16g32t4x8"],
    5: ["p8q8g64w4s3", "p8q8g32w4s3", "p8q8g16w4s3", "p4q4g64w4s4", "p4q4g32w4s4", "p10q10g64w4s2"]
    + DIRECT_CANDIDATES
    + ["direct_p8q16g32t4x8"],
}


def _convs(r: int) -> list[tuple[int, tuple]]:
    return [(i, c) for i, c in enumerate(DEPTHWISE_CONVS) if c[2] == r]


def _module(batch: int, r: int):
    """One function per depthwise conv of filter size r: NHWC conv + bias, bound fp16 weights."""
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    cases = {}
    for i, (hw, c, kr, stride, _, _) in enumerate(DEPTHWISE_CONVS):
        w = (rng.uniform(-1, 1, (c, kr, kr, 1)) / kr).astype("float16")
        b = rng.uniform(-0.5, 0.5, (c,)).astype("float16")
        data = rng.uniform(-1, 1, (batch, hw, hw, c)).astype("float16")
        if kr != r:
            continue
        x = relax.Var("x", relax.TensorType((batch, hw, hw, c), "float16"))
        with bb.function(f"dw{i}", [x]):
            with bb.dataflow():
                y = bb.emit(
                    relax.op.nn.conv2d(
                        x, relax.const(w), strides=stride, padding=kr // 2, groups=c,
                        data_layout="NHWC", kernel_layout="OHWI", out_dtype="float16",
                    )
                )  # fmt: skip
                out = bb.emit_output(bb.emit(relax.op.add(y, relax.const(b))))
            bb.emit_func_output(out)
        cases[i] = (data, w, b)
    return bb.get(), cases


def build_one(tile: str, batch: int, out: Path) -> dict:
    import tvm

    import relax_cutlass

    sizes = sorted(CANDIDATES) if tile == "auto" else [k for k, tiles in CANDIDATES.items() if tile in tiles]
    record = {"tile": tile, "libraries": {}}
    for kr in sizes:
        mod, _ = _module(batch, kr)
        t0 = time.time()
        offloaded = relax_cutlass.offload_pipeline("sm_90a", tile="" if tile == "auto" else tile, profile="never")(mod)
        report = relax_cutlass.offload_report(offloaded)
        assert len(report.offloaded) == len(_convs(kr)), str(report)
        ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm"))
        path = out / f"{tile}_r{kr}.so"
        ex.export_library(str(path))
        record["libraries"][kr] = str(path)
        record[f"build_r{kr}_s"] = round(time.time() - t0, 1)
        record.setdefault("kernels", []).extend(row["kernel"] for row in report.offloaded)
    return record


def _cudnn_ms(torch, data, w, b, r, stride) -> float:
    c = w.shape[0]
    conv = torch.nn.Conv2d(c, c, r, stride, r // 2, groups=c).cuda().half()
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(w).permute(0, 3, 1, 2))
        conv.bias.copy_(torch.from_numpy(b))
    conv = conv.to(memory_format=torch.channels_last)
    x = torch.from_numpy(data).cuda().permute(0, 3, 1, 2)
    with torch.no_grad():
        return time_torch(lambda: conv(x), repeat=5, number=20)


def time_all(records: list[dict], batch: int) -> list[dict]:
    import torch
    import tvm
    from tvm import relax

    torch.backends.cudnn.benchmark = True
    dev = tvm.cuda(0)
    rows = []
    cases = {}
    for r in sorted(CANDIDATES):
        cases.update(_module(batch, r)[1])
    for i, (hw, c, r, stride, model, count) in enumerate(DEPTHWISE_CONVS):
        data, w, b = cases[i]
        ref = (
            torch.nn.functional.conv2d(
                torch.from_numpy(data).double().permute(0, 3, 1, 2).cuda(),
                torch.from_numpy(w).double().permute(0, 3, 1, 2).cuda(),
                torch.from_numpy(b).double().cuda(),
                stride=stride,
                padding=r // 2,
                groups=c,
            )
            .permute(0, 2, 3, 1)
            .cpu()
            .numpy()
        )
        row = {"hw": hw, "c": c, "r": r, "stride": stride, "model": model, "count": count, "tiles": {}}
        row["cudnn_ms"] = _cudnn_ms(torch, data, w, b, r, stride)
        x = tvm.runtime.tensor(data, dev)
        for rec in records:
            lib = rec.get("libraries", {}).get(r) or rec.get("libraries", {}).get(str(r))
            if lib is None:
                row["tiles"][rec["tile"]] = {"failed": rec.get("failed", "not built")[:300]}
                continue
            vm = relax.VirtualMachine(tvm.runtime.load_module(lib), dev)
            got = vm[f"dw{i}"](x).numpy().astype("float64")
            ms = vm.time_evaluator(f"dw{i}", dev, number=20, repeat=5)(x).median * 1e3
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            row["tiles"][rec["tile"]] = {"ms": ms, "err": err}
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    for r in sorted({row["r"] for row in rows}, reverse=True):
        sel = [row for row in rows if row["r"] == r]
        tiles = list(sel[0]["tiles"])
        print(f"\n| conv (H, C, {r}x{r}/s) | x | cuDNN ms | " + " | ".join(tiles) + " |")
        print("|---|---|---|" + "---|" * len(tiles))
        for row in sel:
            cells = [
                f"{t['ms']:.4f}" + ("" if t["err"] < 1e-2 else f" (err {t['err']:.1e})") if "ms" in t else "fail"
                for t in row["tiles"].values()
            ]
            print(
                f"| {row['hw']}, {row['c']}, /{row['stride']} | {row['count']} | {row['cudnn_ms']:.4f} | "
                + " | ".join(cells)
                + " |"
            )
        for model in sorted({row["model"] for row in sel}):
            msel = [row for row in sel if row["model"] == model]
            totals = {
                t: sum(row["count"] * row["tiles"][t]["ms"] for row in msel)
                if all("ms" in row["tiles"][t] for row in msel)
                else None
                for t in tiles
            }
            cudnn = sum(row["count"] * row["cudnn_ms"] for row in msel)
            best = min((v, t) for t, v in totals.items() if v is not None)
            print(
                f"{model} {r}x{r} weighted: cuDNN {cudnn:.3f} ms; "
                + ", ".join(f"{t} {v:.3f}" if v is not None else f"{t} fail" for t, v in totals.items())
                + f"; best {best[1]}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default=os.environ.get("OUT", "build/depthwise_tiles"))
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--one", default="")
    ap.add_argument("--timeout", type=float, default=420)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        path = out / f"{args.one}.json"
        try:
            record = build_one(args.one, args.batch, out)
        except Exception as err:
            record = {"tile": args.one, "failed": f"{type(err).__name__}: {str(err)[:1500]}"}
        path.write_text(json.dumps(record, indent=1))
        return 0
    tiles = ["auto"] + sorted({t for ts in CANDIDATES.values() for t in ts})
    env = dict(os.environ, RELAX_CUTLASS_JOBS=str(max(2, (os.cpu_count() or 2) // args.jobs)))
    pending, running = list(tiles), {}
    t_start = time.time()
    while pending or running:
        while pending and len(running) < args.jobs:
            tile = pending.pop(0)
            log = open(out / f"{tile}.log", "w")  # noqa: SIM115  (closed below)
            cmd = [sys.executable, __file__, "--one", tile, "--out", str(out), "--batch", str(args.batch)]
            running[tile] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), time.time(), log)
        time.sleep(1)
        for tile, (proc, t0, log) in list(running.items()):
            if proc.poll() is None and time.time() - t0 < args.timeout:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
            del running[tile]
            print(f"built {tile} in {time.time() - t0:.0f} s", flush=True)
    print(f"all built in {time.time() - t_start:.0f} s", flush=True)
    records = []
    for tile in tiles:
        path = out / f"{tile}.json"
        records.append(json.loads(path.read_text()) if path.exists() else {"tile": tile, "failed": "no record"})
    rows = time_all(records, args.batch)
    (out / "depthwise_tiles.json").write_text(
        json.dumps({"batch": args.batch, "records": records, "rows": rows}, indent=1)
    )
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
