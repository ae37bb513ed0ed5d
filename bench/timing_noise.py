"""How far apart the GPU suite's timings of equal things fall: one benchmark case's relax_cutlass
build, its tuned build (the same kernels when tuning kept the heuristic's), the first build again on
a second copy of the inputs, and cuBLAS's plain matmul, timed in turn for several rounds, every
sample printed (GPU host; the libraries of bench/gpu_suite.py --only bench --tuning-db ... --out DIR).

    python3 bench/timing_noise.py DIR/build [CASE ...] [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from relax_cutlass.testing.gpu_common import alternating_samples

DEFAULT_CASES = ("dense_bias_gelu_m8192_k1024_n4096", "dense_bias_gelu_m4096_k4096_n1024")


def _samples(suite, build: Path, case: dict, rounds: int) -> dict[str, list[float]]:
    """us per call of each timer, one sample per round."""
    name = case["name"]
    values = suite.inputs_for(case["tvm_params"], {}, 1)
    heuristic = suite.load(build / f"{name}.cutlass.so")
    tuned = suite.load(build / f"{name}.cutlass_tuned.so")
    inputs, copy = (suite.device_args(case["cutlass_params"], values) for _ in range(2))
    _, matmul_only = suite.torch_linear_fns(case, values)
    timers = {
        "relax_cutlass": lambda: suite.time_args(heuristic, inputs),
        "tuned build": lambda: suite.time_args(tuned, inputs),
        "inputs copy": lambda: suite.time_args(heuristic, copy),
        "cuBLAS mm": lambda: suite.time_torch(matmul_only),
    }
    samples = alternating_samples(timers, rounds)  # every round kept, the first included
    return {label: [ms * 1e3 for ms in values] for label, values in samples.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", type=Path)
    ap.add_argument("cases", nargs="*", default=list(DEFAULT_CASES))
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    import suite_timing as suite

    manifest = json.loads((args.build / "manifest.json").read_text())
    suite.warm_up_gpu()
    for name in args.cases:
        case = next(c for c in manifest["bench"] if c["name"] == name)
        print(name)
        for label, values_us in _samples(suite, args.build, case, args.rounds).items():
            listed = " ".join(f"{v:.1f}" for v in values_us)
            print(f"  {label:14s} median {statistics.median(values_us):7.1f} us   rounds: {listed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
