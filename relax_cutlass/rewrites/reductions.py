"""FastTvmReductions: average pools and float32 means left in TVM, in forms its CUDA build runs fast.

TVM 0.27 legalizes an average pool as a window-sum block followed by a divide, and DLight's
GeneralReduction rule gives that one thread block per *output element*, with the window (2 x 2:
four values) as the reduction spread over 256 threads. DenseNet-121's three transition pools
(AvgPool2d(2), batch 32) took 5.0 of its 8.0 ms per inference on an H200; a max pool of the same
size is scheduled by another rule and takes 0.04 ms. Every average pool with a small window meets
this: avg_pool1d/2d/3d in either layout, count_include_pad or not, and adaptive pools whose
windows tile the input (56 -> 28).

    avg_pool(x)  ->  cast(sum over window offsets (i, j) of strided_slice(x, begin=(i, j),
                                 strides=(sh, sw)) in float32 * (1 / divisor))

is one elementwise kernel that FuseOps fuses (and can fuse into its consumer): each output reads
its window once, as the pool does, with the sum in float32 as PyTorch sums (TVM's pool sums in
the input's 16-bit dtype). The divisor is the window size, or where padding is not counted, a
constant of each output position's count of real elements.

A float32 mean (a squeeze-excitation's or a classifier's global pool, behind the casts and
activations that ToMixedPrecision and from_torch leave in float32) is legalized as a reduction
block and a divide, which AnnotateTIROpPattern marks "fusable with what follows", not with what
precedes: whatever computed its input became a kernel of its own, writing the whole activation in
float32 for the mean to read back (EfficientNet-B0: 0.26 ms of casts; MobileNetV3: hardswish).

    mean(y, axes)  ->  sum(y * (1 / count), axes)

is a plain reduction, into which FuseOps fuses the elementwise chain that computes y: one kernel
that reads the 16-bit activation.

Values are unchanged up to the float32 summation. Offloaded functions are left alone.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..kinds.ir import static_int, tensor_dims
from .canonicalize import relax_functions

# Above this many window offsets the spelled-out sum grows the IR more than it saves; such pools
# (global pools, written as adaptive ones) stay as they are.
MAX_WINDOW = 64


@dataclass(frozen=True)
class Pool:
    """One average pool, read per spatial dim: window, stride, padding before and after."""

    spatial_axes: tuple[int, ...]
    window: tuple[int, ...]
    strides: tuple[int, ...]
    pad_before: tuple[int, ...]
    pad_after: tuple[int, ...]
    count_padding: bool

    def divisor(self, in_sizes: tuple[int, ...], out_sizes: tuple[int, ...]) -> np.ndarray | float:
        """How many values each output averages: the window's size, or where padding is not
        counted, the window's real elements at each output position (1-D per dim, multiplied)."""
        if self.count_padding or not any(self.pad_before + self.pad_after):
            return float(math.prod(self.window))
        counts = []
        per_dim = zip(in_sizes, out_sizes, self.window, self.strides, self.pad_before, strict=True)
        for size, out, k, s, before in per_dim:
            start = np.arange(out) * s - before
            counts.append(np.minimum(start + k, size) - np.maximum(start, 0))
        return functools.reduce(np.multiply, np.ix_(*counts))


def spatial_axes(layout: str) -> tuple[int, ...] | None:
    """The D/H/W axes of a plain layout ("NHWC" -> (1, 2)); None for blocked layouts ("NCHW16c")."""
    if not layout.isalpha() or not layout.isupper():
        return None
    return tuple(i for i, axis in enumerate(layout) if axis in "DHW")


def read_pool(call: relax.Call, in_shape: list, out_shape: list) -> Pool | None:
    """The pool `call` computes, where the rewrite reproduces it exactly (static spatial sizes;
    the batch and channels may be symbolic); else None."""
    attrs = call.attrs
    layout = str(attrs.layout)
    if str(attrs.out_layout) != layout or (axes := spatial_axes(layout)) is None:
        return None
    ins = tuple(static_int(in_shape[a]) for a in axes)
    outs = tuple(static_int(out_shape[a]) for a in axes)
    if None in ins + outs:
        return None
    if call.op.name.startswith("relax.nn.adaptive_avg_pool"):
        # windows tile the input only where each output size divides its input size
        if any(o == 0 or i % o for i, o in zip(ins, outs, strict=True)):
            return None
        window = tuple(i // o for i, o in zip(ins, outs, strict=True))
        zeros = (0,) * len(axes)
        return Pool(axes, window, window, zeros, zeros, True)
    n = len(axes)
    window, strides = tuple(map(int, attrs.pool_size)), tuple(map(int, attrs.strides))
    padding = tuple(map(int, attrs.padding))
    if any(int(d) != 1 for d in attrs.dilation) or len(window) != n or len(padding) != 2 * n:
        return None
    pool = Pool(axes, window, strides, padding[:n], padding[n:], bool(attrs.count_include_pad))
    # ceil_mode only where it gives the floor mode's sizes (its partial windows are TVM's own rule)
    per_dim = zip(ins, pool.pad_before, pool.pad_after, window, strides, strict=True)
    floor_outs = tuple((i + b + e - k) // s + 1 for i, b, e, k, s in per_dim)
    return pool if floor_outs == outs else None


AVERAGE_POOLS = tuple(f"relax.nn.{kind}avg_pool{d}d" for kind, d in itertools.product(("", "adaptive_"), (1, 2, 3)))


@mutator
class _FastReductions(PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, call):
        new = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return new
        if call.op.name in AVERAGE_POOLS:
            replaced = self.window_sums(new)
        elif call.op.name == "relax.mean":
            replaced = self.float32_mean(new)
        else:
            replaced = None
        if replaced is None:
            return new
        self.rewritten += 1
        return replaced

    def window_sums(self, call: relax.Call) -> relax.Expr | None:
        x = call.args[0]
        in_shape, out_shape = tensor_dims(x), tensor_dims(call)
        if in_shape is None or out_shape is None or (pool := read_pool(call, in_shape, out_shape)) is None:
            return None
        if math.prod(pool.window) > MAX_WINDOW:
            return None
        dtype = str(x.ty.dtype)
        if any(pool.pad_before + pool.pad_after):
            pad_width = [0] * (2 * len(in_shape))
            for axis, before, after in zip(pool.spatial_axes, pool.pad_before, pool.pad_after, strict=True):
                pad_width[2 * axis], pad_width[2 * axis + 1] = before, after
            x = self.builder_.emit(relax.op.nn.pad(x, pad_width))
        outs = [int(out_shape[a]) for a in pool.spatial_axes]
        total = None
        for offset in itertools.product(*(range(k) for k in pool.window)):
            ends = [o + s * (n - 1) + 1 for o, s, n in zip(offset, pool.strides, outs, strict=True)]
            term = relax.op.strided_slice(
                x, list(pool.spatial_axes), list(offset), ends, list(pool.strides), assume_inbound=True
            )
            if dtype != "float32":
                term = relax.op.astype(self.builder_.emit(term), "float32")
            term = self.builder_.emit(term)
            total = term if total is None else self.builder_.emit(relax.op.add(total, term))
        divisor = pool.divisor(tuple(int(in_shape[a]) for a in pool.spatial_axes), tuple(outs))
        if isinstance(divisor, float):
            scale = relax.const(1.0 / divisor, "float32")
        else:
            shape = [1] * len(out_shape)
            for axis, n in zip(pool.spatial_axes, outs, strict=True):
                shape[axis] = n
            scale = relax.const((1.0 / divisor).reshape(shape).astype("float32"))
        mean = relax.op.multiply(total, scale)
        if dtype == "float32":
            return mean
        return relax.op.astype(self.builder_.emit(mean), dtype)

    def float32_mean(self, call: relax.Call) -> relax.Expr | None:
        x = call.args[0]
        dims = tensor_dims(x) if isinstance(x.ty, relax.TensorType) else None
        if str(call.ty.dtype) != "float32" or dims is None or call.attrs.axis is None:
            return None
        axes = sorted(int(a) % len(dims) for a in call.attrs.axis)
        if any(static_int(dims[a]) is None for a in axes):  # the count it divides by is a constant
            return None
        count = math.prod(int(dims[a]) for a in axes)
        scaled = self.builder_.emit(relax.op.multiply(x, relax.const(1.0 / count, "float32")))
        return relax.op.sum(scaled, axes, bool(call.attrs.keepdims))


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.FastTvmReductions")
class FastTvmReductions:
    """Average pools as window sums and float32 means of 16-bit tensors as one reduction, on what
    stays in TVM (see the module's docstring). A no-op on modules without them."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        def rewrite(func: relax.Function) -> relax.Function:
            rewriter = _FastReductions(mod)
            new_func = rewriter.visit_expr(func)
            return relax.analysis.remove_all_unused(new_func) if rewriter.rewritten else func

        return relax_functions(mod, rewrite)
