"""FuseParallelProjections: q, k and v projected from one input by one GEMM, read in place by the attention.

BERT (and Llama) project q, k and v with three linear layers of the same input. On an H200, the
BERT-large profile (8 x 128 tokens, hidden 1024) spent 0.885 of its 2.09 ms in the 96 GEMMs of
1024 x 1024 x 1024 (q, k, v and the output projection of 24 layers): each has only 64 output tiles
of 128 x 128 for 132 SMs, about 230 TFLOP/s. One GEMM with N = 3 x 1024 has 192 tiles and runs much
closer to peak, and one launch replaces three.

`fuse_parallel_projections` rewrites such a group as one matmul with the weights (and biases)
concatenated on their output axis, at rewrite time (one new constant, no concat at run time), and
each member's result as `strided_slice(fused, [last axis], [lo], [hi])`: exactly the form
`packed_projection_slices` gives GPT-2's packed c_attn, which the attention pattern takes into its
region, so the kernel reads q, k and v in place through strides and an offset. Exact: each output
element is the same dot product (plus the same bias), the slice selects it.

Only projections that feed attention heads are fused: each one's (biased) result is used only by a
reshape that splits its last axis into (heads, head_dim). A gated MLP's gate and up projections
(fused separately, as one gated-MLP region) and any other parallel GEMMs are left alone. A group
also needs: the same lhs var, constant 2-D weights of the same K and dtype, the same out_dtype, a
constant (N_i,) bias on every member or on none, every N_i a multiple of 8 elements (each part
starts on a 16-byte boundary in fp16), at least two members, all in one dataflow block. Leading
dims may be symbolic; K and N must be static. Anything else leaves the group as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..kinds.ir import (
    binding_readers,
    constant_value,
    is_call,
    planned_rewrite,
    same_shape,
    static_int,
    tensor_dims,
)
from .canonicalize import relax_functions

# Each part's size must be a multiple of this many elements (16 bytes of fp16).
PART_ALIGNMENT = 8


@dataclass(eq=False)
class _Group:
    """Projections of one lhs fused into one GEMM; `fused` is set once the GEMM is emitted."""

    x: relax.Var
    out_dtype: object  # the matmul's out_dtype attribute, kept as it was (None: inferred)
    members: list = field(default_factory=list)
    keys: set = field(default_factory=set)  # the members' (K, dtypes, bias or not): one, to fuse
    weight: relax.Expr | None = None
    bias: relax.Expr | None = None
    fused: relax.Expr | None = None


@dataclass(frozen=True)
class _Member:
    matmul: relax.Var
    final: relax.Var  # the bias add's var, or the matmul's without a bias
    weight: np.ndarray
    bias: np.ndarray | None
    weight_dtype: str
    bias_dtype: str | None

    @property
    def n(self) -> int:
        return int(self.weight.shape[1])


def _only_user(var: relax.Var, users: dict, bindings: set) -> relax.VarBinding | None:
    """The one binding of this block that reads `var`, where nothing else reads it."""
    found = users.get(var, [])
    if len(found) != 1 or not isinstance(found[0], relax.VarBinding) or found[0] not in bindings:
        return None
    return found[0]


def _splits_heads(reshape: relax.Expr, final: relax.Var, n: int) -> bool:
    """reshape(final, (*leading dims of final, heads, head_dim)) with heads * head_dim == n."""
    if not is_call(reshape, "relax.reshape") or not reshape.args[0].same_as(final):
        return False
    source, target = tensor_dims(final), tensor_dims(reshape)
    if source is None or target is None or len(target) != len(source) + 1:
        return False
    heads, head_dim = static_int(target[-2]), static_int(target[-1])
    if heads is None or head_dim is None or heads * head_dim != n:
        return False
    return same_shape(source[:-1], target[:-2])


def _member(binding: relax.VarBinding, users: dict, bindings: set) -> tuple[tuple, _Member] | None:
    """(group key, member) when `binding` is a projection of its lhs that feeds attention heads."""
    call = binding.value
    if not is_call(call, "relax.matmul") or not isinstance(binding.var, relax.DataflowVar):
        return None
    x, w = call.args
    weight = constant_value(w)
    xdims, out = tensor_dims(x), tensor_dims(binding.var)
    if not isinstance(x, relax.Var) or weight is None or weight.ndim != 2 or xdims is None or out is None:
        return None
    k, n = (int(d) for d in weight.shape)
    if len(xdims) < 2 or len(out) != len(xdims) or static_int(xdims[-1]) != k or static_int(out[-1]) != n:
        return None
    out_dtype = str(binding.var.ty.dtype)
    final, bias, bias_dtype = binding.var, None, None
    user = _only_user(binding.var, users, bindings)
    if user is not None and is_call(user.value, "relax.add"):
        a, b = user.value.args
        other = b if a.same_as(binding.var) else a if b.same_as(binding.var) else None
        bias = constant_value(other) if other is not None else None
        if bias is None or bias.shape != (n,) or str(other.ty.dtype) != out_dtype:
            return None
        if not isinstance(user.var, relax.DataflowVar) or str(user.var.ty.dtype) != out_dtype:
            return None
        final, bias_dtype = user.var, out_dtype
        user = _only_user(final, users, bindings)
    if user is None or not _splits_heads(user.value, final, n):
        return None
    key = (x, k, str(w.ty.dtype), str(call.attrs.out_dtype), out_dtype, bias is not None)
    return key, _Member(binding.var, final, weight, bias, str(w.ty.dtype), bias_dtype)


def _plan(func: relax.Function) -> dict:
    """{var: (group, member index or None)} for the bindings of every fusable group."""
    if not isinstance(func.body, relax.SeqExpr):
        return {}
    users = binding_readers(func)
    plan: dict = {}
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        bindings = set(block.bindings)
        groups: dict[relax.Var, _Group] = {}
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            try:
                found = _member(binding, users, bindings)
            except (tvm.TVMError, ValueError, TypeError, AttributeError):  # never fail the pipeline
                continue
            if found is None:
                continue
            key, member = found
            group = groups.setdefault(key[0], _Group(key[0], binding.value.attrs.out_dtype))
            group.keys.add(key)
            group.members.append(member)
        for group in groups.values():
            members = group.members
            # All of x's head projections or none: fusing some (those with a bias, say) would leave
            # the attention one projection short of reading all of q, k and v in place.
            if len(group.keys) != 1 or len(members) < 2 or any(m.n % PART_ALIGNMENT for m in members):
                continue
            group.weight = relax.const(np.concatenate([m.weight for m in members], axis=1), members[0].weight_dtype)
            if members[0].bias is not None:
                group.bias = relax.const(np.concatenate([m.bias for m in members]), members[0].bias_dtype)
            for i, m in enumerate(members):
                plan[m.matmul] = (group, None)
                plan[m.final] = (group, i)
    return plan


def _emit(mutator, binding: relax.VarBinding, planned) -> relax.Expr:
    group, index = planned
    if group.fused is None:  # the group's first binding: its one GEMM, where the first member was
        fused = mutator.builder_.emit(
            relax.op.matmul(mutator.visit_expr(group.x), group.weight, out_dtype=group.out_dtype)
        )
        if group.bias is not None:
            fused = mutator.builder_.emit(relax.op.add(fused, group.bias))
        group.fused = fused
    if index is None:  # a member's matmul, before its bias: nothing reads it any more
        return group.fused
    lo = sum(m.n for m in group.members[:index])
    hi = lo + group.members[index].n
    last = len(tensor_dims(binding.var)) - 1
    return mutator.builder_.emit(relax.op.strided_slice(group.fused, axes=[last], begin=[lo], end=[hi]))


def fuse_parallel_projections(func: relax.Function) -> relax.Function:
    """matmul(x, W_i) [+ b_i] -> reshape to heads, for i = 1..n of one x -> one
    matmul(x, W_1 | ... | W_n) [+ b_1 | ... | b_n] and each part a strided_slice of its last axis
    (see the module)."""
    return planned_rewrite(func, _plan, _emit)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.FuseParallelProjections")
class FuseParallelProjections:
    """Parallel projections of one input that feed attention heads (BERT's and Llama's separate
    q, k and v linear layers) -> one GEMM on the concatenated weights and a strided_slice per
    projection, which the attention reads in place where nothing comes between
    (`fuse_parallel_projections`). offload_pipeline runs it after FoldLinearReshapes, on every
    Relax function but the offloaded regions."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return relax_functions(mod, fuse_parallel_projections)
