"""Fused-epilogue sweep on the GPU host: every SM90 configuration with dense + bias + gelu, and one
configuration with each epilogue, at the benchmark's large shapes, next to cuBLAS in the same run.

    .venv/bin/python bench/epilogue_sweep.py build --out build/sweep          # here (nvcc)
    python3 bench/epilogue_sweep.py run build/sweep $OUT/sweep.json           # GPU host (runtime + torch)

The question is where a fused GELU's time goes: the main loop, the epilogue's math, or its
stores. The profiler library of relax_cutlass.stages.profile times each kernel with its epilogue (checked
against a float32 reference first), so the sweep needs no TVM build per kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import tempfile
from pathlib import Path

# (M, N, K): the benchmark's shapes with M >= 4096, where fused gelu must match cuBLAS's plain matmul.
SHAPES = ((4096, 4096, 1024), (4096, 1024, 4096), (8192, 4096, 1024), (8192, 1024, 4096), (8192, 8192, 8192))
GELU_TILES = (
    "tb128x128x64_c2x1x1_pingpong",
    "tb128x128x64_c1x2x1_pingpong",
    "tb64x256x64_c1x2x1_pingpong",
    "tb64x256x64_c2x1x1_pingpong",
    "tb128x256x64_c1x2x1_cooperative",
    "tb128x256x64_c2x1x1_cooperative",
    "tb256x128x64_c1x2x1_cooperative",
    "tb256x128x64_c2x1x1_cooperative",
    "tb128x128x64_c1x2x1_cooperative_streamk",
    "tb256x128x64_c1x2x1_cooperative_streamk",
)
# CUTLASS's own erf GELU (erff, about 20 instructions per element), for comparison with
# relax_cutlass's "gelu", the 16-bit polynomial form (templates.py).
ERFF_TILES = (
    "tb128x128x64_c2x1x1_pingpong",
    "tb128x256x64_c1x2x1_cooperative",
    "tb256x128x64_c1x2x1_cooperative",
)


def _register_erff() -> None:
    from relax_cutlass.kinds.epilogue import ACTIVATIONS, Activation
    from relax_cutlass.kinds.reference import ACTIVATION_REFERENCE

    ACTIVATIONS["gelu_erff"] = Activation("gelu_erff", "cutlass::epilogue::thread::GELU", is_heavy=True)
    ACTIVATION_REFERENCE["gelu_erff"] = ACTIVATION_REFERENCE["gelu"]


# One configuration, every epilogue: what each step of the fused gelu costs.
EPILOGUE_TILE = "tb128x128x64_c2x1x1_pingpong"
EPILOGUES = {
    "none": {},
    "bias": {"bias": True},
    "bias+relu": {"bias": True, "activation": "relu"},
    "bias+gelu_tanh": {"bias": True, "activation": "gelu_tanh"},
    "bias+gelu": {"bias": True, "activation": "gelu"},
    "bias+residual_add": {"bias": True, "residual": True},
    "bias+gelu_erff": {"bias": True, "activation": "gelu_erff"},
}


def _variant(name: str, tiles: dict):
    """A configuration cutlass_library does not list, named like one it does: another cluster shape
    (e.g. c1x4x1) or an explicit epilogue subtile (e.g. _epi128x64)."""
    cluster, epilogue = re.search(r"_c(\d+)x(\d+)x1_", name), re.search(r"_epi(\d+)x(\d+)$", name)
    base = re.sub(r"_c\d+x\d+x1_", "_c1x2x1_", re.sub(r"_epi\d+x\d+$", "", name))
    if base not in tiles or cluster is None:
        raise SystemExit(f"unknown SM90 configuration {name!r}: not a cutlass_library one, nor a variant of one")
    fields = {"cluster": (int(cluster[1]), int(cluster[2]), 1)}
    if epilogue:  # CUTLASS's SM90 builder takes 64-row subtiles for ping-pong, 128-row for cooperative
        rows = {"pingpong": 64, "cooperative": 128}[tiles[base].schedule]
        if int(epilogue[1]) != rows or int(epilogue[2]) % 16:
            raise SystemExit(f"{name}: a {tiles[base].schedule} epilogue subtile is {rows} x (a multiple of 16)")
        fields["epilogue_tile"] = (int(epilogue[1]), int(epilogue[2]))
    return dataclasses.replace(tiles[base], **fields)


def build(args) -> int:
    from relax_cutlass.kinds.epilogue import Epilogue, epilogue_key
    from relax_cutlass.kinds.gemm.records import GemmKernel, GemmProblem, gemm_key
    from relax_cutlass.kinds.gemm.select import candidate_tiles_sm90
    from relax_cutlass.stages.profile import ProfileJob, build_profiler

    _register_erff()
    tiles = {t.describe(): t for t in candidate_tiles_sm90("float32", "float16")}
    for name in args.tiles or ():
        if name not in tiles:
            tiles[name] = _variant(name, tiles)
    jobs = []
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    for m, n, k in shapes:
        problem = GemmProblem(m=m, n=n, k=k, b_transposed=True)
        for name, fields in EPILOGUES.items():
            if args.epilogues and name not in args.epilogues:
                continue
            epilogue = Epilogue(**fields)
            names = {"none": ERFF_TILES, "bias+gelu": GELU_TILES, "bias+gelu_erff": ERFF_TILES}.get(
                name, (EPILOGUE_TILE,)
            )
            names = args.tiles or names
            label = epilogue_key(epilogue, problem.element_out) or "none"
            key = dataclasses.replace(gemm_key(problem, 90, 90, m), epilogue=label)
            kernels = tuple(
                (GemmKernel(problem, epilogue, tiles[t], arch=90, target=90, selected_by="profiling"), 1) for t in names
            )
            jobs.append(ProfileJob(key, problem, kernels, epilogue))
    print(f"{len(jobs)} jobs, {len({k.name for j in jobs for k in j.kernels})} kernels", flush=True)
    build_profiler(jobs, 90, Path(args.out))
    print(f"built {args.out}")
    return 0


def _torch_peers(m: int, n: int, k: int) -> dict:
    """cuBLAS: the plain matmul, and eager linear + bias + gelu (two kernels), median of CUDA events."""
    import torch
    import torch.nn.functional as F

    from relax_cutlass.testing.gpu_common import time_torch

    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
    b = torch.randn(n, device="cuda", dtype=torch.float16)

    iterations = 10 if m * n * k > 2**36 else 50
    return {
        "cublas_mm_ms": time_torch(lambda: a @ w.T, repeat=7, number=iterations),
        "torch_linear_gelu_ms": time_torch(lambda: F.gelu(F.linear(a, w, b)), repeat=7, number=iterations),
    }


def run(args) -> int:
    from relax_cutlass.toolkit.profile_runner import run_profiler

    _register_erff()
    directory, out = Path(args.directory), Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        records = run_profiler(directory, Path(tmp) / "sweep.jsonl", repeat=args.repeat)
    rows = []
    for record in records:
        m, n, k = record.key.shape
        for label, ms in record.candidates.items():
            rows.append({"m": m, "n": n, "k": k, "epilogue": record.key.epilogue, "tile": label, "ms": ms})
    peers = {f"{m}x{n}x{k}": _torch_peers(m, n, k) for m, n, k in dict.fromkeys(tuple(r.key.shape) for r in records)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "peers": peers}, indent=1))
    print(f"\n{'M x N x K':>18} {'epilogue':>18} {'tile':>42} {'us':>8} {'TFLOP/s':>8} {'vs cuBLAS mm':>12}")
    for row in rows:
        if row["ms"] is None:
            continue
        peer = peers[f"{row['m']}x{row['n']}x{row['k']}"]
        tflops = 2 * row["m"] * row["n"] * row["k"] / row["ms"] / 1e9
        shape = f"{row['m']}x{row['n']}x{row['k']}"
        ratio = peer["cublas_mm_ms"] / row["ms"]
        print(f"{shape:>18} {row['epilogue']:>18} {row['tile']:>42} {row['ms'] * 1e3:8.1f} {tflops:8.0f} {ratio:12.2f}")
    for shape, peer in peers.items():
        mm, fused = peer["cublas_mm_ms"] * 1e3, peer["torch_linear_gelu_ms"] * 1e3
        print(f"{shape:>18} cuBLAS mm {mm:.1f} us, torch linear+gelu {fused:.1f} us")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default="build/sweep")
    b.add_argument("--shapes", nargs="*", help="MxNxK shapes instead of the benchmark's large ones")
    b.add_argument("--tiles", nargs="*", help="SM90 configurations instead of each epilogue's default set")
    b.add_argument("--epilogues", nargs="*", choices=sorted(EPILOGUES), help="only these epilogues")
    r = sub.add_parser("run")
    r.add_argument("directory")
    r.add_argument("out")
    r.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    return build(args) if args.command == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
