"""Find the first binding of a model whose TVM CUDA build differs from its llvm build.

    python scripts/bisect_cuda.py gpt2|llama      (on the GPU host, with the full TVM bundle)

Each tensor binding of main (in order) becomes the output of a truncated copy of main, built for
CUDA and for the CPU; the first one whose values differ (or are non-finite only on the GPU) is
printed with its expression. For bugs in TVM's own CUDA kernels that a model's graph hits.
"""

import sys

import numpy as np
import torch
import transformers
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.testing.models.torch_transformers import last_hidden_state


def small_model(which: str):
    torch.manual_seed(0)
    if which == "gpt2":
        config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, n_positions=64, vocab_size=128)
        model = transformers.GPT2Model(config).eval()
    else:
        config = transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=1,
            vocab_size=128,
        )
        model = transformers.LlamaModel(config).eval()

    ids = torch.randint(0, 128, (1, 16))
    return relax_cutlass.from_torch(last_hidden_state(model), (ids,)), [ids.numpy()]


def with_every_binding_out(mod):
    """main returning the tuple of every tensor its dataflow block binds, and their bindings."""
    func = mod["main"]
    (block,) = [b for b in func.body.blocks if isinstance(b, relax.DataflowBlock)]
    probed = [b for b in block.bindings if isinstance(b.var.ty, relax.TensorType)]
    outs = relax.Var("probes", relax.TupleType([b.var.ty for b in probed]))
    bindings = [*block.bindings, relax.VarBinding(outs, relax.Tuple([b.var for b in probed]))]
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], outs)
    new = relax.Function(func.params, body, outs.ty, func.is_pure, func.attrs)
    return tvm.IRModule({"main": new}), probed


def run(mod, target, dev, inputs):
    ex = tvm.compile(mod, target)
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs])
    return [o.numpy() for o in out]


def main():
    mod, inputs = small_model(sys.argv[1])
    probed_mod, probed = with_every_binding_out(mod)
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")
    gots = run(probed_mod, cuda, tvm.cuda(0), inputs)
    refs = run(probed_mod, "llvm", tvm.cpu(), inputs)
    for binding, got, ref in zip(probed, gots, refs, strict=True):
        if got.dtype.kind in "biu":
            same = np.array_equal(got, ref)
        else:
            same = np.allclose(got, ref, rtol=2e-2, atol=2e-2, equal_nan=True) and (
                np.isfinite(got).all() or not np.isfinite(ref).all()
            )
        if not same:
            print("cuda:", got.reshape(-1)[:16])
            print("llvm:", ref.reshape(-1)[:16])
            print(f"FIRST DIFFERENCE: {binding.var.name} = {str(binding.value)[:400]}")
            return
    print(f"no difference in {len(probed)} tensors")


if __name__ == "__main__":
    main()
