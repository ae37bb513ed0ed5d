"""SplitPackedGatedProjections: a gated MLP whose gate and up projections are one packed GEMM
becomes two GEMMs, so the gated-MLP pattern fuses the multiply into the gate GEMM's epilogue.

Phi-3 (and other models that pack `gate_up_proj`) compute `y = x @ W_gu` with N = 2 I, then
`gate, up = y.chunk(2, -1)` and `act(gate) * up`. torch.export writes the chunk as two
strided_slices of y's last axis. Left packed, the GEMM writes all 2 I columns and TVM reads them
back in a separate slice + activation + multiply kernel (a CPU probe of a transformers Phi-3 kept
every MLP multiply in TVM). Split at rewrite time into `x @ W_gate` and `x @ W_up` (the constant
weight's columns, and the bias's, sliced once; exact: each output element is the same dot
product), the activation and multiply fuse into one GEMM epilogue as for Llama's separate gate and
up layers.

A packed GEMM is split only when: its weight is a 2-D constant (and its bias, if any, a constant
(N,) vector in the output dtype); everything that reads its (biased) result is a strided_slice of
the last axis with unit stride, the slices tile [0, N) exactly, each a multiple of 8 columns; and
what reads the slices is elementwise (activations, multiplies, adds, casts). So a packed q|k|v
projection, whose slices are split into heads for the attention (which reads them in place), is
left alone, as is anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..kinds.ir import binding_readers, constant_value, is_call, planned_rewrite, static_int, tensor_dims
from .canonicalize import relax_functions
from .projections import PART_ALIGNMENT

# What may read a slice of a packed gated projection: the gate's activation (any form a frontend
# writes), the multiply, a bias or residual add, casts.
_ELEMENTWISE = frozenset(
    "relax." + op
    for op in (
        "multiply", "add", "subtract", "divide", "astype", "sigmoid", "tanh", "erf", "exp", "power",
        "nn.silu", "nn.gelu", "nn.gelu_tanh", "nn.relu", "clip", "maximum", "minimum",
    )
)  # fmt: skip


@dataclass(frozen=True)
class _Part:
    """One slice [lo, hi) of the packed GEMM, and the GEMM it becomes."""

    x: relax.Expr
    out_dtype: object  # the matmul's out_dtype attribute, kept as it was
    weight: relax.Expr
    bias: relax.Expr | None


def _unit_last_axis_slice(call: relax.Expr, rank: int, n: int) -> tuple[int, int] | None:
    """(lo, hi) of strided_slice(value, [last axis], [lo], [hi]) with unit stride, else None."""
    if not is_call(call, "relax.strided_slice") or len(call.args) < 4:
        return None
    axes, begin, end = (list(call.args[i]) for i in (1, 2, 3))
    strides = list(call.args[4]) if len(call.args) > 4 else []
    if len(axes) != 1 or any(static_int(v) != 1 for v in strides):
        return None
    axis, lo, hi = static_int(axes[0]), static_int(begin[0]), static_int(end[0])
    if axis is None or axis % rank != rank - 1 or lo is None or hi is None:
        return None
    hi = min(hi, n)
    return (lo, hi) if 0 <= lo < hi else None


def _plan(func: relax.Function) -> dict:
    """{slice var: _Part} for every packed gated projection of `func`."""
    if not isinstance(func.body, relax.SeqExpr):
        return {}
    users = binding_readers(func)
    plan: dict = {}
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in block.bindings:
            call = binding.value
            if not isinstance(binding, relax.VarBinding) or not is_call(call, "relax.matmul"):
                continue
            x, w = call.args
            weight, out = constant_value(w), tensor_dims(binding.var)
            if weight is None or weight.ndim != 2 or out is None or static_int(out[-1]) != weight.shape[1]:
                continue
            n, out_dtype = int(weight.shape[1]), str(binding.var.ty.dtype)
            final, bias = binding.var, None
            readers = users.get(final, [])
            if (
                len(readers) == 1
                and isinstance(readers[0], relax.VarBinding)
                and is_call(readers[0].value, "relax.add")
            ):
                a, b = readers[0].value.args
                other = b if a.same_as(final) else a
                bias = constant_value(other)
                if bias is None or bias.shape != (n,) or str(other.ty.dtype) != out_dtype:
                    continue
                final = readers[0].var
                readers = users.get(final, [])
            if not readers or not all(isinstance(r, relax.VarBinding) for r in readers):
                continue
            if len(readers) == 1 and is_call(readers[0].value, "relax.split"):
                # y.chunk(2, -1) as one split and its tuple items
                spans = _split_spans(readers[0].value, len(out), n)
                readers, spans = _items(readers[0].var, users, spans)
            else:
                spans = [_unit_last_axis_slice(r.value, len(out), n) for r in readers]
            if not readers or len(readers) < 2 or None in spans or sorted(spans) != _tiling(sorted(spans), n):
                continue
            if any((hi - lo) % PART_ALIGNMENT for lo, hi in spans):
                continue
            # only elementwise consumers: a head split (attention) keeps its packed projection
            if not all(_reads_elementwise(r.var, users) for r in readers):
                continue
            for r, (lo, hi) in zip(readers, spans, strict=True):
                part_weight = relax.const(np.ascontiguousarray(weight[:, lo:hi]), str(w.ty.dtype))
                part_bias = relax.const(np.ascontiguousarray(bias[lo:hi]), out_dtype) if bias is not None else None
                plan[r.var] = _Part(x, call.attrs.out_dtype, part_weight, part_bias)
    return plan


def _split_spans(call: relax.Call, rank: int, n: int) -> list[tuple[int, int]] | None:
    """The (lo, hi) column span of each output of split(value, ..., axis=last), else None."""
    axis = int(call.attrs.axis)
    if axis % rank != rank - 1:
        return None
    sections = call.attrs.indices_or_sections
    if isinstance(sections, (int, tvm.tirx.IntImm)):
        count = int(sections)
        if count < 1 or n % count:
            return None
        edges = [i * n // count for i in range(count + 1)]
    else:
        edges = [0, *(int(i) for i in sections), n]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _items(split: relax.Var, users: dict, spans) -> tuple[list, list]:
    """The bindings of `split`'s tuple items and each one's span, if items are all that read it."""
    readers = users.get(split, [])
    if spans is None or not readers:
        return [], []
    items = []
    for r in readers:
        if not (isinstance(r, relax.VarBinding) and isinstance(r.value, relax.TupleGetItem)):
            return [], []
        items.append((r, spans[int(r.value.index)]))
    return [r for r, _ in items], [span for _, span in items]


def _tiling(spans: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """`spans` if they tile [0, n) in order, else an empty list (never equal to two spans)."""
    edge = 0
    for lo, hi in spans:
        if lo != edge:
            return []
        edge = hi
    return spans if edge == n else []


def _reads_elementwise(var: relax.Var, users: dict) -> bool:
    readers = users.get(var, [])
    return bool(readers) and all(
        isinstance(r, relax.VarBinding)
        and isinstance(r.value, relax.Call)
        and isinstance(r.value.op, tvm.ir.Op)
        and r.value.op.name in _ELEMENTWISE
        for r in readers
    )


def _emit(mutator, _binding: relax.VarBinding, part: _Part) -> relax.Expr:
    y = mutator.builder_.emit(relax.op.matmul(mutator.visit_expr(part.x), part.weight, out_dtype=part.out_dtype))
    return mutator.builder_.emit(relax.op.add(y, part.bias)) if part.bias is not None else y


def split_packed_gated_projections(func: relax.Function) -> relax.Function:
    """slice_i(matmul(x, W) [+ b]) read elementwise -> matmul(x, W[:, slice_i]) [+ b[slice_i]]
    (see the module)."""
    return planned_rewrite(func, _plan, _emit)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.SplitPackedGatedProjections")
class SplitPackedGatedProjections:
    """A packed gate|up projection (Phi-3's gate_up_proj, chunked in two) -> two GEMMs on the
    weight's halves, so the gated-MLP pattern fuses act(gate) * up into one GEMM epilogue
    (`split_packed_gated_projections`). offload_pipeline runs it after FoldLinearReshapes."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return relax_functions(mod, split_packed_gated_projections)
