"""Run a module offloaded by relax_cutlass on the CPU, each extern kernel served by its composite.

The rewritten module calls `R.call_dps_packed(R.extern(symbol), ...)`. Here every symbol is
registered as a global function that runs the region's original composite, compiled for llvm, so
the rest of the rewrite (partition boundaries, lifted constants, argument order, output shapes)
is checked against the untouched module without a GPU.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

import relax_cutlass
from relax_cutlass.pipeline import partition_as_offloaded, post_codegen_passes
from relax_cutlass.rewrites.canonicalize import AccumulateInFloat32, accumulate_in_float32
from relax_cutlass.stages.constants import composite_of, offloaded_functions
from relax_cutlass.toolkit.compile import cache_dir

from .errors import rel_error, within

# LLVM at -O0: the CPU builds are references run once or twice on small inputs, and most of a
# test's time was LLVM's optimization of TVM's unscheduled loops (on 2 cores: tests/test_attention.py
# 94 s at -O1, 72 s at -O0; the whole suite 731 s and 645 s; a one-layer ViT took 57 s at -O3). The
# rewritten and the original module are built alike, and no level changes IEEE float semantics.
CPU = tvm.target.Target({"kind": "llvm", "opt-level": 0})


def exported_library(ex, path: Path):
    """`ex` exported to the shared library `path` and loaded, for `relax.VirtualMachine`. A VM made
    from the executable itself JIT-compiles its LLVM module at the first call, whatever the target's
    opt-level: 0.78 s for a one-layer ViT at -O0 and at -O1, where writing the library and loading
    it took 0.23 s. A host that cannot link a shared object gets `ex` back."""
    partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp.so")
    try:  # another worker may write the same file: each writes its own, then renames
        ex.export_library(str(partial))
        os.replace(partial, path)
    except Exception:
        partial.unlink(missing_ok=True)
        return ex
    return tvm.runtime.load_module(str(path))


def build_cpu(mod: tvm.IRModule):
    ex = tvm.compile(mod, CPU)
    with tempfile.TemporaryDirectory() as folder:  # the loaded library outlives its file
        return relax.VirtualMachine(exported_library(ex, Path(folder) / "module.so"), tvm.cpu())


COMPOSITE_BUILDS: dict[str, tuple[relax.VirtualMachine, threading.Lock]] = {}


def build_composite_cpu(composite: relax.Function) -> tuple[relax.VirtualMachine, threading.Lock]:
    """`build_cpu` of one region's composite, built once per machine: the tests' models repeat the
    same regions (a tiny transformer's projections, its attention) from test to test, and their
    llvm builds were a third of a typical model test. Keyed by the composite's structural hash (its
    constants included), signature, TVM's version and the CPU target; kept in this process and as a
    shared library beside the kernel objects (toolkit.compile.cache_dir), which every test worker
    and later run loads. With the VM comes its lock: a VM is not reentrant, and regions of one
    model (or of the ranks testing.parallel runs in threads) may share it."""
    # TVM's structural hash (stable from process to process: MetaSchedule keys its database on it)
    # and the signature; not the printed or serialized IR, which crash on bfloat16 constants
    signature = ", ".join(str(p.ty) for p in composite.params) + f" -> {composite.ret_ty}"
    text = f"{tvm.__version__}\n{CPU}\n{tvm_ffi.structural_hash(composite)}\n{signature}"
    key = hashlib.sha256(text.encode()).hexdigest()[:24]
    if key in COMPOSITE_BUILDS:
        return COMPOSITE_BUILDS[key]
    path = cache_dir() / "cpu-composites" / f"composite-{key}.so"
    if path.exists():
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        library = exported_library(tvm.compile(tvm.IRModule({"main": composite}), CPU), path)
        vm = relax.VirtualMachine(library, tvm.cpu())
    COMPOSITE_BUILDS[key] = (vm, threading.Lock())
    return COMPOSITE_BUILDS[key]


def run_vm(vm, inputs: list[np.ndarray]) -> np.ndarray:
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    if not hasattr(out, "numpy"):  # frontends return a 1-tuple
        (out,) = out
    return out.numpy()


def serve_regions_on_cpu(partitioned: tvm.IRModule) -> list[str]:
    """Register each offloaded function's composite (llvm build) under its extern symbol. Its 16-bit
    matmuls and convolutions sum in float32, as the kernels do (`accumulate_in_float32`; TVM's llvm
    build sums in the out_dtype, in bfloat16 several times the kernels' error)."""
    symbols = []
    for _, func in offloaded_functions(partitioned):
        symbol = str(func.attrs["global_symbol"])
        composite = static_view_shapes(accumulate_in_float32(composite_of(func).without_attr("Composite")))
        vm, lock = build_composite_cpu(composite)

        outputs = len(composite.ret_ty.fields) if isinstance(composite.ret_ty, relax.TupleType) else 1

        def serve(*args, _vm=vm, _outputs=outputs, _lock=lock):
            # DPS: the outputs follow the inputs; a region with extra outputs returns a tuple. One
            # call at a time: a VM is not reentrant (testing.parallel runs ranks in threads).
            with _lock:
                result = _vm["main"](*args[:-_outputs])
            results = list(result) if _outputs > 1 else [result]
            for out, value in zip(args[-_outputs:], results, strict=True):
                out.copyfrom(value)

        tvm_ffi.register_global_func(symbol, serve, override=True)
        symbols.append(symbol)
    return symbols


@relax.expr_functor.mutator
class _ViewShapesFromTypes(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        views = {"relax.reshape": relax.op.reshape, "relax.broadcast_to": relax.op.broadcast_to}
        if isinstance(call.op, tvm.ir.Op) and call.op.name in views and isinstance(call.args[1], relax.Var):
            return views[call.op.name](call.args[0], relax.ShapeExpr(call.args[1].ty.values))
        return call


def static_view_shapes(composite: relax.Function) -> relax.Function:
    """A reshape or broadcast_to with a symbolic target shape takes it as an R.Shape parameter once
    fused, and TVM cannot legalize one to a parameter: spell the shape out from the result's type (in
    the symbolic vars the tensor parameters define). The kernels ignore those parameters anyway."""
    return _ViewShapesFromTypes().visit_expr(composite)


def offload_for_cpu(mod: tvm.IRModule, **options) -> tuple[tvm.IRModule, tvm.IRModule]:
    """-> (partitioned+lifted module, rewritten module) with no kernels compiled: offload_pipeline's
    passes before partitioning and after codegen (broadcasts of what stays in TVM made explicit,
    its 16-bit matmuls and convolutions summed in float32) run as the pipeline runs them."""
    partitioned = partition_for_cpu(mod, *([options["arch"]] if "arch" in options else []))
    rewritten = relax_cutlass.transform.CutlassCodegen(compile=False, **options)(partitioned)
    for rewrite in post_codegen_passes():
        rewritten = rewrite(rewritten)
    return partitioned, rewritten


def partition_for_cpu(mod: tvm.IRModule, *arch: str) -> tvm.IRModule:
    """The partitioned and lifted module of `mod` (for `arch`, if given), after the rewrites that
    offload_pipeline runs before partitioning."""
    return partition_as_offloaded(mod, *arch)


def offload_pipeline_on_cpu(mod: tvm.IRModule, arch: str = "sm_90a", **options) -> tvm.IRModule:
    """`relax_cutlass.offload_pipeline(arch, compile=False, **options)` of `mod`, each extern
    served on the CPU by its region's composite (partitioned for the same arch): the module the
    pipeline gives `tvm.compile`, runnable here."""
    serve_regions_on_cpu(partition_for_cpu(mod, arch))
    return relax_cutlass.offload_pipeline(arch, compile=False, **options)(mod)


def compare_on_cpu(mod: tvm.IRModule, inputs: list[np.ndarray], rtol: float = 1e-2, **options):
    """Offload `mod`, run both versions on CPU, assert they agree; returns (expected, got, rewritten).
    The untouched module's 16-bit matmuls and convolutions sum in float32 there, as the kernels
    (and the composites serving them) do, not in their 16-bit out_dtype as TVM's llvm build would."""
    expected = run_vm(build_cpu(AccumulateInFloat32()(mod)), inputs)
    partitioned, rewritten = offload_for_cpu(mod, **options)
    serve_regions_on_cpu(partitioned)
    got = run_vm(build_cpu(rewritten), inputs)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert within(got, expected, rtol), f"relative error {rel_error(got, expected):.3e} > {rtol}"
    return expected, got, rewritten


def op_names(mod: tvm.IRModule) -> list[str]:
    """The operator names of every call in `mod`'s main function, in post order."""
    names = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            names.append(e.op.name)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return names


def random_inputs(mod: tvm.IRModule, seed: int = 0, **dims: int) -> list[np.ndarray]:
    """Random (never zero-filled) inputs for main's parameters; symbolic dims taken from `dims`."""
    rng = np.random.default_rng(seed)
    arrays = []
    for p in mod["main"].params:
        shape = [int(d) if hasattr(d, "value") else dims[str(d)] for d in p.ty.shape.values]
        arrays.append(rng.uniform(-1, 1, size=shape).astype(str(p.ty.dtype)))
    return arrays


def gpu_available() -> bool:
    """An NVIDIA GPU is visible (nvidia-smi lists one)."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def small_transformer(family: str, attn_implementation: str = "sdpa", layers: int = 2):
    """A random-init transformers model of `family` ("bert", "gpt2", "llama": grouped-query, 4
    heads over 2 kv heads), hidden 128 and vocabulary 512, eval mode; the token-id models of the
    CPU tests."""
    import transformers

    if family == "bert":
        config = transformers.BertConfig(
            hidden_size=128, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=256,
            vocab_size=512, attn_implementation=attn_implementation,
        )  # fmt: skip
        return transformers.BertModel(config, add_pooling_layer=False).eval()
    if family == "gpt2":
        config = transformers.GPT2Config(
            n_embd=128, n_layer=layers, n_head=4, vocab_size=512, bos_token_id=0, eos_token_id=0,
            attn_implementation=attn_implementation,
        )  # fmt: skip
        return transformers.GPT2Model(config).eval()
    config = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=layers, vocab_size=512, attn_implementation=attn_implementation,
    )  # fmt: skip
    return transformers.LlamaModel(config).eval()
