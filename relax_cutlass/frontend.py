"""from_torch: a PyTorch model and example inputs -> a bound, 16-bit, offload-ready IRModule.

The path a new user tries first, `model.half()` then torch.export, fails inside TVM's frontend
(its batch_norm and addmm converters check for float32). The path that works is the usual TVM
flow: export in float32, import with `from_exported_program`, bind the weights as constants, then
lower to float16 (or bfloat16) on the Relax side. This module is that path as one call.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import tvm

from .prepare import to_float16

__all__ = ["from_torch", "import_float32"]

SUPPORTED_DTYPES = ("float16", "bfloat16")


def _example_tuple(example_inputs: Any, example_kwargs: Mapping | None, torch, caller: str) -> tuple:
    """The forward's positional example arguments: a tensor, or a tuple / list of them (one per
    argument). Examples without any tensor (a list of numbers, a numpy array) are refused by name."""
    args = tuple(example_inputs) if isinstance(example_inputs, tuple | list) else (example_inputs,)
    if not any(isinstance(a, torch.Tensor) for a in _leaves((args, dict(example_kwargs or {})))):
        got = type(example_inputs).__name__
        inner = f" of {type(example_inputs[0]).__name__}" if isinstance(example_inputs, tuple | list) and args else ""
        raise TypeError(
            f"{caller}: example_inputs is a {got}{inner} with no torch.Tensor in it; give the forward's example "
            "arguments as a torch.Tensor, or a tuple of them, one per positional argument (a list of numbers "
            "becomes one tensor with torch.tensor(values); a numpy array with torch.from_numpy(array))"
        )
    return args


def _leaves(value: Any):
    """Every value inside nested tuples, lists and dicts."""
    if isinstance(value, tuple | list):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


def _check_materialized(model, torch, caller: str) -> None:
    """A model with parameters or buffers on the meta device has no weights to import."""
    meta = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if meta:
        raise ValueError(
            f"{caller}: the model's weights are on the meta device ({len(meta)} tensors, first {meta[0]!r}), so "
            "there is nothing to import; load real weights first (e.g. model.to_empty(device='cpu') then "
            "load_state_dict, or from_pretrained without device_map='meta')"
        )


def _float32(value: Any, torch) -> Any:
    """Floating tensors to float32 (the export dtype); integer ones (token ids, masks) unchanged."""
    if isinstance(value, torch.Tensor):
        return value.detach().float() if value.is_floating_point() else value.detach()
    if isinstance(value, Mapping):
        return {k: _float32(v, torch) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return type(value)(_float32(v, torch) for v in value)
    return value


def _exportable_copy(model, torch):
    """A float32, eval-mode, CPU copy of `model`; the user's model is left untouched.

    A Hugging Face model's key/value cache is switched off: inference without it computes the
    same outputs, and its first step concatenates an empty 1-D tensor with 4-D keys, which
    torch accepts but TVM's concat converter rejects."""
    model = copy.deepcopy(model).float().eval().cpu()
    for module in model.modules():  # the model itself, or one wrapped inside the user's module
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", False):
            config.use_cache = False
    return model


def _import_program(model, args, kwargs, dynamic_shapes, torch, caller: str) -> tvm.IRModule:
    """torch.export of the exportable copy, then TVM's `from_exported_program` (which runs torch's
    decompositions on it). Where that fails and the model uses transformers' "sdpa" attention,
    the copy is switched to its "eager" attention (the same softmax(QK^T + mask)V, decomposed)
    and imported again: GPT-2's sdpa path with a padding mask fails in torch's decompositions (a
    view of the attention output that fake tensors lay out transposed); eager attention imports."""
    from tvm.relax.frontend.torch import from_exported_program

    def attempt() -> tuple[tvm.IRModule | None, tuple[str, Exception] | None]:
        stage = "torch.export"
        try:
            with torch.no_grad():
                exported = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
            stage = "TVM's from_exported_program"
            return from_exported_program(exported, keep_params_as_input=True, custom_convert_map=CONVERTERS), None
        except Exception as err:  # torch.export and the frontend raise many types; reported below
            return None, (stage, err)

    mod, failure = attempt()
    if mod is not None:
        return mod
    relaxed = _dynamic_dims(dynamic_shapes, torch) if "Constraints violated" in str(failure[1]) else None
    if relaxed is not None:
        # torch.export could not prove a guard over a named Dim's whole range (torch 2.11 cannot
        # prove min(32*s, 64*s) == 32*s for a Llama's sequence length): Dim.DYNAMIC with the same
        # bounds lets it narrow the range or keep the guard instead of refusing the export
        strict, dynamic_shapes = dynamic_shapes, relaxed
        mod, second = attempt()
        if mod is not None:
            warnings.warn(
                f"{caller}: torch.export of {type(model).__name__} could not prove a guard over the "
                f"Dims' ranges ({_violations(failure[1])}); exported with "
                "torch.export.Dim.DYNAMIC and the same bounds instead. TVM does not check those guards "
                "at run time: call the module only with sizes the model supports",
                stacklevel=3,
            )
            return mod
        dynamic_shapes, failure = strict, second
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    sdpa = [c for c in configs.values() if getattr(c, "_attn_implementation", None) == "sdpa"]
    for config in sdpa:
        config._attn_implementation = "eager"
    if sdpa and (retried := attempt()[0]) is not None:
        stage, err = failure
        warnings.warn(
            f"{caller}: {stage} of {type(model).__name__} with sdpa attention failed "
            f"({type(err).__name__}: {_first_line(err)}); imported with transformers' eager "
            "attention instead (same values; the user's model is unchanged)",
            stacklevel=3,
        )
        return retried
    stage, err = failure
    raise RuntimeError(
        f"{caller}: {stage} of {type(model).__name__} failed ({type(err).__name__}: {_first_line(err)}). "
        "relax_cutlass imports a float32 CPU copy of the model through torch.export and TVM's "
        "from_exported_program; make the model exportable (torch.export.export(model, example_inputs) "
        "reproduces an export error), or import it yourself and lower it with "
        "relax_cutlass.prepare.bind_float16(mod, weights)"
    ) from err


def _dynamic_dims(dynamic_shapes, torch):
    """`dynamic_shapes` with every named torch.export.Dim replaced by Dim.DYNAMIC with its bounds,
    or None where it names none."""
    dim_type = torch.export.Dim("probe").__class__
    found = []

    def relax_dims(spec):
        if isinstance(spec, dim_type):
            found.append(spec)
            bounds = {k: v for k in ("min", "max") if isinstance(v := getattr(spec, k, None), int)}
            bounds = {k: v for k, v in bounds.items() if 0 <= v < 2**62}  # torch's "no bound" is int_oo
            try:
                return torch.export.Dim.DYNAMIC(**bounds)
            except TypeError:  # a torch whose Dim.DYNAMIC takes no bounds
                return torch.export.Dim.DYNAMIC
        if isinstance(spec, dict):
            return {k: relax_dims(v) for k, v in spec.items()}
        if isinstance(spec, (list, tuple)):
            return type(spec)(relax_dims(v) for v in spec)
        return spec

    relaxed = relax_dims(dynamic_shapes)
    return relaxed if found else None


def _violations(err: BaseException) -> str:
    """torch.export's first unproven guard, as it words it ("Not all values of seq ... satisfy ...")."""
    lines = [line.strip(" -") for line in str(err).splitlines() if "Not all values" in line]
    return lines[0][:300] if lines else _first_line(err)


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0][:300] if lines else "no message"


def _torch_cumsum(node, importer) -> tvm.ir.Expr:
    """torch.cumsum with torch's type promotion: a bool or integer input sums in int64 unless a
    dtype is given. TVM's converter keeps the input dtype, so a cumsum over a bool mask (as
    transformers' packed-sequence check writes it) would saturate at True instead of counting."""
    from tvm import relax

    x = importer.env[node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dtype = node.kwargs.get("dtype")
    source = str(x.ty.dtype)
    if dtype is not None:
        dtype = importer._convert_data_type(str(dtype), importer.env)
    elif source == "bool" or source.startswith(("int", "uint")):
        dtype = "int64"
    if dtype is not None and dtype != source:
        x = importer.block_builder.emit(relax.op.astype(x, dtype))
    return importer.block_builder.emit(relax.op.cumsum(x, dim, dtype))


# The op relax_cutlass.parallel inserts after a row-parallel projection: the sum of its input over the
# tensor-parallel group (torch.library op "relax_cutlass::tensor_parallel_sum").
TENSOR_PARALLEL_SUM = "tensor_parallel_sum"


def _tensor_parallel_sum(node, importer) -> tvm.ir.Expr:
    """relax_cutlass::tensor_parallel_sum -> R.ccl.allreduce (TVM's disco runs it with the group's
    collective backend)."""
    from tvm import relax

    # TVM gives the op no mixed-precision policy, so ToMixedPrecision would sum in float32 and send
    # twice the bytes: it sums in its input's precision, as torch's all-reduce does ("follow").
    if tvm.ir.Op.get("relax.ccl.allreduce").get_attr("TMixedPrecisionPolicy") is None:
        tvm.ir.register_op_attr("relax.ccl.allreduce", "TMixedPrecisionPolicy", 1)
    return importer.block_builder.emit(relax.op.ccl.allreduce(importer.env[node.args[0]], op_type="sum"))


# torch.export names custom ops by "<op>.<overload>", without their namespace
CONVERTERS = {"cumsum.default": _torch_cumsum, f"{TENSOR_PARALLEL_SUM}.default": _tensor_parallel_sum}


def import_float32(
    model,
    example_inputs: Any,
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
    caller: str = "import_float32",
) -> tvm.IRModule:
    """torch.export of a float32 CPU copy of `model` -> `from_exported_program` -> weights bound as
    constants -> `FixTvmCudaForms`: the float32 module `from_torch` lowers to 16 bits, also a
    float32 baseline of its own (scripts/precision_probe.py builds it). Arguments as `from_torch`'s."""
    try:
        import torch
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"relax_cutlass.{caller} needs PyTorch: pip install 'relax_cutlass[models]'") from err
    from tvm import relax

    from .rewrites.canonicalize import FixTvmCudaForms, UnbroadcastWeights

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{caller}: expected a torch.nn.Module, got {type(model).__name__}")
    _check_materialized(model, torch, caller)
    args = _float32(_example_tuple(example_inputs, example_kwargs, torch, caller), torch)
    kwargs = _float32(dict(example_kwargs or {}), torch)
    args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    exportable = _exportable_copy(model, torch)
    mod = _import_program(exportable, args, kwargs, dynamic_shapes, torch, caller)
    # before the weights are bound: a broadcast weight must never become a folded constant
    mod = UnbroadcastWeights()(mod)
    mod, params = relax.frontend.detach_params(mod)
    inputs = len(mod["main"].params) - len(params.get("main", []))
    weights = {p.name: v for p, v in zip(mod["main"].params[inputs:], params.get("main", []), strict=True)}
    mod = relax.transform.BindParams("main", weights)(mod)
    # Forms TVM's own CUDA build gets wrong (values unchanged), so that TVM's build of the module is
    # right too, not only the offloaded one; symbolic shapes made exact under the Dims' bounds.
    mod = FixTvmCudaForms()(mod)
    require_shapes(mod, caller)
    return mod


def require_shapes(mod: tvm.IRModule, caller: str) -> None:
    """Raise where an elementwise op over symbolic dims has no shape, which TVM cannot legalize
    (its FoldConstant would fail with "emit_te now only supports Tensor that has ShapeExpr shape")."""
    from tvm import relax

    from .rewrites.shapes import shapeless_broadcasts

    found = [c for _, f in mod.functions_items() if isinstance(f, relax.Function) for c in shapeless_broadcasts(f)]
    if found:
        raise RuntimeError(
            f"{caller}: TVM infers no shape for {len(found)} elementwise op(s) whose operands' symbolic "
            f"dims it cannot prove equal, first {found[0]}, and cannot build the module. relax_cutlass "
            "proves what the exported Dims' bounds allow (BoundSymbolicShapes); give each torch.export.Dim "
            "the range the model supports (torch.export.Dim('seq', min=2, max=...)), or export those "
            "dims static (no dynamic_shapes)"
        )


def from_torch(
    model,
    example_inputs: Any,
    dtype: str = "float16",
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
    convert_layout: bool = True,
) -> tvm.IRModule:
    """Import a PyTorch module for offloading: torch.export (float32) -> `from_exported_program` ->
    weights bound as constants -> NHWC convolutions with batch norm folded -> `dtype` compute.

    `example_inputs`: a tensor or a tuple of them (token ids stay integer). `dtype`: "float16" or
    "bfloat16". The model may be in any precision and on any device; a float32 CPU copy is
    exported, and the model itself is not changed. The module's inputs and outputs keep the
    framework model's float32 (ToMixedPrecision casts at the edges), so it is fed the same
    arrays as the PyTorch model. `dynamic_shapes` is passed to torch.export (symbolic batch or
    sequence); the Dims' ranges (min, max) make the symbolic shapes exact where TVM's inference
    alone cannot (`BoundSymbolicShapes`), and the module serves the sizes within them.
    `convert_layout=False` keeps NCHW convolutions (they then stay in TVM).

    Returns the module, ready for `relax_cutlass.offload_pipeline(...)` or TVM's own build.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"from_torch: dtype {dtype!r} is not supported; use one of {SUPPORTED_DTYPES}")
    mod = import_float32(
        model, example_inputs, example_kwargs=example_kwargs, dynamic_shapes=dynamic_shapes, caller="from_torch"
    )
    # Matmuls and convolutions sum in float32, as torch's do: TVM sums in the out_dtype, and a Llama
    # summed in float16 is 3.8e-2 from float32 where torch's own fp16 is 1e-2.
    return to_float16(mod, dtype, convert_layout=convert_layout, accumulate_in_float32=True)
