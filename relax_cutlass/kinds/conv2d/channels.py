"""Convolutions with an odd number of input channels (an RGB stem's C=3), which no CUTLASS
tensor-op kernel reads, padded with zero channels to a multiple of 8: the filter once, at build
time, and the input by a pad that TVM fuses with the ops that produce it (the model input's
layout transpose and cast)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..epilogue_patterns import SUPPORTED_INPUT_DTYPES, dtype_of, shape_dims, static_int

# Input channels are padded to a multiple of this: the 128-bit (8 x 16-bit) accesses of the
# fastest conv kernels.
CHANNEL_ALIGNMENT = 8


def constant_filter_channels(call: relax.Call) -> tuple[int, int, int] | None:
    """(C, K, groups) of an NHWC x OHWI 16-bit conv2d with a constant filter and static channel
    counts, the convs the build-time filter rewrites (here and supergroups.py) take; else None."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
        return None
    attrs, (data, weight) = call.attrs, call.args
    if str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI":
        return None
    if not isinstance(weight, tvm.ir.GenericConst) or len(shape_dims(data)) != 4:
        return None
    if dtype_of(data) not in SUPPORTED_INPUT_DTYPES or dtype_of(weight) != dtype_of(data):
        return None
    c, k = static_int(shape_dims(data)[3]), static_int(shape_dims(weight)[0])
    return None if c is None or k is None else (c, k, int(attrs.groups))


def _paddable(call: relax.Call) -> bool:
    """An ungrouped conv2d of constant_filter_channels' kind, output in the input's type, with C
    odd and K even."""
    channels = constant_filter_channels(call)
    if channels is None or dtype_of(call) != dtype_of(call.args[0]):
        return False
    c, k, groups = channels
    return groups == 1 and c % 2 == 1 and k % 2 == 0


@relax.expr_functor.mutator
class _PadChannels(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not _paddable(call):
            return call
        data, weight = call.args
        c = static_int(shape_dims(data)[3])
        extra = -c % CHANNEL_ALIGNMENT
        filters = weight.value.numpy()
        padded_filters = relax.const(np.pad(filters, ((0, 0), (0, 0), (0, 0), (0, extra))), str(filters.dtype))
        padded_data = self.builder_.emit(relax.op.nn.pad(data, [0, 0, 0, 0, 0, 0, 0, extra]))
        return conv_like(call, padded_data, padded_filters, groups=1)


def conv_like(call: relax.Call, data: relax.Expr, filters: relax.Expr, groups: int) -> relax.Call:
    """An NHWC x OHWI conv2d with `call`'s strides, padding, dilation and types on new operands."""
    a = call.attrs
    return relax.op.nn.conv2d(
        data,
        filters,
        strides=a.strides,
        padding=a.padding,
        dilation=a.dilation,
        groups=groups,
        data_layout="NHWC",
        kernel_layout="OHWI",
        out_layout=str(a.out_layout),
        out_dtype=dtype_of(call),
    )


def pad_odd_input_channels(func: relax.Function) -> relax.Function:
    """conv2d(x, w) with C odd -> conv2d(pad(x), pad(w)), both zero-padded along C to a multiple
    of 8: the zero channels add exact zeros to every sum, so the values are those of the original
    conv, and the conv2d kind's aligned kernels take it. Only constant filters (bound weights: the
    pad happens once, here); a filter passed at run time keeps the conv as it is (the report then
    says the channels are odd)."""
    if not any(
        isinstance(b.value, relax.Call) and _paddable(b.value) for block in func.body.blocks for b in block.bindings
    ):
        return func
    return _PadChannels().visit_expr(func)
