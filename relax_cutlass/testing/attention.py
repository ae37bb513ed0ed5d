"""Attention graphs as frontends write them, and the kernel's own model of a region.

`check_regions_against_kernel_model` evaluates each offloaded region's `AttentionProblem` (all the
kernel is told) in numpy on the region's own inputs and compares it with the composite's output:
that catches a misread layout, which the composite alone would compute right.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.attention.records import AttentionProblem, AttentionRegion
from relax_cutlass.kinds.attention.select import choose_attention_kernel
from relax_cutlass.stages.constants import offloaded_functions
from relax_cutlass.stages.regions import analyze, make_region
from relax_cutlass.stages.report import offload_report

from .errors import rel_error
from .harness import build_cpu, offload_for_cpu, static_view_shapes

F16 = "float16"


def tensor_type(shape, dtype=F16):
    return relax.TensorType(shape, dtype)


def const(value: float, dtype: str = "float32"):
    return relax.const(value, dtype)


def torch_export_attention(
    b=2,
    s=8,
    n=2,
    h=8,
    t=None,
    *,
    symbolic_batch=False,
    softmax_axis=-1,
    out="bsnh",
    scale_op="multiply",
    cast=True,
    dtype=F16,
):
    """softmax(q k^T * scale) v as torch.export writes a Hugging Face BERT's eager attention:
    split heads (reshape), permute to (B, N, S, H), k transposed by a second permute, no-op
    broadcast_to + reshape to 3-D for the batched matmuls, fp16 scale, softmax in fp32."""
    t = t or s
    bb = relax.BlockBuilder()
    batch = tvm.tirx.Var("batch", "int64") if symbolic_batch else b
    x = relax.Var("x", tensor_type((batch, s, n * h), dtype))
    y = relax.Var("y", tensor_type((batch, t, n * h), dtype))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            q = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, (batch, s, n, h))), [0, 2, 1, 3]))
            k = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(y, (batch, t, n, h))), [0, 2, 1, 3]))
            v = bb.emit(
                relax.op.permute_dims(bb.emit(relax.op.reshape(y * const(0.5, dtype), (batch, t, n, h))), [0, 2, 1, 3])
            )
            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            q3 = bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(q, (batch, n, s, h))), (batch * n, s, h)))
            k3 = bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(kt, (batch, n, h, t))), (batch * n, h, t)))
            scores = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(q3, k3, out_dtype=dtype)), (batch, n, s, t)))
            scale = bb.emit(relax.op.astype(const(1 / np.sqrt(h) if scale_op == "multiply" else np.sqrt(h)), dtype))
            scaled = bb.emit(getattr(relax.op, scale_op)(scores, scale))
            logits = bb.emit(relax.op.astype(scaled, "float32")) if cast else scaled
            probs = bb.emit(relax.op.nn.softmax(logits, axis=softmax_axis))
            probs3 = bb.emit(
                relax.op.reshape(bb.emit(relax.op.broadcast_to(probs, (batch, n, s, t))), (batch * n, s, t))
            )
            probs3 = bb.emit(relax.op.astype(probs3, dtype)) if cast else probs3
            v3 = bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(v, (batch, n, t, h))), (batch * n, t, h)))
            ctx = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(probs3, v3, out_dtype=dtype)), (batch, n, s, h)))
            if out == "bsnh":
                ctx = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(ctx, [0, 2, 1, 3])), (batch, s, n * h)))
            gv = bb.emit_output(ctx)
        bb.emit_func_output(gv)
    return bb.get()


def _bsnh_function(b, s, t, n, h, body) -> tvm.IRModule:
    """main(x, y, z) on (B, S, N, H) query and (B, T, N, H) key / value tensors, returning
    `body(bb, q, k, v)` from one dataflow block."""
    bb = relax.BlockBuilder()
    q = relax.Var("x", tensor_type((b, s, n, h)))
    k = relax.Var("y", tensor_type((b, t, n, h)))
    v = relax.Var("z", tensor_type((b, t, n, h)))
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            gv = bb.emit_output(body(bb, q, k, v))
        bb.emit_func_output(gv)
    return bb.get()


def op_attention(b=2, s=8, n=2, h=8, t=None, scale=None, causal=None):
    """R.nn.attention on BSNH tensors (inputs x, y, z: q, k, v)."""

    def body(bb, q, k, v):
        return bb.emit(relax.op.nn.attention(q, k, v, scale=scale, causal_mask=causal))

    return _bsnh_function(b, s, t or s, n, h, body)


def tvm_rewrite_form(b=2, s=8, n=2, h=8):
    """TVM's own rewrite layout (relax.backend.patterns): BSNH -> permute -> reshape to 3-D, k then
    transposed in 3-D; the scale is a divide; no casts; the output stays (B*N, S, H) -> BSNH."""

    def body(bb, q, k, v):
        q3 = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(q, [0, 2, 1, 3])), (b * n, s, h)))
        k3 = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(k, [0, 2, 1, 3])), (b * n, s, h)))
        kt = bb.emit(relax.op.permute_dims(k3, [0, 2, 1]))
        v3 = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(v, [0, 2, 1, 3])), (b * n, s, h)))
        scores = bb.emit(relax.op.divide(bb.emit(relax.op.matmul(q3, kt)), const(np.sqrt(h), F16)))
        ctx = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(scores, axis=-1)), v3))
        return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(ctx, (b, n, s, h))), [0, 2, 1, 3]))

    return _bsnh_function(b, s, s, n, h, body)


MASK_SHAPES = {"b1st": "B1ST", "b11t": "B11T", "11st": "11ST", "bnst": "BNST"}


def sdpa_attention(
    b=2,
    s=16,
    n=2,
    h=8,
    t=None,
    *,
    mask="bool",
    mask_shape="b1st",
    masked_value=-np.inf,
    q_scale=True,
    k_scale=True,
    tail=True,
    fill=0.0,
    dtype=F16,
):
    """softmax(q k^T * scale + mask) v as torch.export writes transformers' default (sdpa)
    attention: q and k^T each multiplied by sqrt(1/sqrt(H)) in fp16 (`q_scale` / `k_scale`: the
    factor on that side, the rest of 1/sqrt(H) on the scores), the fp32 additive mask
    where(keep, 0, masked_value) of a boolean input `keep` (mask="bool"; "float16": an fp16
    additive `bias` input added before the cast; "float32": an fp32 `bias` input; "constant":
    a causal fp32 constant mask), the fp32 softmax with torch's safe-softmax tail (a fully
    masked row gets `fill`), the heads moved back by three permutes. Inputs x, y (q/k/v
    projections) and the mask; q/k/v, the scores and a "float16" bias in `dtype` (float16 or
    bfloat16)."""
    t = t or s
    dims = {"B": b, "N": n, "S": s, "T": t, "1": 1}
    shape = [dims[a] for a in MASK_SHAPES[mask_shape]]
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor_type((b, s, n * h), dtype))
    y = relax.Var("y", tensor_type((b, t, n * h), dtype))
    if mask == "constant":  # a causal mask, as a float32 constant
        causal = np.tril(np.ones((s, t), bool))
        m = relax.const(np.where(causal, 0, masked_value).astype("float32").reshape(shape))
    else:
        m = relax.Var("keep" if mask == "bool" else "bias", tensor_type(shape, dtype if mask == "float16" else mask))
    root = float(np.sqrt(1 / np.sqrt(h)))
    with bb.function("main", [x, y] + ([m] if isinstance(m, relax.Var) else [])):
        with bb.dataflow():

            def heads(z, rows):
                return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(z, (b, rows, n, h))), [0, 2, 1, 3]))

            q, k = heads(x, s), heads(y, t)
            v = heads(bb.emit(y * const(0.5, dtype)), t)
            if q_scale:
                q = bb.emit(relax.op.multiply(q, const(root, dtype)))
            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            if k_scale:
                kt = bb.emit(relax.op.multiply(kt, const(root, dtype)))
            q3 = bb.emit(relax.op.reshape(q, (b * n, s, h)))
            k3 = bb.emit(relax.op.reshape(kt, (b * n, h, t)))
            scores = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(q3, k3, out_dtype=dtype)), (b, n, s, t)))
            rest = (1 / np.sqrt(h)) / (root if q_scale else 1) / (root if k_scale else 1)
            if abs(rest - 1) > 1e-6:
                scores = bb.emit(relax.op.multiply(scores, const(rest, dtype)))
            if mask == "float16":
                scores = bb.emit(relax.op.add(scores, m))
            logits = bb.emit(relax.op.astype(scores, "float32"))
            if mask == "bool":
                additive = bb.emit(relax.op.where(m, const(0.0), const(masked_value)))
                logits = bb.emit(relax.op.add(logits, additive))
            elif mask in ("float32", "constant"):
                logits = bb.emit(relax.op.add(logits, m))
            probs = bb.emit(relax.op.nn.softmax(logits, axis=-1))
            if tail:
                finite = bb.emit(relax.op.logical_not(bb.emit(relax.op.equal(logits, const(-np.inf)))))
                row_any = bb.emit(relax.op.max(bb.emit(relax.op.astype(finite, "int8")), axis=[-1], keepdims=True))
                masked_row = bb.emit(relax.op.logical_not(bb.emit(relax.op.astype(row_any, "bool"))))
                fills = relax.const(np.full((b, n, s, t), fill, "float32"))  # torch writes a tensor
                probs = bb.emit(relax.op.where(masked_row, fills, probs))
            probs3 = bb.emit(relax.op.astype(bb.emit(relax.op.reshape(probs, (b * n, s, t))), dtype))
            v3 = bb.emit(relax.op.reshape(v, (b * n, t, h)))
            ctx = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(probs3, v3, out_dtype=dtype)), (b, n, s, h)))
            for axes in ([2, 0, 1, 3], [1, 2, 0, 3], [0, 2, 1, 3]):
                ctx = bb.emit(relax.op.permute_dims(ctx, axes))
            gv = bb.emit_output(bb.emit(relax.op.reshape(ctx, (b, s, n * h))))
        bb.emit_func_output(gv)
    return bb.get()


def soft_capped_attention(
    b=2, s=16, n=2, h=16, t=None, *, cap=50.0, mask="none", cap_op="divide", dtype=F16
) -> tvm.IRModule:
    """Gemma-2's eager attention as torch.export writes it: the scores scaled by 1/sqrt(H), then
    soft-capped, cap * tanh(scores / cap) in the 16-bit type (`cap_op` "multiply": by 1/cap), cast
    to float32, a mask added ("none"; "causal": a float32 constant of 0 and finfo(float32).min;
    "padding": where(keep, 0, -inf) of a boolean (B, 1, 1, T) input `keep`), the float32 softmax.
    Inputs x, y (the q/k/v projections) and `keep`."""
    t = t or s
    bb = relax.BlockBuilder()
    x = relax.Var("x", tensor_type((b, s, n * h), dtype))
    y = relax.Var("y", tensor_type((b, t, n * h), dtype))
    keep = relax.Var("keep", tensor_type((b, 1, 1, t), "bool"))
    with bb.function("main", [x, y] + ([keep] if mask == "padding" else [])):
        with bb.dataflow():

            def heads(z, rows):
                return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(z, (b, rows, n, h))), [0, 2, 1, 3]))

            q, k, v = heads(x, s), heads(y, t), heads(bb.emit(y * const(0.5, dtype)), t)
            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            scores = bb.emit(relax.op.matmul(q, kt, out_dtype=dtype))
            scores = bb.emit(relax.op.multiply(scores, const(h**-0.5, dtype)))
            if cap_op == "divide":
                scores = bb.emit(relax.op.divide(scores, const(cap, dtype)))
            else:
                scores = bb.emit(relax.op.multiply(scores, const(1.0 / cap, dtype)))
            capped = bb.emit(relax.op.multiply(bb.emit(relax.op.tanh(scores)), const(cap, dtype)))
            logits = bb.emit(relax.op.astype(capped, "float32"))
            if mask == "causal":
                keep = np.tril(np.ones((s, t), bool), t - s)
                table = np.where(keep, 0, np.finfo("float32").min).astype("float32").reshape(1, 1, s, t)
                logits = bb.emit(relax.op.add(logits, relax.const(table)))
            elif mask == "padding":
                logits = bb.emit(relax.op.add(logits, bb.emit(relax.op.where(keep, const(0.0), const(-np.inf)))))
            probs = bb.emit(relax.op.astype(bb.emit(relax.op.nn.softmax(logits, axis=-1)), dtype))
            ctx = bb.emit(relax.op.permute_dims(bb.emit(relax.op.matmul(probs, v, out_dtype=dtype)), [0, 2, 1, 3]))
            gv = bb.emit_output(bb.emit(relax.op.reshape(ctx, (b, s, n * h))))
        bb.emit_func_output(gv)
    return bb.get()


def masked_inputs(mod: tvm.IRModule, seed: int = 0, full_row: bool = True) -> list[np.ndarray]:
    """Random inputs; a boolean mask masks about a third of the keys, and (`full_row`) every
    key of its first row; an additive float bias gets -inf where a key is masked."""
    rng = np.random.default_rng(seed)
    arrays = []
    for p in mod["main"].params:
        shape, dtype = [int(d) for d in p.ty.shape.values], str(p.ty.dtype)
        if dtype == "bool" or p.name in ("bias", "mask"):
            keep = rng.random(shape) > 0.3
            if full_row:
                keep[(0,) * (len(shape) - 1)] = False
            arrays.append(keep if dtype == "bool" else np.where(keep, rng.uniform(-1, 1, shape), -np.inf).astype(dtype))
        else:
            arrays.append(rng.uniform(-1, 1, size=shape).astype(dtype))
    return arrays


def attention_regions(partitioned: tvm.IRModule, arch: int = 90, family: str = "auto") -> list[AttentionRegion]:
    regions = []
    for _, func in offloaded_functions(partitioned):
        symbol = str(func.attrs["global_symbol"])
        spec, roles, problem, composite, aliases = analyze(func, symbol)
        if isinstance(problem, AttentionProblem):
            kernel = choose_attention_kernel(problem, arch, family=family)
            regions.append(make_region(func, symbol, kernel, roles, composite, aliases))
    return regions


def kernel_model(problem: AttentionProblem, query, key, value, bias=None) -> np.ndarray:
    """What the kernel computes from its problem record alone, in float64: each packed operand
    read through the strides its *_reads give (the bias through `bias_reads`, stride 0 where it
    is broadcast; k and v with heads / kv_group heads, each serving kv_group query heads), output
    (B, S, N, V); soft-capped scores where `softcap` says; a row whose every score is -inf as
    `masked_rows` says."""

    def strides(array, reads):
        return [0 if read is None else math.prod(array.shape[read[0] + 1 :]) * read[1] * 8 for read in reads]

    def view(array, reads, rows: int, dim: int, heads: int = problem.heads, role: str = ""):
        array = np.ascontiguousarray(array.astype("float64"))
        # a part of a packed projection: read from its first element of the sliced dim on
        offset = sum(first * math.prod(array.shape[d + 1 :]) for r, d, first, _ in problem.slices if r == role)
        shape = (batch, rows, heads, dim)
        return np.lib.stride_tricks.as_strided(array.reshape(-1)[offset:], shape, strides(array, reads))

    def size(array, reads, axes: str, axis: str) -> int:
        """A symbolic axis's size: its dimension's extent over the other (static) axes in it."""
        known = {"B": problem.batch, "S": problem.seq_q, "T": problem.seq_kv, "N": problem.heads}
        known |= {"H": problem.head_dim, "V": problem.head_dim_value}
        dim = reads[axes.index(axis)][0]
        others = [known[a] for a, (d, _) in zip(axes, reads, strict=True) if d == dim and a != axis]
        return array.shape[dim] // math.prod(others)

    batch = problem.batch or size(query, problem.query_reads, "BSNH", "B")
    seq_q = problem.seq_q or size(query, problem.query_reads, "BSNH", "S")
    seq_kv = problem.seq_kv or size(key, problem.key_reads, "BTNH", "T")
    q = view(query, problem.query_reads, seq_q, problem.head_dim, role="query")
    # grouped-query attention: kv head n // kv_group serves query head n
    group, kv_heads = problem.kv_group, problem.kv_heads
    k = np.repeat(view(key, problem.key_reads, seq_kv, problem.head_dim, kv_heads, "key"), group, 2)
    v = np.repeat(view(value, problem.value_reads, seq_kv, problem.head_dim_value, kv_heads, "value"), group, 2)
    scores = np.einsum("bsnh,btnh->bnst", q, k) * problem.scale
    if problem.softcap is not None:  # c * tanh(scale * q.k), the bias added after
        scores = problem.softcap * np.tanh(scores)
    if problem.bias_reads is not None:
        array = np.ascontiguousarray(bias.astype("float64"))
        shape = (batch, problem.heads, seq_q, seq_kv)
        scores = scores + np.lib.stride_tricks.as_strided(array, shape, strides(array, problem.bias_reads))
    if problem.causal is not None:  # TVM's: query i sees key j iff j <= i + (0 or |S - T|)
        offset = abs(seq_q - seq_kv) if problem.causal == "BottomRight" else 0
        scores = np.where(np.arange(seq_kv)[None, :] <= np.arange(seq_q)[:, None] + offset, scores, -np.inf)
    row_max = scores.max(-1, keepdims=True)
    masked = np.isneginf(row_max)  # every key masked: the softmax is 0/0
    with np.errstate(invalid="ignore"):
        probs = np.exp(scores - np.where(masked, 0.0, row_max))
        probs /= probs.sum(-1, keepdims=True)
    fill = {"nan": np.nan, "zero": 0.0, "mean": 1.0 / seq_kv}[problem.masked_rows]
    probs = np.where(masked, fill, probs)
    return np.einsum("bnst,btnv->bsnv", probs, v)


def _masked_bias(rng, shape, dtype) -> np.ndarray:
    """A random additive bias with -inf entries (masked keys) and its first row fully masked, unless
    that one row is broadcast to every query (a (1, ..., 1, T) bias): masked, it would leave every
    output NaN and nothing to compare."""
    bias = rng.uniform(-1, 1, size=shape).astype(dtype)
    bias[rng.random(shape) < 0.3] = -np.inf
    if math.prod(shape[:-1]) > 1:
        bias[(0,) * (len(shape) - 1)] = -np.inf
    return bias


def check_regions_against_kernel_model(partitioned: tvm.IRModule, rng_seed: int = 0, **dims) -> int:
    """For each attention region: its composite on CPU vs `kernel_model` of its problem (a bias
    gets masked keys and a fully masked row)."""
    checked = 0
    for _, func in offloaded_functions(partitioned):
        symbol = str(func.attrs["global_symbol"])
        _, roles, problem, composite, aliases = analyze(func, symbol)
        if not isinstance(problem, AttentionProblem):
            continue
        composite = static_view_shapes(composite.without_attr("Composite"))
        rng = np.random.default_rng(rng_seed)
        inputs, args = [], []
        for role, param in zip(roles, composite.params, strict=True):
            values = param.ty.values if isinstance(param.ty, relax.ShapeType) else param.ty.shape.values
            shape = [evaluate_dim(d, dims) for d in values]
            if isinstance(param.ty, relax.ShapeType):
                inputs.append(None)
                args.append(tvm_ffi.Shape(shape))
            else:
                dtype = str(param.ty.dtype)
                inputs.append(
                    _masked_bias(rng, shape, dtype) if role == "bias" else rng.uniform(-1, 1, size=shape).astype(dtype)
                )
                args.append(tvm.runtime.tensor(inputs[-1]))
        expected = build_cpu(tvm.IRModule({"main": composite}))["main"](*args).numpy()
        by_role = dict(zip(roles, inputs, strict=True))
        by_role |= {alias: by_role[role] for alias, role in aliases}  # q, k, v of one packed projection
        got = kernel_model(problem, by_role["query"], by_role["key"], by_role["value"], by_role.get("bias"))
        got = got.reshape(expected.shape)
        nan = np.isnan(expected)
        assert (np.isnan(got) == nan).all(), symbol  # fully masked rows without a safe softmax
        assert rel_error(np.where(nan, 0, got), np.where(nan, 0, expected)) < 2e-2, symbol
        checked += 1
    return checked


def evaluate_dim(dim, dims: dict[str, int]) -> int:
    """A shape dimension's value, its symbolic variables bound from `dims` (name -> size)."""
    if hasattr(dim, "value"):
        return int(dim.value)
    analyzer = tvm.sym.Analyzer()
    for var in tvm.tirx.analysis.undefined_vars(dim):
        analyzer.bind(var, tvm.tirx.IntImm("int64", dims[var.name]))
    return int(analyzer.simplify(dim))


def offloaded_attention_rows(mod: tvm.IRModule) -> list[dict]:
    """The offload report's attention rows of an offloaded module (as built for sm_90a)."""
    return [r for r in offload_report(mod, arch="sm_90a").offloaded if r["op"] == "attention"]


def attention_rows_after_offload(mod: tvm.IRModule):
    """Offload `mod` for the CPU harness -> (its attention report rows, partitioned, rewritten)."""
    partitioned, rewritten = offload_for_cpu(mod)
    rows = [r for r in relax_cutlass.offload_report(rewritten).offloaded if r["op"] == "attention"]
    return rows, partitioned, rewritten


def rotary_table(row: dict) -> bool:
    """Llama's rotary angles: inv_freq (1, H/2, 1) x positions (1, 1, S), a float32 outer product the
    model computes in float32 on purpose (autocast off), rightly left in TVM."""
    lhs, rhs = row["shapes"]
    return (
        row["op"] == "batched matmul"
        and lhs.endswith(", 1])")
        and rhs.startswith("R.shape([1, 1,")
        and any("lhs dtype is float32" in reason for reason in row["reasons"])
    )
