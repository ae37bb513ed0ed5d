"""SinkLayoutPermutes: carry explicit NCHW <-> NHWC permutes through elementwise ops until they cancel.

Models that permute between NCHW and NHWC themselves (ConvNeXt's blocks run their layer norm and
linear layers channels-last, its `LayerNorm2d` wraps a layer norm in two permutes) keep those
permutes after `ConvertToNHWC`: TVM's ConvertLayout makes every conv NHWC and leaves the model's
own permutes as they were. Each one is a full-tensor transpose at run time, and around each block
there are pairs that undo each other with elementwise ops between them (ConvNeXt-tiny: 0.9 ms of
its 4.4 ms at batch 32 on an H200 were such transposes and the layer-scale multiply-adds between
them). This pass moves a layout permute past the elementwise ops that consume it and composes it
with the next permute:

    permute(permute(x, p), q)         -> permute(x, p . q), or x when that is the identity
    f(permute(x, p))                  -> permute(f(x), p)             f unary elementwise
    f(permute(x, p), permute(y, p))   -> permute(f(x, y), p)          f binary elementwise
    f(permute(x, p), c), f(c, ...)    -> permute(f(x, c'), p)         c a constant, c' = c permuted back

Values are unchanged (the same elementwise ops on the same elements); a permute only ever replaces
the one it came from, so no transpose is added. Only the two 4-D layout permutes (and identity
permutes) move: attention's head permutes and anything else stay where the model put them.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from ..kinds.ir import rewrite_planned_bindings, static_shape, view_of_index

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)
LAYOUT_PERMUTES = (NCHW_TO_NHWC, NHWC_TO_NCHW)

UNARY_ELEMENTWISE = (
    "relax.astype",
    "relax.nn.relu",
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.nn.silu",
    "relax.sigmoid",
    "relax.tanh",
    "relax.negative",
    "relax.exp",
    "relax.sqrt",
    "relax.rsqrt",
)
BINARY_ELEMENTWISE = (
    "relax.add",
    "relax.subtract",
    "relax.multiply",
    "relax.divide",
    "relax.maximum",
    "relax.minimum",
)
MAX_ROUNDS = 16


def _axes(call: relax.Expr) -> tuple[int, ...] | None:
    """The axes of a permute_dims call with a known rank (None: a reversal of unknown rank, or not
    a call: rewrite_call also hands over variables bound to a matched call, `gv = lv`)."""
    if not isinstance(call, relax.Call) or call.attrs.axes is None:
        return None
    ndim = call.args[0].ty.ndim
    return tuple(int(a) % ndim for a in call.attrs.axes)


def _layout_axes(expr: relax.Expr) -> tuple[int, ...] | None:
    axes = _axes(expr) if isinstance(expr, relax.Call) else None
    return axes if axes in LAYOUT_PERMUTES else None


def _inverse(axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(axes))


def _permuted_back(const: tvm.ir.GenericConst, axes: tuple[int, ...]) -> relax.Expr | None:
    """c' with f(permute(x, axes), c) == permute(f(x, c'), axes), or None for a rank above 4."""
    value = const.value.numpy()
    if value.ndim == 0:
        return const
    if value.ndim > len(axes):
        return None
    full = value.reshape((1,) * (len(axes) - value.ndim) + value.shape)
    return relax.const(np.ascontiguousarray(np.transpose(full, _inverse(axes))), str(value.dtype))


def _compose_permutes(func: relax.Function) -> relax.Function:
    x = wildcard()
    inner = is_op("relax.permute_dims")(x)
    outer = is_op("relax.permute_dims")(inner)
    identity = is_op("relax.permute_dims")(wildcard())

    def compose(orig: relax.Expr, m: dict) -> relax.Expr:
        first, second = _axes(m[inner]), _axes(orig)
        if first is None or second is None or (_layout_axes(m[inner]) is None and _layout_axes(orig) is None):
            return orig
        axes = tuple(first[a] for a in second)
        return m[x] if axes == tuple(range(len(axes))) else relax.op.permute_dims(m[x], list(axes))

    def drop_identity(orig: relax.Expr, _m: dict) -> relax.Expr:
        axes = _axes(orig)
        return orig.args[0] if axes is not None and axes == tuple(range(len(axes))) else orig

    func = rewrite_call(outer, compose, func)
    return rewrite_call(identity, drop_identity, func)


def _sink_through_unary(func: relax.Function) -> relax.Function:
    x = wildcard()
    permuted = is_op("relax.permute_dims")(x)
    pattern = is_op(UNARY_ELEMENTWISE[0])(permuted)
    for op in UNARY_ELEMENTWISE[1:]:
        pattern |= is_op(op)(permuted)

    def sink(orig: relax.Call, m: dict) -> relax.Expr:
        axes = _layout_axes(m[permuted])
        if axes is None or not isinstance(orig, relax.Call):
            return orig
        inner = relax.Call(orig.op, [m[x], *orig.args[1:]], orig.attrs)
        return relax.op.permute_dims(inner, list(axes))

    return rewrite_call(pattern, sink, func)


def _sink_through_binary(func: relax.Function) -> relax.Function:
    x, y = wildcard(), wildcard()
    left, right = is_op("relax.permute_dims")(x), is_op("relax.permute_dims")(y)
    const = is_const()
    forms = [(left, right), (left, const), (const, right)]
    pattern = None
    for op in BINARY_ELEMENTWISE:
        for a, b in forms:
            pattern = is_op(op)(a, b) if pattern is None else pattern | is_op(op)(a, b)

    def sink(orig: relax.Call, m: dict) -> relax.Expr:
        # the matched operands (orig's own args are the variables bound to them)
        a = m[left] if left in m else m[const]
        b = m[right] if right in m else m[const]
        axes_a = _layout_axes(a) if left in m else None
        axes_b = _layout_axes(b) if right in m else None
        if not isinstance(orig, relax.Call) or orig.ty.ndim != 4:
            return orig
        if axes_a is not None and axes_b is not None:
            if axes_a != axes_b:
                return orig
            args, axes = [m[x], m[y]], axes_a
        elif axes_a is not None and const in m:
            back = _permuted_back(b, axes_a)
            if back is None:
                return orig
            args, axes = [m[x], back], axes_a
        elif axes_b is not None and const in m:
            back = _permuted_back(a, axes_b)
            if back is None:
                return orig
            args, axes = [back, m[y]], axes_b
        else:
            return orig
        return relax.op.permute_dims(relax.Call(orig.op, args, orig.attrs), list(axes))

    return rewrite_call(pattern, sink, func)


def sink_layout_permutes(func: relax.Function) -> relax.Function:
    """`func` with its layout permutes sunk through elementwise ops and composed (module docstring)."""
    for _ in range(MAX_ROUNDS):
        before = func
        func = _compose_permutes(_sink_through_binary(_sink_through_unary(_compose_permutes(func))))
        if before.same_as(func):
            break
    return func


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.SinkLayoutPermutes")
class SinkLayoutPermutes:
    """`sink_layout_permutes` on every Relax function of the module (dead permutes stay for DCE)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        functions = {
            gv: sink_layout_permutes(func) if isinstance(func, relax.Function) else func
            for gv, func in mod.functions_items()
        }
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def collapse_view_chains(func: relax.Function, max_elements: int = 1 << 26) -> relax.Function:
    """Chains of reshapes and permutes (each but the last read by nothing else) that leave the
    elements in their order -> one reshape (no copy): a permute to NCHW, a flatten and a permute
    back to tokens, as ViT's patch embedding writes them, is a reshape of the NHWC patches."""
    var2val = relax.analysis.get_var2val(func)
    counts: dict = {}
    for value in var2val.values():
        for arg in getattr(value, "args", []):
            if isinstance(arg, relax.Var):
                counts[arg] = counts.get(arg, 0) + 1

    def is_view(value) -> bool:
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return False
        if value.op.name not in ("relax.reshape", "relax.permute_dims"):
            return False
        shape = getattr(value.ty, "shape", None)
        return shape is not None and all(isinstance(d, tvm.tirx.IntImm) for d in shape.values)

    plan = {}
    for var, value in var2val.items():
        if not is_view(value):
            continue
        chain, expr = [], var
        while isinstance(expr, relax.Var) and is_view(var2val.get(expr)) and (expr is var or counts.get(expr) == 1):
            chain.append(var2val[expr])
            expr = var2val[expr].args[0]
        dims = static_shape(expr)
        if len(chain) < 2 or dims is None or not 0 < int(np.prod(dims)) <= max_elements:
            continue
        index = np.arange(int(np.prod(dims)), dtype=np.int64).reshape(dims)
        for call in reversed(chain):
            index = view_of_index(index, call) if index is not None else None
        if index is not None and np.array_equal(index.reshape(-1), np.arange(index.size)):
            plan[var] = expr
    if not plan:
        return func

    def reshape(mutator, binding, source):
        return mutator.builder_.emit(relax.op.reshape(mutator.visit_expr(source), binding.var.ty.shape))

    return rewrite_planned_bindings(func, plan, reshape)
