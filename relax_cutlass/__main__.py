"""Main job: offload and build an embedded BERT-large encoder layer; run and time it on a GPU.

    python -m relax_cutlass [--arch auto|sm_80|sm_90a] [--batch 8] [--seq 128] [--out DIR]
    python -m relax_cutlass tune build|run ...      (kernel tuning: see relax_cutlass/tune.py)

The layer (hidden 1024, FFN 4096, 16 heads, fp16) has random weights bound as constants and folded
(`bind_params_by_name` + `FoldConstant`), the scenario in which CUTLASS BYOC used to embed weights
in generated C++. It is offloaded, compiled with `tvm.compile` and exported; with a GPU present it
is also run, checked against TVM's own CUDA build and timed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _gpu_present() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tune"]:
        from .tune import main as tune_main

        return tune_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m relax_cutlass", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--arch", default=None, help="sm_80, sm_86, sm_89, sm_90a or auto (default: auto with a GPU, else sm_80)"
    )
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--out", default="build/main", help="where the exported libraries go")
    ap.add_argument("--accumulator", default="float32", choices=["float32", "float16"])
    args = ap.parse_args(argv)

    import numpy as np
    import tvm

    import relax_cutlass
    from relax_cutlass.arch import parse_arch
    from relax_cutlass.prepare import bind_weights
    from relax_cutlass.testing.models import bert_encoder_layer, random_weights

    gpu = _gpu_present()
    arch = parse_arch(args.arch or ("auto" if gpu else "sm_80"))
    suffix = "a" if arch == 90 else ""
    target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{arch}{suffix}"}, host="llvm")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    print(
        f"BERT-large encoder layer: batch {args.batch} x seq {args.seq}, hidden 1024, FFN 4096, fp16; "
        f"target sm_{arch}{suffix}{'' if gpu else ' (no GPU here: build only)'}"
    )
    mod = bert_encoder_layer(batch=args.batch, seq=args.seq)
    weights = random_weights(mod)
    bound = bind_weights(mod, weights)

    t0 = time.time()
    offloaded = relax_cutlass.offload_pipeline(arch, accumulator=args.accumulator)(bound)
    t_offload = time.time() - t0
    print(relax_cutlass.offload_report(offloaded))
    t0 = time.time()
    ex = tvm.compile(offloaded, target)
    lib = out / "bert_layer_relax_cutlass.so"
    ex.export_library(str(lib))
    print(f"offload + kernel build {t_offload:.1f}s, tvm.compile + export {time.time() - t0:.1f}s -> {lib}")

    if not gpu:
        return 0

    from tvm.runtime.vm import VirtualMachine

    dev = tvm.cuda(0)
    ref_lib = out / "bert_layer_tvm_default.so"
    tvm.compile(bound, target).export_library(str(ref_lib))
    x = np.random.default_rng(1).uniform(-1, 1, (args.batch, args.seq, 1024)).astype("float16")
    results = {}
    for name, path in (("relax_cutlass", lib), ("tvm_default", ref_lib)):
        vm = VirtualMachine(tvm.runtime.load_module(str(path)), dev)
        arg = tvm.runtime.tensor(x, dev)
        y = vm["main"](arg).numpy()
        timer = vm.time_evaluator("main", dev, number=20, repeat=10)
        results[name] = (y, float(np.median(timer(arg).results)) * 1e3)
    (y, t), (y_ref, t_ref) = results["relax_cutlass"], results["tvm_default"]
    err = float(np.linalg.norm(y.astype("f8") - y_ref) / np.linalg.norm(y_ref.astype("f8")))
    print(f"relative error vs TVM's own build: {err:.2e} ({'ok' if err <= 1e-2 else 'TOO LARGE'})")
    print(f"relax_cutlass {t:.3f} ms, TVM default {t_ref:.3f} ms: {t_ref / t:.1f}x faster")
    return 0 if err <= 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
