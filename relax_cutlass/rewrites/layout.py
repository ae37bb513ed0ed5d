"""ConvertToNHWC: bring NCHW models (PyTorch, ONNX) to the NHWC/OHWI layout CUTLASS convolutions use.

TVM's `ConvertLayout` rewrites every conv2d to NHWC activations and OHWI filters and carries the
new layout through the layout-agnostic ops between convolutions (bias add, relu, residual add,
pooling), so only the model's input and output are transposed at run time. With the weights bound
as constants (`bind_params_by_name`), `FoldConstant` then applies the filter transposes once, at
compile time. Batch norm is folded into the preceding convolution first, so a conv + bn + relu
becomes one conv + bias + relu region.

`ConvertLayout` asks every op of a function for its layout rule, not only the ops downstream of a
convolution, and some of TVM 0.27's rules are broken (see `_LAYOUT_SAFE_FORMS`): those ops are
first rewritten into equivalent forms whose rules work. Any other failure leaves that function
unconverted (NCHW, its convolutions in TVM) instead of failing the pipeline; the reason is kept
under the module attribute `relax_cutlass.layout_skipped`, which `offload_report` shows.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..kinds.ir import json_attr
from ..kinds.nhwc import CONV2D_LAYOUTS
from .fold import FoldWeightsInNumpy
from .permutes import SinkLayoutPermutes

LAYOUT_SKIPPED_ATTR = "relax_cutlass.layout_skipped"


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.ConvertToNHWC")
class ConvertToNHWC:
    """conv2d -> NHWC/OHWI, batch norm folded into convolutions, constant filters re-laid out once.

    A no-op on modules without conv2d. Filters that are function parameters (weights not bound)
    keep a per-inference transpose: bind them first to avoid it. Each function is converted on its
    own; one that TVM fails to convert is left as it was and named, with the error, under the
    module attribute `relax_cutlass.layout_skipped` ({function: reason}).
    """

    def __init__(self, fold_batch_norm: bool = True):
        self.fold_batch_norm = fold_batch_norm

    def passes(self, entry: str) -> list[tvm.transform.Pass]:
        # FoldConstant between the two: ConvertLayout must see the folded filters (it crashes on
        # the unfolded multiply that FoldBatchnormToConv2D leaves in TVM 0.27).
        passes = (
            [relax.transform.FoldBatchnormToConv2D(), FoldWeightsInNumpy(), relax.transform.FoldConstant()]
            if self.fold_batch_norm
            else []
        )
        layouts = [CONV2D_LAYOUTS["data_layout"], CONV2D_LAYOUTS["kernel_layout"]]
        return passes + [
            _LayoutSafeForms(),
            relax.transform.ConvertLayout({"relax.nn.conv2d": layouts}),
            FoldWeightsInNumpy(),
            relax.transform.FoldConstant(),
            # the model's own NCHW <-> NHWC permutes (ConvNeXt) meet ConvertLayout's and cancel
            SinkLayoutPermutes(),
            # ConvertLayout transposes a tensor once per NHWC consumer (e.g. a block input feeding
            # both a conv and a residual add): keep one.
            relax.transform.EliminateCommonSubexpr(),
            relax.transform.DeadCodeElimination(entry_functions=[entry]),
        ]

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        before = layout_skipped(mod)
        skipped, converted = dict(before), {}
        for gv, func in mod.functions_items():
            if not (isinstance(func, relax.Function) and _has_conv2d(func)):
                continue
            skipped.pop(gv.name_hint, None)
            # The function alone: DCE must neither keep nor drop the module's other functions.
            sub = tvm.IRModule({gv: func}, attrs=mod.attrs, global_infos=mod.global_infos)
            for p in self.passes(gv.name_hint):
                try:
                    sub = p(sub)
                except Exception as err:  # any TVM failure: this function stays in NCHW
                    first = (str(err).strip().splitlines() or [""])[0]
                    skipped[gv.name_hint] = f"TVM's {p.info.name} failed: {type(err).__name__}: {first}"
                    break
            else:
                converted[gv] = sub[gv]
        if not converted and skipped == before:
            return mod
        functions = {gv: converted.get(gv, func) for gv, func in mod.functions_items()}
        out = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
        if skipped or before:
            out = out.with_attr(LAYOUT_SKIPPED_ATTR, json.dumps(skipped))
        return out


def layout_skipped(mod: tvm.IRModule) -> dict[str, str]:
    """{function: why ConvertToNHWC left its convolutions in NCHW} from the module attribute."""
    return json_attr(mod, LAYOUT_SKIPPED_ATTR, {})


def _has_conv2d(func: relax.Function) -> bool:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.nn.conv2d":
            found.append(expr)

    relax.analysis.post_order_visit(func.body, visit)
    return bool(found)


def _clip_as_min_max(call: relax.Call) -> relax.Expr:
    """clip(x, lo, hi) -> minimum(maximum(x, lo), hi): TVM 0.27's ConvertLayout has no layout rule
    for clip and would wrap it (e.g. inside a hardswish) in transposes back to NCHW; the
    elementwise binary ops it does know carry NHWC through."""
    x, low, high = call.args
    dtype = str(x.ty.dtype)
    low, high = (relax.const(float(bound.value), dtype) for bound in (low, high))
    return relax.op.minimum(relax.op.maximum(x, low), high)


def _squeeze_nonnegative_axes(call: relax.Call) -> relax.Expr:
    """squeeze(x, axis=[-2]) -> squeeze(x, axis=[ndim - 2]): TVM 0.27's squeeze layout rule
    (InferLayoutSqueeze) indexes a std::string with the raw axis, so a negative one writes out of
    bounds, typically ending in std::bad_alloc. nn.MultiheadAttention's packed q/k/v projection
    (every torch ViT) exports squeeze(-2)."""
    ndim = call.args[0].ty.ndim
    axis = call.attrs.axis
    if axis is None or ndim < 0 or all(int(a) >= 0 for a in axis):
        return call
    return relax.op.squeeze(call.args[0], [int(a) % ndim for a in axis])


def _stack_as_concat(call: relax.Call) -> relax.Expr:
    """stack(xs, axis) -> concat([expand_dims(x, axis) ...], axis): TVM 0.27's stack layout rule
    (InferLayoutStack) fails on every stack (an index error), the rules of these two work."""
    tensors = call.args[0]
    fields = tensors.fields if isinstance(tensors, relax.Tuple) else None
    if fields is None:
        fields = [relax.TupleGetItem(tensors, i) for i in range(len(tensors.ty.fields))]
    ndim = call.ty.ndim
    if ndim < 0:
        return call
    axis = int(call.attrs.axis) % ndim if call.attrs.axis is not None else 0
    return relax.op.concat([relax.op.expand_dims(x, [axis]) for x in fields], axis=axis)


# Ops whose ConvertLayout rule is missing or broken in TVM 0.27 -> an equivalent form whose rule works.
_LAYOUT_SAFE_FORMS: dict[str, Callable[[relax.Call], relax.Expr]] = {
    "relax.clip": _clip_as_min_max,
    "relax.squeeze": _squeeze_nonnegative_axes,
    "relax.stack": _stack_as_concat,
}


@mutator
class _LayoutSafeRewriter(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name in _LAYOUT_SAFE_FORMS:
            return _LAYOUT_SAFE_FORMS[call.op.name](call)
        return call


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.LayoutSafeForms")
class _LayoutSafeForms:
    """Rewrite the ops of `_LAYOUT_SAFE_FORMS` so that ConvertLayout can run over the function."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        functions = {
            gv: _LayoutSafeRewriter(mod).visit_expr(func) if isinstance(func, relax.Function) else func
            for gv, func in mod.functions_items()
        }
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
