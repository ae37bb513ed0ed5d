"""Per-conv benchmark: every distinct conv of torchvision's ResNet-50 (224x224 input) with its
bias + relu epilogue, as relax_cutlass's SM90 kernels (CUTLASS 3.x, TMA im2col + wgmma; the
heuristic's choice on sm_90a), as its SM80 kernels (family="sm80": CUTLASS 2.x implicit GEMMs,
serial split-K where the output under-fills the GPU) and as torch's cuDNN (fp16, channels_last,
cudnn.benchmark), each checked against torch float64.

    python bench/conv_families.py [--batches 32,1] [--out DIR]

Each family's convs are one module (a function per conv), built once; the table weights each conv
by how often ResNet-50 runs it. The "SM90" column is family="auto", the heuristic's choice: convs
with C < 128 keep the SM80 kernel there (select_3x.py), as measured on the H200
(bench/results/2026-11-26-conv-families-nvidia-h200.json, whose "SM90" column is the SM90 kernel for
every conv).
JSON under DIR. Needs a Hopper GPU, torch and TVM's compiler (the GPU host with the full bundle).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

# (H=W of the input, C, K, R, stride, times ResNet-50 runs it); padding R // 2
RESNET50_CONVS = [
    (224, 3, 64, 7, 2, 1),  # the stem (C=3: padded to 8 channels by relax_cutlass)
    (56, 64, 64, 1, 1, 1),
    (56, 64, 64, 3, 1, 3),
    (56, 64, 256, 1, 1, 4),  # 3 expansions + the downsample
    (56, 256, 64, 1, 1, 2),
    (56, 256, 128, 1, 1, 1),
    (56, 128, 128, 3, 2, 1),
    (28, 128, 512, 1, 1, 4),
    (56, 256, 512, 1, 2, 1),
    (28, 512, 128, 1, 1, 3),
    (28, 128, 128, 3, 1, 3),
    (28, 512, 256, 1, 1, 1),
    (28, 256, 256, 3, 2, 1),
    (14, 256, 1024, 1, 1, 6),
    (28, 512, 1024, 1, 2, 1),
    (14, 1024, 256, 1, 1, 5),
    (14, 256, 256, 3, 1, 5),
    (14, 1024, 512, 1, 1, 1),
    (14, 512, 512, 3, 2, 1),
    (7, 512, 2048, 1, 1, 3),
    (14, 1024, 2048, 1, 2, 1),
    (7, 2048, 512, 1, 1, 2),
    (7, 512, 512, 3, 1, 2),
]
FAMILIES = ("auto", "sm80")


def _module(batch: int, rng):
    """One function per conv: NHWC conv + bias -> relu with bound fp16 weights; -> (module, cases)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    cases = []
    for i, (hw, c, k, r, stride, _) in enumerate(RESNET50_CONVS):
        w = (rng.uniform(-1, 1, (k, r, r, c)) / np.sqrt(r * r * c)).astype("float16")
        b = rng.uniform(-0.5, 0.5, (k,)).astype("float16")
        x = relax.Var("x", relax.TensorType((batch, hw, hw, c), "float16"))
        with bb.function(f"conv{i}", [x]):
            with bb.dataflow():
                y = bb.emit(
                    relax.op.nn.conv2d(
                        x, relax.const(w), strides=stride, padding=r // 2,
                        data_layout="NHWC", kernel_layout="OHWI", out_dtype="float16",
                    )
                )  # fmt: skip
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(b))))
                out = bb.emit_output(y)
            bb.emit_func_output(out)
        data = rng.uniform(-1, 1, (batch, hw, hw, c)).astype("float16")
        cases.append((data, w, b))
    return bb.get(), cases


def _reference(torch, data, w, b, r, stride):
    t = torch.nn.functional.conv2d(
        torch.from_numpy(data).double().permute(0, 3, 1, 2).cuda(),
        torch.from_numpy(w).double().permute(0, 3, 1, 2).cuda(),
        torch.from_numpy(b).double().cuda(),
        stride=stride,
        padding=r // 2,
    )
    return torch.relu(t).permute(0, 2, 3, 1).cpu().numpy()


def _cudnn_ms(torch, data, w, b, r, stride) -> float:
    conv = torch.nn.Conv2d(w.shape[3], w.shape[0], r, stride, r // 2).cuda().half()
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(w).permute(0, 3, 1, 2))
        conv.bias.copy_(torch.from_numpy(b))
    conv = conv.to(memory_format=torch.channels_last)
    x = torch.from_numpy(data).cuda().permute(0, 3, 1, 2)  # NHWC storage: channels_last
    with torch.no_grad():
        for _ in range(10):
            torch.relu(conv(x))
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                torch.relu(conv(x))
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 20)
    return float(np.median(times))


def run(batch: int) -> list[dict]:
    import torch
    import tvm
    from tvm import relax

    import relax_cutlass

    torch.backends.cudnn.benchmark = True
    dev = tvm.cuda(0)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")
    rows = [
        {"batch": batch, "hw": hw, "c": c, "k": k, "r": r, "stride": stride, "count": count}
        for hw, c, k, r, stride, count in RESNET50_CONVS
    ]
    for family in FAMILIES:
        mod, cases = _module(batch, np.random.default_rng(0))
        t0 = time.time()
        offloaded = relax_cutlass.offload_pipeline("sm_90a", family=family, profile="never")(mod)
        report = relax_cutlass.offload_report(offloaded)
        vm = relax.VirtualMachine(tvm.compile(offloaded, target), dev)
        print(f"batch {batch} {family}: built in {time.time() - t0:.0f} s", flush=True)
        # report rows by (H, K, R, stride); C too, except for the stem (its C padded to 8)
        kernels = {}
        for r in report.offloaded:
            _, hw, _, c = r["shapes"]["data"]
            k, kr, _, _ = r["shapes"]["weight"]
            kernels[(hw, k, kr, r["conv"]["stride"][0], c if kr != 7 else 3)] = r["kernel"]
        for i, (row, (data, w, b)) in enumerate(zip(rows, cases, strict=True)):
            x = tvm.runtime.tensor(data, dev)
            got = vm[f"conv{i}"](x).numpy().astype("float64")
            want = _reference(torch, data, w, b, row["r"], row["stride"])
            ms = vm.time_evaluator(f"conv{i}", dev, number=20, repeat=5)(x).median * 1e3
            row[family] = {
                "ms": ms,
                "err": float(np.linalg.norm(got - want) / np.linalg.norm(want)),
                "kernel": kernels.get((row["hw"], row["k"], row["r"], row["stride"], row["c"]), "in TVM"),
            }
    for row, (data, w, b) in zip(rows, _module(batch, np.random.default_rng(0))[1], strict=True):
        row["cudnn_ms"] = _cudnn_ms(torch, data, w, b, row["r"], row["stride"])
    return rows


def print_table(rows: list[dict]) -> None:
    print("| batch | conv (H, C->K, RxR/s) | x | SM90 ms | SM80 ms | cuDNN ms | SM90 err | SM90 kernel |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        sm90, sm80 = r["auto"], r["sm80"]
        print(
            f"| {r['batch']} | {r['hw']}, {r['c']}->{r['k']}, {r['r']}x{r['r']}/{r['stride']} | {r['count']} "
            f"| {sm90['ms']:.4f} | {sm80['ms']:.4f} | {r['cudnn_ms']:.4f} | {sm90['err']:.1e} "
            f"| {sm90['kernel'].split('_a8_')[-1] if sm90['kernel'] else '-'} |"
        )
    for batch in sorted({r["batch"] for r in rows}, reverse=True):
        sel = [r for r in rows if r["batch"] == batch]
        total = {f: sum(r["count"] * r[f]["ms"] for r in sel) for f in FAMILIES}
        cudnn = sum(r["count"] * r["cudnn_ms"] for r in sel)
        print(
            f"batch {batch}, ResNet-50's convs weighted by count: SM90 {total['auto']:.3f} ms, "
            f"SM80 {total['sm80']:.3f} ms, cuDNN {cudnn:.3f} ms"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="32,1")
    ap.add_argument("--out", default=os.environ.get("OUT", "build/conv_families"))
    args = ap.parse_args()
    rows = []
    for batch in map(int, args.batches.split(",")):
        rows += run(batch)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "conv_families.json").write_text(json.dumps(rows, indent=1))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
