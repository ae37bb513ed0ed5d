"""`from_onnx`: an ONNX model imported the way `from_torch` imports a PyTorch one.

TVM's ONNX frontend (`tvm.relax.frontend.onnx.from_onnx`) does the import; this module works
around the forms real exports contain that it cannot import (each a small rewrite of the ONNX graph,
named for the TVM failure it avoids), names the node an import cannot convert, and then applies what
`from_torch` applies: weights bound, TVM's CUDA-build fixes, NHWC, 16-bit compute summed in float32.
"""

from __future__ import annotations

from os import PathLike

import numpy as np
import tvm

from .frontend import SUPPORTED_DTYPES, require_shapes
from .prepare import fold_weights, to_float16
from .rewrites.canonicalize import FixTvmCudaForms, UnbroadcastWeights
from .rewrites.shapes import BoundSymbolicShapes

__all__ = ["fold_constant_of_shape", "from_onnx"]


def _onnx():
    try:
        import onnx
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("relax_cutlass.from_onnx needs onnx: pip install 'relax_cutlass[models]'") from err
    return onnx


def _constant_values(graph, names: set[str], onnx) -> dict[str, np.ndarray]:
    """Tensor name -> value for those of `names` that are initializers or Constant node outputs
    (only those are read: a model's initializers are its weights)."""
    values = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer if init.name in names}
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] in names:
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = onnx.numpy_helper.to_array(attr.t)
    return values


def fold_constant_of_shape(model):
    """Every ConstantOfShape whose shape input is a constant becomes a Constant node holding the
    filled tensor (in a copy of `model`, made only when there is one; the input is left as it is).

    TVM 0.27's converter broadcasts the one-element fill value to the shape, which fails for an
    empty shape, the scalar result ("broadcast_to expects the input shape to have the number of ndim
    at least as the input tensor's"): torch.onnx's export of transformers' attention-mask code holds
    such nodes, so a BERT given an attention_mask did not import."""
    onnx = _onnx()
    shapes = {n.input[0] for n in model.graph.node if n.op_type == "ConstantOfShape" and n.input}
    constants = _constant_values(model.graph, shapes, onnx)
    if not constants:
        return model
    folded = onnx.ModelProto()
    folded.CopyFrom(model)  # no serialization: no 2 GB protobuf limit
    nodes = []
    for node in folded.graph.node:
        shape = constants.get(node.input[0]) if node.op_type == "ConstantOfShape" and node.input else None
        if shape is None:
            nodes.append(node)
            continue
        fill = np.zeros(1, np.float32)
        for attr in node.attribute:
            if attr.name == "value":
                fill = onnx.numpy_helper.to_array(attr.t).reshape(-1)
        value = np.full([int(d) for d in np.asarray(shape).reshape(-1)], fill[0], dtype=fill.dtype)
        nodes.append(
            onnx.helper.make_node(
                "Constant", [], [node.output[0]], name=node.name, value=onnx.numpy_helper.from_array(value)
            )
        )
    del folded.graph.node[:]
    folded.graph.node.extend(nodes)
    return folded


def _unconvertible(model) -> list[str]:
    """'name (op type)' of each node TVM's ONNX frontend has no converter for."""
    # TVM lists its converters only through this private helper; the import would fail on the first
    # such node with a message that does not name it.
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    known = _get_convert_map()
    return [f"{node.name or '(unnamed)'} ({node.op_type})" for node in model.graph.node if node.op_type not in known]


def _failing_node(err: BaseException) -> str | None:
    """'name (op type)' of the ONNX node TVM's frontend was converting when `err` was raised: the
    innermost frame of its node loop holds it (`node`), the only place the frontend keeps it."""
    found, tb = None, err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_construct_nodes":
            node = tb.tb_frame.f_locals.get("node")
            found = node if hasattr(node, "op_type") else found
        tb = tb.tb_next
    return None if found is None else f"{found.name or '(unnamed)'} ({found.op_type})"


def from_onnx(
    model,
    shapes: dict[str, list] | None = None,
    dtype: str = "float16",
    convert_layout: bool = True,
) -> tvm.IRModule:
    """An ONNX model (a ModelProto or a path to a .onnx file) -> the Relax module `from_torch` would
    give: weights bound as constants, NHWC convolutions (`convert_layout=False` keeps NCHW), `dtype`
    ("float16" or "bfloat16") compute with matmuls and convolutions summed in float32; inputs and
    outputs stay as the model declares them.

    `shapes` maps input names to shapes; without it the model's own shapes are used, its named
    dimensions (dim_params) becoming symbolic. Returns the module, ready for
    `relax_cutlass.offload_pipeline(...)` or TVM's own build.
    """
    onnx = _onnx()
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"from_onnx: dtype {dtype!r} is not supported; use one of {SUPPORTED_DTYPES}")
    if isinstance(model, (str, PathLike)):
        model = onnx.load(str(model))
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"from_onnx: expected an onnx.ModelProto or a path to a .onnx file, got {type(model).__name__}")
    missing = _unconvertible(model)
    if missing:
        raise NotImplementedError(
            f"from_onnx: TVM's ONNX frontend has no converter for {', '.join(missing[:5])}"
            f"{f' and {len(missing) - 5} more' if len(missing) > 5 else ''}; export the model without "
            "that op (another opset, or replace the module that emits it), or import it with "
            "tvm.relax.frontend.onnx.from_onnx and a converter of your own, then lower it with "
            "relax_cutlass.prepare.to_float16"
        )
    from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

    model = fold_constant_of_shape(model)
    try:
        mod = tvm_from_onnx(model, shape_dict=shapes, keep_params_in_input=False)
    except Exception as err:
        first = (str(err).strip().splitlines() or ["no message"])[0][:300]
        node = _failing_node(err)
        where = f"on node {node}" if node else "to import the model"
        raise RuntimeError(
            f"from_onnx: TVM's ONNX frontend failed {where} ({type(err).__name__}: {first}); export the "
            "model so that this node takes another form (another opset, or replace the module that emits it), "
            "or import it with tvm.relax.frontend.onnx.from_onnx and a converter of your own, then lower it "
            "with relax_cutlass.prepare.to_float16"
        ) from err
    mod = FixTvmCudaForms()(mod)
    require_shapes(mod, "from_onnx")
    # Input-free subgraphs (GPT-2's causal mask: tril of a constant, its diagonal offset a PrimValue
    # that TVM 0.27's ToMixedPrecision cannot type) folded before the 16-bit lowering; as in
    # to_float16, shapes made exact and broadcast weights undone before anything is folded.
    mod = fold_weights(UnbroadcastWeights()(BoundSymbolicShapes()(mod)))
    try:
        return to_float16(mod, dtype, convert_layout=convert_layout, accumulate_in_float32=True)
    except Exception as err:
        first = (str(err).strip().splitlines() or ["no message"])[0][:300]
        raise RuntimeError(
            f"from_onnx: lowering the imported module to {dtype} failed ({type(err).__name__}: {first}); "
            "the float32 import succeeded: tvm.relax.frontend.onnx.from_onnx(model, keep_params_in_input=False) "
            "gives it, which TVM can build as it is"
        ) from err
