"""Where does a model's 16-bit error come from? Relative error of the zoo's Llama (or any zoo model)
against torch float64, for torch's own fp16 and for TVM's CUDA and llvm builds of the float32 and
the from_torch (fp16) modules; on the GPU host with the full TVM bundle.

    python scripts/precision_probe.py [--model llama_gqa] [--layers N] [--seq S] [--llvm]
    python scripts/precision_probe.py --bisect [--targets cuda,llvm] ...

--bisect returns every intermediate tensor of the fp16 module and compares two builds of it
binding by binding (CUDA against llvm by default): the first binding whose value differs while its
inputs agree is the op one backend lowers differently.

A TVM float32 CUDA build far from torch float64 points at TVM's CUDA lowering (fast-math
intrinsics); an fp16 module whose llvm build is close but CUDA build is not, likewise; both far:
the 16-bit graph itself.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import time

import torch
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.frontend import import_float32
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.zoo import ZOO, float64_reference


def run(mod, target, dev, inputs):
    t0 = time.time()
    vm = relax.VirtualMachine(tvm.compile(mod, target), dev)
    out = vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs])
    out = out if hasattr(out, "numpy") else out[0]
    return out.numpy(), time.time() - t0


def expose_bindings(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[tuple[str, str]]]:
    """`main` returning every floating-point tensor it binds (dataflow vars made plain vars so they
    may leave their block), and (var name, op name) for each, in binding order."""
    mod = relax.transform.ToNonDataflow()(mod)
    func = mod["main"]
    exposed, names = [], []
    for block in func.body.blocks:
        for binding in block.bindings:
            info = binding.var.ty
            if isinstance(info, relax.TensorType) and str(info.dtype) in ("float16", "bfloat16", "float32"):
                value = binding.value
                is_op_call = isinstance(value, relax.Call) and hasattr(value.op, "name")
                op = value.op.name if is_op_call else type(value).__name__
                exposed.append(binding.var)
                names.append((binding.var.name, f"{op} {info.dtype}"))
    body = relax.SeqExpr(func.body.blocks, relax.Tuple(exposed))
    ret = relax.TupleType([var.ty for var in exposed])
    mod["main"] = relax.Function(func.params, body, ret_ty=ret, is_pure=func.is_pure, attrs=func.attrs)
    return mod, names


def bisect(mod: tvm.IRModule, inputs, targets: list[str]) -> None:
    """Print, binding by binding, how far the two targets' builds of `mod` are apart."""
    exposed, names = expose_bindings(mod)
    outs = []
    for spec in targets:
        target, dev = (
            (tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm"), tvm.cuda(0))
            if spec == "cuda"
            else ("llvm", tvm.cpu())
        )
        t0 = time.time()
        vm = relax.VirtualMachine(tvm.compile(exposed, target), dev)
        values = vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs])
        outs.append([v.numpy().astype("float64") for v in values])
        print(f"{spec}: {len(names)} bindings built and run in {time.time() - t0:.0f} s", flush=True)
    worst = 0.0
    for (name, op), a, b in zip(names, *outs, strict=True):
        error = rel_error(a, b)
        jump = "  <-- grows" if error > max(2 * worst, 1e-3) else ""
        worst = max(worst, error)
        print(f"{name:>24} {op:<36} {str(a.shape):<22} {error:.2e}{jump}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama_gqa")
    ap.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (transformers)")
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--llvm", action="store_true", help="also the llvm builds (slow for large models)")
    ap.add_argument("--bisect", action="store_true", help="compare two builds binding by binding")
    ap.add_argument("--targets", default="cuda,llvm", help="--bisect: the two builds (cuda, llvm)")
    args = ap.parse_args()
    entry = next(e for e in ZOO if e.name == args.model)
    entry = dataclasses.replace(entry, seq=args.seq or entry.seq)
    if args.layers:
        import transformers

        original = transformers.LlamaConfig.__init__

        def init(self, *a, **kw):
            original(self, *a, **{**kw, "num_hidden_layers": args.layers})

        transformers.LlamaConfig.__init__ = init
    model, example = entry.build()
    if args.bisect:
        bisect(relax_cutlass.from_torch(model, example), [x.numpy() for x in example], args.targets.split(","))
        return
    ref = float64_reference(model, [x.cuda() for x in example])
    with torch.no_grad():
        half = copy.deepcopy(model).cuda().half()
        inputs16 = [x.cuda().half() if x.is_floating_point() else x.cuda() for x in example]
        print(f"torch fp16 (GPU): {rel_error(half(*inputs16).cpu().numpy(), ref):.2e}")
    model = model.cpu()
    inputs = [x.numpy() for x in example]
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")
    modules = {"float32": import_float32(model, example), "fp16 (from_torch)": relax_cutlass.from_torch(model, example)}
    for name, mod in modules.items():
        out, s = run(mod, cuda, tvm.cuda(0), inputs)
        print(f"TVM CUDA {name}: {rel_error(out, ref):.2e} ({s:.0f} s)", flush=True)
        # TVM 0.27 compiles its CUDA kernels with --use_fast_math (__sinf/__cosf/__expf, approximate
        # division, denormals flushed) unless this variable is set when it runs nvcc
        os.environ["TVM_CUDA_NVCC_NO_FAST_MATH"] = "1"
        out, s = run(mod, cuda, tvm.cuda(0), inputs)
        del os.environ["TVM_CUDA_NVCC_NO_FAST_MATH"]
        print(f"TVM CUDA {name}, no --use_fast_math: {rel_error(out, ref):.2e} ({s:.0f} s)", flush=True)
        if args.llvm:
            out, s = run(mod, "llvm", tvm.cpu(), inputs)
            print(f"TVM llvm {name}: {rel_error(out, ref):.2e} ({s:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
