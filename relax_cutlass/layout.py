"""ConvertToNHWC: bring NCHW models (PyTorch, ONNX) to the NHWC/OHWI layout CUTLASS convolutions use.

TVM's `ConvertLayout` rewrites every conv2d to NHWC activations and OHWI filters and carries the
new layout through the layout-agnostic ops between convolutions (bias add, relu, residual add,
pooling), so only the model's input and output are transposed at run time. With the weights bound
as constants (`bind_params_by_name`), `FoldConstant` then applies the filter transposes once, at
compile time. Batch norm is folded into the preceding convolution first, so a conv + bn + relu
becomes one conv + bias + relu region.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .patterns import CONV2D_LAYOUTS


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.ConvertToNHWC")
class ConvertToNHWC:
    """conv2d -> NHWC/OHWI, batch norm folded into convolutions, constant filters re-laid out once.

    A no-op on modules without conv2d. Filters that are function parameters (weights not bound)
    keep a per-inference transpose: bind them first to avoid it.
    """

    def __init__(self, fold_batch_norm: bool = True):
        self.fold_batch_norm = fold_batch_norm

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if not _has_conv2d(mod):
            return mod
        # FoldConstant between the two: ConvertLayout must see the folded filters (it crashes on
        # the unfolded multiply that FoldBatchnormToConv2D leaves in TVM 0.27).
        passes = (
            [relax.transform.FoldBatchnormToConv2D(), relax.transform.FoldConstant()] if self.fold_batch_norm else []
        )
        layouts = [CONV2D_LAYOUTS["data_layout"], CONV2D_LAYOUTS["kernel_layout"]]
        passes += [
            _ClipAsMinMax(),
            relax.transform.ConvertLayout({"relax.nn.conv2d": layouts}),
            relax.transform.FoldConstant(),
            # ConvertLayout transposes a tensor once per NHWC consumer (e.g. a block input feeding
            # both a conv and a residual add): keep one.
            relax.transform.EliminateCommonSubexpr(),
            relax.transform.DeadCodeElimination(),
        ]
        return tvm.transform.Sequential(passes)(mod)


def _has_conv2d(mod: tvm.IRModule) -> bool:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.nn.conv2d":
            found.append(expr)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return bool(found)


@mutator
class _ClipRewriter(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.clip"):
            return call
        x, low, high = call.args
        dtype = str(x.ty.dtype)
        low, high = (relax.const(float(bound.value), dtype) for bound in (low, high))
        return relax.op.minimum(relax.op.maximum(x, low), high)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.ClipAsMinMax")
class _ClipAsMinMax:
    """clip(x, lo, hi) -> minimum(maximum(x, lo), hi): TVM 0.27's ConvertLayout has no layout rule
    for clip and would wrap it (e.g. inside a hardswish) in transposes back to NCHW; the
    elementwise binary ops it does know carry NHWC through."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        functions = {
            gv: _ClipRewriter(mod).visit_expr(func) if isinstance(func, relax.Function) else func
            for gv, func in mod.functions_items()
        }
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
