"""What the attention kind makes of a traced layout: its `rules` hook (why a matched region
cannot run as the fused kernel: dtypes, shapes, the layout `attention_layout` reads and the
kernel's own limits) and its `read_problem` hook (the AttentionProblem record of an offloaded
region). Kept apart from layout.py, which only traces the layout."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..ir import dtype_of
from .layout import OPERAND_AXES, AttentionLayout, attention_layout
from .patterns import ATTENTION_DTYPES, AttentionPatternSpec
from .records import AttentionProblem
from .trace import known_dims, static_dim


def attention_problems(spec: AttentionPatternSpec, ann: dict, out: relax.Expr, var2val) -> list[str]:
    """Why this matched region cannot run as the fused attention kernel (empty when it can)."""
    problems = []
    for role in ("query", "key", "value"):
        if known_dims(ann[role]) is None:
            problems.append(f"{role} has no known shape")
            continue
        dtype = str(ann[role].ty.dtype)
        if dtype not in ATTENTION_DTYPES:
            problems.append(f"{role} dtype is {dtype}; fused attention takes {'/'.join(ATTENTION_DTYPES)}")
    if problems:
        return problems
    if len({str(ann[r].ty.dtype) for r in ("query", "key", "value")} | {str(out.ty.dtype)}) != 1:
        return ["query, key, value and output dtypes differ"]
    matmuls = [ann["root"], ann["second"]] if "second" in ann else []
    if any(str(arg.ty.dtype) != str(out.ty.dtype) for m in matmuls for arg in m.args):
        # the operands may pass through float32 only between casts around a scale
        return ["the matmuls' operands are not of the attention's element type"]
    if "bias" in ann:
        dtype, element = str(ann["bias"].ty.dtype), str(ann["query"].ty.dtype)
        if known_dims(ann["bias"]) is None:
            return ["the additive mask/bias has no known shape"]
        if dtype != element:
            return [
                f"the additive mask/bias is {dtype}, but the kernel reads it as {element} (a float32 mask "
                f"is cast to {element} before partitioning only where its values are provably exact in "
                f"{element}, are computed from weights and constants within float16's range (rounded as "
                f"the weights are), or are a finite mask value that swamps the scores)"
            ]
    try:
        layout = attention_layout(spec, ann, out, var2val)
    except ValueError as err:
        return [str(err)]
    except Exception as err:  # a form the tracer does not know must never fail the user's pipeline
        return [f"the attention's layout could not be read ({type(err).__name__}: {err}); it stays in TVM"]
    return layout_problems(layout)


def layout_problems(layout: AttentionLayout) -> list[str]:
    """The kernel's own limits: static head dims, 4-element rows, the head dim innermost."""
    problems = []
    for axis in ("H", "V", "N"):
        if not isinstance(layout.sizes[axis], tvm.tirx.IntImm):
            problems.append(f"the {'heads' if axis == 'N' else 'head dim'} must be static")
    if problems:
        return problems
    h, hv = int(layout.sizes["H"]), int(layout.sizes["V"])
    if h % 4 or hv % 4:
        problems.append(f"head dims {h}/{hv} must be multiples of 4 (CUTLASS fMHA's narrowest vector)")
    if max(h, hv) > 512:
        problems.append(f"head dim {max(h, hv)} is over 512")
    outer_head_dims, merged_symbolic = [], []
    for (what, axes), reads, rank in zip(OPERAND_AXES, layout.reads, layout.ranks, strict=True):
        if reads[3] != (rank - 1, 1):
            outer_head_dims.append(f"the {what}'s head dim is not its innermost axis (the kernel reads rows of it)")
        held: dict[int, list[str]] = {}
        for axis, (dim, _) in zip(axes, reads, strict=True):
            if static_dim(layout.sizes[axis]) is None:
                held.setdefault(dim, []).append(axis)
        if any(len(symbolic) > 1 for symbolic in held.values()):
            merged_symbolic.append(f"the {what} merges two symbolic axes into one dimension")
    problems += outer_head_dims + merged_symbolic
    ranks = dict(zip(("query", "key", "value"), layout.ranks, strict=True))
    for role, dim, first, _ in layout.slices:
        # the kernels load 16-byte vectors (TMA: a 16-byte aligned base); the dim's stride is
        # checked at run time, the part's first element here where it is the innermost dim
        if dim == ranks[role] - 1 and first % 8:
            problems.append(
                f"the {role} starts at element {first} of its packed projection's rows, no 16-byte boundary"
            )
    if layout.bias is not None:
        if layout.bias[3] != (layout.bias_rank - 1, 1):
            problems.append("the additive mask/bias is not contiguous along the keys (the kernel reads rows of it)")
    if not np.isfinite(layout.scale) or layout.scale == 0:
        problems.append(f"scale {layout.scale} is not a finite non-zero number")
    if layout.softcap is not None and (not np.isfinite(layout.softcap) or layout.softcap == 0):
        problems.append(f"soft-cap {layout.softcap} (c of c * tanh(scores / c)) is not a finite non-zero number")
    return problems


def read_problem(spec, ann, out_expr, var2val, _accumulator: str = "float32") -> AttentionProblem:
    layout = attention_layout(spec, ann, out_expr, var2val)

    def size(axis: str) -> int | None:
        d = layout.sizes[axis]
        return int(d) if hasattr(d, "value") else None

    return AttentionProblem(
        batch=size("B"),
        heads=int(layout.sizes["N"]),
        seq_q=size("S"),
        seq_kv=size("T"),
        head_dim=int(layout.sizes["H"]),
        head_dim_value=int(layout.sizes["V"]),
        scale=layout.scale,
        element=dtype_of(ann["query"]),
        query_reads=layout.query,
        key_reads=layout.key,
        value_reads=layout.value,
        bias_reads=layout.bias,
        masked_rows=layout.masked_rows,
        causal=layout.causal,
        kv_group=layout.kv_group,
        slices=layout.slices,
        softcap=layout.softcap,
    )


def attention_flops(call: relax.Call) -> int | None:
    """2 (S T H + S T V) B N of an R.nn.attention call on (B, S, N, H) query and (B, T, N, V)
    value, None where a shape is symbolic."""
    query, value = (known_dims(call.args[i]) for i in (0, 2))
    dims = [static_dim(d) for d in (query or []) + (value or [])]
    if query is None or value is None or None in dims:
        return None
    (b, s, n, h), t, v = dims[:4], dims[5], dims[7]
    return 2 * b * n * s * t * (h + v)
