"""FoldLinearReshapes: undo the flatten/unflatten frontends put around a linear layer.

`torch.export` lowers `nn.Linear` on a (B, S, K) input to reshape(B*S, K) -> matmul (+ bias) ->
reshape(B, S, N), with an astype after the first reshape once ToMixedPrecision has run. The
reshape between the GEMM (+ bias) and what follows (gelu, a residual add) would end the fused
region at the bias. Relax's matmul takes the N-D input directly, so the pair of reshapes is
dropped: matmul(x, W) (+ b) on (B, S, K) is the same computation, and the epilogue after it fuses.

The same pass also turns a batched matmul whose weight is one 2-D matrix broadcast over the batch
back into matmul(x, W). torch.export writes some linear layers (a Hugging Face BERT's attention
output projection under SDPA) as expand(W^T, (B, K, N)) + bmm; after bind_params + FoldConstant
the broadcast is a (B, K, N) constant of B equal slices, which no ND x 2D GEMM pattern matches.
Nothing else is touched.
"""

from __future__ import annotations

import functools
import math
import operator

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from ..kinds.ir import (
    is_offloaded_function,
    rewrite_call_weights_hidden,
    same_shape,
    static_int,
    static_shape,
    tensor_dims,
)
from ..toolkit.dtypes import SIXTEEN_BIT_FLOATS
from .shapes import bound_symbolic_shapes


def _pattern():
    x, weight, bias = wildcard(), wildcard(), wildcard()
    flat = is_op("relax.reshape")(x, wildcard())
    # ToMixedPrecision casts the flattened input: reshape -> astype -> matmul.
    cast = is_op("relax.astype")(flat)
    gemm = is_op("relax.matmul")(flat | cast, weight)
    biased = is_op("relax.add")(gemm, bias) | is_op("relax.add")(bias, gemm)
    out = is_op("relax.reshape")(gemm | biased, wildcard())
    return out, x, flat, cast, gemm, weight, bias, biased


def _rewrite(func: relax.Function) -> relax.Function:
    out, x, flat, cast, gemm, weight, bias, biased = _pattern()

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        # Shapes may be symbolic (a sequence length exported as a torch.export.Dim): every
        # equality below is proved, dim by dim, or the reshapes stay.
        xs, fs, os_ = tensor_dims(m[x]), tensor_dims(m[flat]), tensor_dims(orig)
        if xs is None or fs is None or os_ is None or len(xs) < 3 or len(fs) != 2:
            return orig
        lead = xs[:-1]
        # Only the exact flatten of the leading dims, and the exact restore of them.
        flattened = functools.reduce(operator.mul, lead[1:], lead[0])
        if not same_shape(fs, [flattened, xs[-1]]) or len(os_) != len(xs) or not same_shape(os_[:-1], lead):
            return orig
        if len(static_shape(m[weight]) or []) != 2:
            return orig
        lhs = relax.op.astype(m[x], str(m[cast].ty.dtype)) if cast in m else m[x]
        y = relax.op.matmul(lhs, m[weight], out_dtype=str(m[gemm].ty.dtype))
        if biased in m:
            b = m[bias]
            bias_dims = static_shape(b)
            if bias_dims is None or not same_shape([math.prod(bias_dims)], [os_[-1]]):
                return orig
            y = relax.op.add(y, b)
        return y

    return rewrite_call_weights_hidden(out, rewriter, func)


def _broadcast_source(weight: relax.Expr, batch_dims: int) -> relax.Expr | None:
    """The 2-D matrix that `weight` (rank 2 + batch_dims) repeats over its leading dims, or None.

    Either broadcast_to(W) of a 2-D W, or a constant whose slices over the leading dims are all
    equal (compared exactly, so a constant that merely looks broadcast is never changed)."""
    if isinstance(weight, relax.Call) and weight.op == tvm.ir.Op.get("relax.broadcast_to"):
        source = weight.args[0]
        dims, wdims = static_shape(source), tensor_dims(weight)  # the batch may be symbolic
        if dims is not None and wdims is not None and len(dims) == 2 and same_shape(dims, wdims[-2:]):
            return source
        return None
    if not isinstance(weight, tvm.ir.GenericConst):
        return None
    value = weight.value.numpy()
    if value.ndim != 2 + batch_dims or value.ndim < 3:
        return None
    flat = value.reshape(-1, *value.shape[-2:])
    if not all(np.array_equal(flat[0], s) for s in flat[1:]):
        return None
    return relax.const(np.ascontiguousarray(flat[0]), str(weight.ty.dtype))


def unbroadcast_weights(func: relax.Function) -> relax.Function:
    """matmul(x, W broadcast to (..., K, N)) -> matmul(x, W) for a 2-D W repeated over x's batch."""
    x, weight = wildcard(), wildcard()
    pattern = is_op("relax.matmul")(x, weight)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        # the batch dims may be symbolic (a batch exported with a torch.export.Dim): proved equal
        xs, ws = tensor_dims(m[x]), tensor_dims(m[weight])
        if xs is None or ws is None or len(ws) < 3 or len(xs) < len(ws) or not same_shape(xs[-len(ws) : -2], ws[:-2]):
            return orig
        source = _broadcast_source(m[weight], len(ws) - 2)
        if source is None:
            return orig
        return relax.op.matmul(m[x], source, out_dtype=str(orig.ty.dtype))

    return rewrite_call(pattern, rewriter, func)


def _operand_dtypes(call: relax.Call) -> list[str]:
    return [str(a.ty.dtype) if isinstance(a.ty, relax.TensorType) else "" for a in call.args]


def _conv_with_out_dtype(builder):
    """A rebuild of a convolution call with another out_dtype, every other attribute kept."""

    def rebuild(call: relax.Call, out_dtype: str) -> relax.Expr:
        a = call.attrs
        return builder(
            call.args[0],
            call.args[1],
            strides=a.strides,
            padding=a.padding,
            dilation=a.dilation,
            groups=int(a.groups),
            data_layout=a.data_layout,
            kernel_layout=a.kernel_layout,
            out_layout=a.out_layout,
            out_dtype=out_dtype,
        )

    return rebuild


# The reductions ToMixedPrecision gives a 16-bit out_dtype, which TVM's legalization then sums in,
# each with how to rebuild its call with another out_dtype.
ACCUMULATING_OPS = {
    "relax.matmul": lambda call, out_dtype: relax.op.matmul(call.args[0], call.args[1], out_dtype=out_dtype),
    "relax.nn.conv2d": _conv_with_out_dtype(relax.op.nn.conv2d),
    "relax.nn.conv1d": _conv_with_out_dtype(relax.op.nn.conv1d),
}


def _accumulating_pattern():
    """Any op of `ACCUMULATING_OPS` on two operands."""
    a, b = wildcard(), wildcard()
    return functools.reduce(operator.or_, (is_op(name)(a, b) for name in ACCUMULATING_OPS))


def accumulate_in_float32(func: relax.Function) -> relax.Function:
    """op(a, b) -> dtype with 16-bit a, b and dtype -> astype(op(a, b) -> float32, dtype), for the
    matmuls and convolutions of `ACCUMULATING_OPS`.

    ToMixedPrecision(out_dtype="float16") gives each of them a float16 out_dtype, and TVM's
    legalization sums in the out_dtype: a K=5632 reduction (Llama's down projection) summed in
    float16 is 3.8e-2 from float32 at the last hidden state, where torch's fp16 (float32
    accumulators) is 1e-2; a ResNet-50's RGB stem conv (K=147, batch norm folded in) summed in
    float16 puts TVM's build at 9.8e-2 where torch's fp16 is 3.3e-2. Spelled as a float32 op cast to
    16 bits, TVM's own build sums in float32 as torch and the CUTLASS kernels do; the rounded values
    downstream are unchanged."""
    pattern = _accumulating_pattern()

    def rewriter(orig: relax.Expr, _m: dict) -> relax.Expr:
        out = str(orig.ty.dtype)
        if out not in SIXTEEN_BIT_FLOATS or _operand_dtypes(orig) != [out, out]:
            return orig
        return relax.op.astype(ACCUMULATING_OPS[orig.op.name](orig, "float32"), out)

    return rewrite_call_weights_hidden(pattern, rewriter, func)


def fold_float32_accumulation(func: relax.Function) -> relax.Function:
    """astype(op(a, b) -> float32, dtype) with 16-bit a, b of that dtype -> op(a, b) -> dtype, the
    inverse of `accumulate_in_float32`, for the offload patterns: a CUTLASS GEMM or convolution with
    a 16-bit output accumulates in float32 (the `accumulator` option) and runs its epilogue (bias,
    activation, residual) before the one rounding, so the region is the same computation, and the
    bias add after it fuses instead of ending the region at the cast."""
    inner = _accumulating_pattern()
    pattern = is_op("relax.astype")(inner)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        out, call = str(orig.ty.dtype), m[inner]
        if out not in SIXTEEN_BIT_FLOATS or str(call.ty.dtype) != "float32" or _operand_dtypes(call) != [out, out]:
            return orig
        return ACCUMULATING_OPS[call.op.name](call, out)

    return relax.analysis.remove_all_unused(rewrite_call_weights_hidden(pattern, rewriter, func))


def relax_functions(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    """`rewrite` applied to each Relax function of `mod` that is not an offloaded region."""

    functions = {
        gv: rewrite(func) if isinstance(func, relax.Function) and not is_offloaded_function(func) else func
        for gv, func in mod.functions_items()
    }
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.AccumulateInFloat32")
class AccumulateInFloat32:
    """16-bit matmuls and convolutions left to TVM sum in float32 (`accumulate_in_float32`);
    offloaded regions and float32 ones are left alone. from_torch applies it; offload_pipeline folds it back before
    partitioning (FoldLinearReshapes) and applies it again to what stays in TVM."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return relax_functions(mod, accumulate_in_float32)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.UnbroadcastWeights")
class UnbroadcastWeights:
    """matmul(x, broadcast_to(W, (B, K, N))) -> matmul(x, W), before anything folds constants.

    torch.export writes a 3-D linear layer (nn.MultiheadAttention's packed in-projection on
    (seq, batch, dim) tokens) as a batched matmul with its weight broadcast over the sequence;
    FoldConstant then materializes the broadcast: a ViT-B/16's 2304 x 768 weight became a
    197 x 768 x 2304 float32 constant, 24 GB over 12 layers (from_torch ran out of memory, and
    TVM's library of the model crashed its loader). from_torch and bind_float16 apply it first."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return relax_functions(mod, unbroadcast_weights)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.FoldLinearReshapes")
class FoldLinearReshapes:
    """reshape(matmul(reshape(x, (B*S, K)), W) [+ b], (B, S, N)) -> matmul(x, W) [+ b], and
    matmul(x, W broadcast over the batch) -> matmul(x, W), after folding a float32-accumulated
    16-bit matmul back into one (`fold_float32_accumulation`)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        functions = {
            gv: _rewrite(unbroadcast_weights(fold_float32_accumulation(func)))
            if isinstance(func, relax.Function)
            else func
            for gv, func in mod.functions_items()
        }
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def drop_identity_broadcasts(func: relax.Function) -> relax.Function:
    """broadcast_to(x, shape of x) -> x. torch.export writes one before every batched matmul; left
    in a fused region with a symbolic shape, it would become an R.Shape argument whose tensor
    shape the region can no longer see."""
    x = wildcard()
    pattern = is_op("relax.broadcast_to")(x, wildcard())

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        before, after = m[x].ty, orig.ty
        if not (isinstance(before, relax.TensorType) and isinstance(after, relax.TensorType)):
            return orig
        if not (hasattr(before.shape, "values") and hasattr(after.shape, "values")):
            return orig
        same = same_shape(list(before.shape.values), list(after.shape.values))
        return m[x] if same and before.dtype == after.dtype else orig

    return rewrite_call_weights_hidden(pattern, rewriter, func)


def fold_scalar_casts(func: relax.Function) -> relax.Function:
    """astype(scalar constant) -> the constant in that dtype. ToMixedPrecision leaves the fp16
    cast of a scale (attention's 1/sqrt(d)) as a binding that every layer shares; inside one
    layer's fused region it would count as a value the region leaks to the others."""
    const = is_const()
    pattern = is_op("relax.astype")(const)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        value = m[const].value.numpy()
        if value.size != 1:
            return orig
        return relax.const(value.astype(str(orig.ty.dtype)), str(orig.ty.dtype))

    return rewrite_call(pattern, rewriter, func)


# Dtypes TVM 0.27's CUDA cumsum handles; a bool input aborts the process with a misaligned shared
# memory write (gpu_2d_continuous_cumsum, seen on the H100) and int8 does not compile.
_CUMSUM_DTYPES = ("int32", "int64", "float16", "float32", "float64")


def widen_narrow_cumsums(func: relax.Function) -> relax.Function:
    """cumsum over bool / 8- or 16-bit ints -> the same sums in int32, cast back to the result type.

    The integer sums are exact and then narrowed as the original's result type narrows them (for
    bool: any True so far), so the function computes the same values, in a form TVM can build."""
    x = wildcard()
    pattern = is_op("relax.cumsum")(x)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        source, result = str(m[x].ty.dtype), str(orig.ty.dtype)
        if source in _CUMSUM_DTYPES and result in _CUMSUM_DTYPES:
            return orig
        wide = result if result in _CUMSUM_DTYPES else "int32"
        attrs = orig.attrs
        summed = relax.op.cumsum(relax.op.astype(m[x], wide), attrs.axis, wide, bool(attrs.exclusive))
        return summed if wide == result else relax.op.astype(summed, result)

    return rewrite_call(pattern, rewriter, func)


def expand_integer_powers(func: relax.Function) -> relax.Function:
    """power(x, c) with c a constant integer from -4 to 4 -> products of x (1 / products for c < 0).

    TVM 0.27's CUDA build computes power through exp2(c * log2(x)), which is NaN for any negative
    x: GPT-2's gelu (x ** 3) and Llama's RMSNorm (x ** 2) gave NaN outputs on the H100 in the
    offloaded build and TVM's own alike. Products are exact where the exponent is an integer."""
    x, exponent = wildcard(), is_const()
    pattern = is_op("relax.power")(x, exponent)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        value = m[exponent].value.numpy()
        if value.size != 1 or not np.isfinite(value).all():
            return orig
        c = float(value.reshape(-1)[0])
        if c != round(c) or abs(c) > 4 or c == 0 or not isinstance(orig.ty, relax.TensorType):
            return orig
        base = m[x]
        dtype = str(orig.ty.dtype)
        if str(base.ty.dtype) != dtype:
            base = relax.op.astype(base, dtype)
        product = base
        for _ in range(int(abs(c)) - 1):
            product = relax.op.multiply(product, base)
        return product if c > 0 else relax.op.divide(relax.const(1.0, dtype), product)

    return rewrite_call_weights_hidden(pattern, rewriter, func)


def positive_slice_axes(func: relax.Function) -> relax.Function:
    """strided_slice over axis -k -> the same over axis rank - k.

    TVM 0.27's legalization of strided_slice with a symbolic bound (the dynamic path) does not
    normalize a negative axis and fails ("axis < src_tensor_dim (-1 vs. 2)"): Hugging Face's
    decoders slice their position ids at axis -1, so torch.export of Llama or GPT-2 with a
    symbolic sequence length failed in from_torch's FoldConstant, and in TVM's own build."""
    pattern = is_op("relax.strided_slice")(wildcard(), wildcard(), wildcard(), wildcard(), wildcard())

    def rewriter(orig: relax.Expr, _m: dict) -> relax.Expr:
        x, axes, begin, end, strides = orig.args
        rank = getattr(x.ty, "ndim", -1)
        if not isinstance(axes, relax.Tuple) or rank is None or rank < 0:
            return orig
        values = [int(a) for a in axes.fields]
        if all(a >= 0 for a in values):
            return orig
        positive = [a + rank if a < 0 else a for a in values]
        return relax.op.strided_slice(
            x, positive, list(begin.fields), list(end.fields), list(strides.fields), orig.attrs.assume_inbound
        )

    return rewrite_call_weights_hidden(pattern, rewriter, func)


def drop_empty_concat_operands(func: relax.Function) -> relax.Function:
    """concat((x, empty), axis) -> x: operands with a static extent 0 on the concat axis dropped
    (the concat kept where more than one remains), and the empty tensors' producers with them; a
    concat of one operand is that operand (torch.onnx's TorchScript GPT-2 concatenates each key and
    value with its empty past once folded: a copy TVM ran, and a view the attention could not see).

    Partial rotary embeddings write concat((rotated, x[..., rotary_dim:]), -1), and where the
    rotary dim is the whole head dim (Phi-3) the pass-through slice is empty: TVM 0.27's CUDA build
    of the zero-extent cast over it divides by zero in its default schedule, so Phi-3 did not
    build, neither offloaded nor in TVM's own build."""
    pattern = is_op("relax.concat")(wildcard())

    def rewriter(orig: relax.Expr, _m: dict) -> relax.Expr:
        (operands,) = orig.args
        if not isinstance(operands, relax.Tuple) or orig.attrs.axis is None:
            return orig

        def empty(x: relax.Expr) -> bool:
            dims = tensor_dims(x)
            return bool(dims) and static_int(dims[int(orig.attrs.axis)]) == 0

        kept = [x for x in operands.fields if not empty(x)]
        if not kept or (len(kept) == len(operands.fields) and len(kept) > 1):
            return orig
        return kept[0] if len(kept) == 1 else relax.op.concat(kept, int(orig.attrs.axis))

    rewritten = rewrite_call(pattern, rewriter, func)
    return rewritten if rewritten.same_as(func) else relax.analysis.remove_all_unused(rewritten)


def wrap_negative_take_indices(func: relax.Function) -> relax.Function:
    """take(x, constant indices) with a negative index -> the same with index + n (n: x's size on
    the axis), as torch reads it.

    TVM's PyTorch frontend writes indexing with a list (`index.Tensor`, `index_select`) as
    `take(..., mode="fast")`, which does not wrap a negative index: it reads before the tensor.
    Falcon's multi-query attention takes its key and value heads out of the fused projection as
    `fused[..., [-2], :]` and `[..., [-1], :]`: TVM's build, on the CPU and the GPU alike, read
    garbage there (NaN outputs in float16, silently wrong ones in bfloat16)."""
    x, indices = wildcard(), is_const()
    pattern = is_op("relax.take")(x, indices)

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        values = m[indices].value.numpy()
        if values.dtype.kind not in "iu" or not (values < 0).any():
            return orig
        dims, static = tensor_dims(m[x]), static_shape(m[x])
        axis = orig.attrs.axis
        if dims is None or (axis is None and static is None):
            return orig
        n = int(np.prod(static)) if axis is None else dims[int(axis) % len(dims)]
        if not isinstance(n, (int, tvm.tirx.IntImm)):
            # a symbolic axis (the sequence of a model exported with a torch.export.Dim): the
            # positions are n + index, known at run time only, so each is a slice of that axis
            sliced = _negative_take_as_slices(m[x], values, int(axis) % len(dims), n)
            return orig if sliced is None else sliced
        n = int(n)
        wrapped = np.where(values < 0, values + n, values)
        if not ((wrapped >= 0) & (wrapped < n)).all():
            return orig  # out of range in torch too: an error there, left as it is
        return relax.op.take(m[x], relax.const(wrapped.astype(values.dtype)), axis, mode=orig.attrs.mode)

    return rewrite_call(pattern, rewriter, func)


def _negative_take_as_slices(x: relax.Expr, values: np.ndarray, axis: int, n) -> relax.Expr | None:
    """take(x, constant indices, axis) over a symbolic axis of size n, as strided_slices (a
    negative index i is position n + i) concatenated on the axis; a 0-d index also drops the
    axis, as take does. None for indices of another rank."""
    if values.ndim > 1:
        return None
    parts = []
    for index in values.reshape(-1).tolist():
        begin = n + index if index < 0 else tvm.tirx.IntImm("int64", index)
        parts.append(relax.op.strided_slice(x, axes=[axis], begin=[begin], end=[begin + 1], assume_inbound=True))
    if values.ndim == 0:
        return relax.op.squeeze(parts[0], axis=[axis])
    return parts[0] if len(parts) == 1 else relax.op.concat(parts, axis=axis)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.FixTvmCudaForms")
class FixTvmCudaForms:
    """Rewrites of forms TVM 0.27's CUDA build gets wrong, values unchanged: constant negative take
    indices (read out of bounds), cumsums over narrow dtypes (abort or no build), small integer
    powers (NaN for negative bases), strided slices
    over a negative axis with a symbolic bound (no build), empty concat operands (a zero-extent
    cast: no build), and symbolic shapes that only the
    exported Dims' bounds make exact (`bound_symbolic_shapes`: no shape, no build)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        def fix(func: relax.Function) -> relax.Function:
            fixed = expand_integer_powers(widen_narrow_cumsums(wrap_negative_take_indices(func)))
            fixed = drop_empty_concat_operands(fixed)
            return bound_symbolic_shapes(positive_slice_axes(fixed))

        functions = {gv: fix(func) if isinstance(func, relax.Function) else func for gv, func in mod.functions_items()}
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
