"""PatchifyConvs: a patch embedding (a convolution whose kernel is its stride) on a few input channels
as the GEMM it is.

Vision transformers cut the image into patches with conv2d(3 -> E, kernel = stride = p): ViT
16 x 16, Swin and ConvNeXt 4 x 4. Offloaded as a convolution, the three input channels are padded
to eight for the kernels' 16-byte loads, so most of the reduction multiplies zeros, and an
implicit-GEMM main loop over 3-channel filter taps is far from the tensor cores' speed: ViT-B/16's
patch embedding took 0.15 of its 1.33 ms at batch 8 on the H200, for 0.4% of its FLOPs. The
patches do not overlap, so

    conv2d(x, w) [+ b]  ->  permute(matmul(patches(x), W) [+ b], NHWC -> NCHW)

with patches(x) = x (B, C, H, W) viewed as (B, C, H/p, p, W/p, p) and transposed to
(B, H/p, W/p, C, p, p) flattened to K = C*p*p features (one copy, as the NHWC transpose and pad
it replaces), and W = w (E, C, p, p) flattened to (K, E) once at build time (from NHWC / OHWI, as
from_torch gives it: the patches (B, H/p, W/p, p, p, C), no permute after). The GEMM then has
K = 768 (ViT) rather than 2048 padded taps. The views after it that only move the patches back into
rows (ViT's flatten to tokens) collapse to one reshape. Exact up to the order of the sum.

Only where the convolution is that (NCHW / OIHW or NHWC / OHWI, groups 1, no padding or dilation, H and W whole
multiples of the patch, the filter a constant, C below eight and C*p*p a multiple of eight).
Offloaded functions are left alone.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val

from ..kinds.ir import is_call, planned_rewrite, static_int, static_shape, use_counts
from .canonicalize import relax_functions
from .permutes import NHWC_TO_NCHW, collapse_view_chains

# Channels at or above this the conv kernels read without padding: those convolutions stay convs.
ALIGNED_CHANNELS = 8


# data layout -> (kernel layout, the axes of (batch, channels, height, width), the channel axis
# counted from the end)
_LAYOUTS = {"NCHW": ("OIHW", (0, 1, 2, 3), -3), "NHWC": ("OHWI", (0, 3, 1, 2), -1)}


def _patch(call: relax.Call) -> int | None:
    """The patch size of a conv2d that is a patch embedding (see the module), else None."""
    attrs = call.attrs
    data, weight = call.args
    layout = _LAYOUTS.get(str(attrs.data_layout))
    if layout is None or str(attrs.kernel_layout) != layout[0] or int(attrs.groups) != 1:
        return None
    if str(attrs.out_layout) not in (str(attrs.data_layout), "") or not isinstance(weight, tvm.ir.GenericConst):
        return None
    shape, filters = data.ty.shape, static_shape(weight)
    if shape is None or filters is None or len(filters) != 4 or data.ty.ndim != 4:
        return None
    channels, height, width = (static_int(shape.values[a]) for a in layout[1][1:])
    kh, kw = (filters[a] for a in layout[1][2:])
    if None in (channels, height, width) or kh != kw or channels >= ALIGNED_CHANNELS:
        return None
    if [int(s) for s in attrs.strides] != [kh, kw] or any(int(p) for p in attrs.padding):
        return None
    if any(int(d) != 1 for d in attrs.dilation) or height % kh or width % kw or channels * kh * kw % 8:
        return None
    return kh


def _bias(add: relax.Expr, conv: relax.Call, conv_var: relax.Var, filters: int) -> np.ndarray | None:
    """The per-filter bias an add of the conv's result and a constant along its channels adds."""
    if not is_call(add, "relax.add"):
        return None
    a, b = add.args
    const = b if a.same_as(conv_var) else a if b.same_as(conv_var) else None
    if not isinstance(const, tvm.ir.GenericConst):
        return None
    value = const.value.numpy()
    channel_axis = _LAYOUTS[str(conv.attrs.data_layout)][2]
    along_channels = value.ndim < -channel_axis or value.shape[channel_axis] == filters
    if value.size != filters or value.ndim > 4 or not along_channels:
        return None
    return value.reshape(filters)


def _plan(func: relax.Function) -> dict:
    var2val = get_var2val(func)
    uses = use_counts(func)
    readers = {}
    for var, value in var2val.items():
        for arg in getattr(value, "args", []):
            if isinstance(arg, relax.Var):
                readers.setdefault(arg, var)
    plan = {}
    for var, value in var2val.items():
        if not is_call(value, "relax.nn.conv2d") or (patch := _patch(value)) is None:
            continue
        filters = static_shape(value.args[1])[0]
        reader = readers.get(var)
        bias = _bias(var2val.get(reader), value, var, filters) if uses.get(var, 0) == 1 and reader is not None else None
        if bias is not None:  # the add computes both; the conv, read by nothing then, goes
            plan[reader] = (value, patch, bias)
        else:
            plan[var] = (value, patch, None)
    return plan


def _as_matmul(mutator, _binding, planned) -> relax.Expr:
    conv, patch, bias = planned
    emit = mutator.builder_.emit
    data = mutator.visit_expr(conv.args[0])
    nchw = str(conv.attrs.data_layout) == "NCHW"
    batch, channels, height, width = (data.ty.shape.values[a] for a in _LAYOUTS[str(conv.attrs.data_layout)][1])
    rows, cols, channels = int(height) // patch, int(width) // patch, int(channels)
    weight = conv.args[1].value.numpy()  # (E, C, p, p) or (E, p, p, C): flattened as the patches are
    out_dtype = str(conv.ty.dtype)
    if nchw:  # (B, C, H/p, p, W/p, p) -> (B, H/p, W/p, C, p, p)
        patches = emit(relax.op.reshape(data, [batch, channels, rows, patch, cols, patch]))
        patches = emit(relax.op.permute_dims(patches, [0, 2, 4, 1, 3, 5]))
    else:  # (B, H/p, p, W/p, p, C) -> (B, H/p, W/p, p, p, C)
        patches = emit(relax.op.reshape(data, [batch, rows, patch, cols, patch, channels]))
        patches = emit(relax.op.permute_dims(patches, [0, 1, 3, 2, 4, 5]))
    patches = emit(relax.op.reshape(patches, [batch, rows, cols, channels * patch * patch]))
    matrix = relax.const(np.ascontiguousarray(weight.reshape(weight.shape[0], -1).T), str(weight.dtype))
    out = emit(relax.op.matmul(patches, matrix, out_dtype=out_dtype))
    if bias is not None:
        out = emit(relax.op.add(out, relax.const(bias.astype(out_dtype), out_dtype)))
    return emit(relax.op.permute_dims(out, list(NHWC_TO_NCHW))) if nchw else out


def patchify_convs(func: relax.Function) -> relax.Function:
    """Every patch-embedding conv2d of `func` (and the bias add after it) as a GEMM of its patches
    (see the module)."""
    rewritten = planned_rewrite(func, _plan, _as_matmul)
    return func if rewritten.same_as(func) else collapse_view_chains(rewritten)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.PatchifyConvs")
class PatchifyConvs:
    """Patch-embedding convolutions on a few input channels as GEMMs of their patches (see the
    module's docstring). A no-op on modules without them."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return relax_functions(mod, patchify_convs)
