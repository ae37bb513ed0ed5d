"""Conv1dAsConv2d: 1-D convolutions as 2-D ones of height 1, which the conv2d kind offloads.

Speech encoders start with 1-D convolutions over the audio (Whisper's two-layer stem, Wav2Vec2's
and HuBERT's seven-layer feature encoder, most of their FLOPs for short clips); no region kind
knows conv1d, so they stayed in TVM, unreported. conv1d(x (N, C, W), w (O, I, K)) is
conv2d(x (N, C, 1, W), w (O, I, 1, K)) with strides, padding and dilation 1 / 0 along the new
height, squeezed back. The squeeze is moved past the elementwise ops that follow (the float32
accumulation's cast, the bias add, the activation), so those fuse into the conv's epilogue; each
value keeps its 3-D twin for any other reader (unused ones are removed).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..kinds.ir import is_call
from ..kinds.nhwc import conv1d_refusal
from .canonicalize import relax_functions

# Ops computed on the 4-D value the same way as on the 3-D one: elementwise in their first operand.
_UNARY = (
    "relax.astype",
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.nn.relu",
    "relax.nn.silu",
    "relax.sigmoid",
    "relax.tanh",
)
_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def _conv2d_of(call: relax.Call, data: relax.Expr, weight: relax.Expr) -> relax.Expr:
    a = call.attrs
    return relax.op.nn.conv2d(
        relax.op.expand_dims(data, [2]),
        relax.op.expand_dims(weight, [2]),
        strides=(1, int(a.strides[0])),
        padding=(0, int(a.padding[0]), 0, int(a.padding[1])),
        dilation=(1, int(a.dilation[0])),
        groups=int(a.groups),
        data_layout="NCHW",
        kernel_layout="OIHW",
        out_dtype=None if a.out_dtype is None or str(a.out_dtype) in ("", "None", "void") else str(a.out_dtype),
    )


def _as_4d(operand: relax.Expr) -> relax.Expr | None:
    """An operand broadcast against (N, C, W), as the same broadcast against (N, C, 1, W)."""
    rank = getattr(operand.ty, "ndim", -1)
    if rank == 0:
        return operand
    if rank < 1 or rank > 3:
        return None
    return relax.op.expand_dims(operand, [rank - 1])


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    def __init__(self):
        super().__init__()
        self.wide: dict = {}  # a 3-D value of the rewritten function -> its (N, C, 1, W) twin

    def visit_var_binding_(self, binding):
        value = binding.value
        wide = None
        if is_call(value, "relax.nn.conv1d") and conv1d_refusal(value) is None:
            wide = _conv2d_of(value, self.visit_expr(value.args[0]), self.visit_expr(value.args[1]))
        elif isinstance(value, relax.Call) and getattr(binding.var.ty, "ndim", -1) == 3:
            wide = self._follow(value, [self.visit_expr(a) for a in value.args])
        if wide is None:
            super().visit_var_binding_(binding)
            return
        twin = self.builder_.emit(wide)
        narrow = self.builder_.emit(relax.op.squeeze(twin, [2]))
        self.wide[narrow] = twin
        self.set_var_remap(binding.var, narrow)

    def _follow(self, call: relax.Call, args: list) -> relax.Expr | None:
        """`call` on the 4-D twins of its operands, where one is known and the op is elementwise."""
        if not isinstance(call.op, tvm.ir.Op) or not any(a in self.wide for a in args[:2]):
            return None
        name = call.op.name
        if name in _UNARY and args[0] in self.wide:
            return relax.Call(call.op, [self.wide[args[0]], *args[1:]], call.attrs, call.ty_args)
        if name in _BINARY:
            operands = [self.wide[a] if a in self.wide else _as_4d(a) for a in args]
            if None not in operands:
                return relax.Call(call.op, operands, call.attrs, call.ty_args)
        return None


def conv1d_as_conv2d(func: relax.Function) -> relax.Function:
    """Every NCW/OIW conv1d of `func` as a conv2d of height 1 (see the module docstring)."""
    found = []
    relax.analysis.post_order_visit(func.body, lambda e: found.append(e) if is_call(e, "relax.nn.conv1d") else None)
    if not found:
        return func
    return relax.analysis.remove_all_unused(_Widen().visit_expr(func))


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.Conv1dAsConv2d")
class Conv1dAsConv2d:
    """conv1d -> conv2d of height 1 in every Relax function that is not an offloaded region."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return relax_functions(mod, conv1d_as_conv2d)
