"""Casts and views around attention rewritten to the forms its patterns match: repeated casts
merged, operand casts moved past the views and scales, batch-merged transposes made one permute,
sequence-first outputs split."""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from ..ir import rewrite_planned_bindings, use_counts
from .masks import BlockScopedMutator, is_matmul_result
from .patterns import ATTENTION_DTYPES
from .trace import expr_dims, is_op_call, known_dims, static_dim

# expand_dims: the first step of transformers' repeat_kv (grouped-query keys and values)
_OPERAND_CAST_VIEWS = ("relax.reshape", "relax.permute_dims", "relax.broadcast_to", "relax.expand_dims")
_SCALES = ("relax.multiply", "relax.divide")


def _scalar(expr) -> bool:
    """`expr` is a float32 scalar constant."""
    return isinstance(expr, tvm.ir.GenericConst) and str(expr.ty.dtype) == "float32" and expr.value.numpy().size == 1


def _power_of_two(expr) -> bool:
    """`expr` is a float32 scalar constant 2**k, |k| <= 64."""
    if not _scalar(expr):
        return False
    mantissa, exponent = math.frexp(float(expr.value.numpy().reshape(-1)[0]))
    return mantissa == 0.5 and abs(exponent - 1) <= 64


def _is_op_call(expr) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)


class _OperandCasts:
    """Plans `cast_attention_operands`: which float32 -> 16-bit casts of a matmul operand move up."""

    def __init__(self, func: relax.Function):
        self.var2val = get_var2val(func)
        self.uses = use_counts(func)

    def value(self, expr):
        return self.var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def narrow_source(self, expr, dtype: str):
        """The `dtype` tensor whose float32 copy `expr` is (through take), or None."""
        value = self.value(expr)
        if not _is_op_call(value):
            return None
        if value.op.name == "relax.astype":
            return value.args[0] if str(value.args[0].ty.dtype) == dtype else None
        if value.op.name == "relax.take":
            return self.narrow_source(value.args[0], dtype)
        return None

    def chain(self, x, dtype: str, computed: bool) -> tuple[relax.Expr, list[relax.Call]] | None:
        """(base, [calls from base to x]) of the views and scalar scales leading to float32 `x`,
        each intermediate used once, base the float32 copy of a `dtype` tensor (through take) or,
        where `computed`, any float32 tensor; None otherwise."""
        calls: list[relax.Call] = []
        while isinstance(x, relax.Var) and self.uses.get(x, 0) == 1:
            value = self.value(x)
            if not _is_op_call(value) or str(value.ty.dtype) != "float32":
                break
            op = value.op.name
            if op in _OPERAND_CAST_VIEWS:
                calls.append(value)
                x = value.args[0]
            elif op in _SCALES:
                a, b = value.args
                if _scalar(b):
                    x = a
                elif op == "relax.multiply" and _scalar(a):
                    x = b
                else:
                    break
                calls.append(value)
            else:
                break
        if not calls or (not computed and self.narrow_source(x, dtype) is None):
            return None
        # A float32 copy of `dtype` values: the views run on the same values in `dtype`, and every
        # scale multiplies the same float32 values as before (bit-identical). Values computed in
        # float32 (q and k after a rotary embedding applied in float32) are rounded to `dtype` first
        # instead: bit-identical through views and power-of-two scales, within one rounding (1 ulp
        # of `dtype`, the precision the kernel reads q and k at anyway) through any other scale.
        return x, calls[::-1]


def _in_float16(call: relax.Call, dtype: str) -> bool:
    """A power-of-two scale of float16 values: exact in float32, so it can run in float16 (bfloat16
    ones, and other scales, run in float32 between casts)."""
    a, b = call.args
    return dtype == "float16" and _power_of_two(b if _scalar(b) else a)


@relax.expr_functor.mutator
class _CastOperands(relax.PyExprMutator):
    def __init__(self, plan: dict, known: _OperandCasts):
        super().__init__()
        self.plan, self.known = plan, known

    def narrow(self, expr, dtype: str):
        value = self.known.value(expr)
        if is_op_call(value, "relax.astype") and str(value.args[0].ty.dtype) == dtype:
            return self.visit_expr(value.args[0])
        if is_op_call(value, "relax.take") and self.known.narrow_source(value.args[0], dtype) is not None:
            source = self.narrow(value.args[0], dtype)
            axis = None if value.attrs.axis is None else int(value.attrs.axis)
            index = self.visit_expr(value.args[1])
            return self.builder_.emit(relax.op.take(source, index, axis=axis, mode=str(value.attrs.mode)))
        return self.builder_.emit(relax.op.astype(self.visit_expr(expr), dtype))

    def visit_var_binding_(self, binding):
        if binding.var not in self.plan:
            super().visit_var_binding_(binding)
            return
        base, calls, dtype = self.plan[binding.var]
        low = self.narrow(base, dtype)
        wide = False  # `low` is float32: from the first scale that cannot run in `dtype` to the last scale
        for i, call in enumerate(calls):
            op = call.op.name
            if op == "relax.permute_dims":
                low = relax.op.permute_dims(low, call.attrs.axes)
            elif op == "relax.reshape":
                low = relax.op.reshape(low, call.args[1])
            elif op == "relax.broadcast_to":
                low = relax.op.broadcast_to(low, call.args[1])
            elif op == "relax.expand_dims":
                low = relax.op.expand_dims(low, call.attrs.axis)
            elif wide or not _in_float16(call, dtype):
                if not wide:
                    low, wide = self.builder_.emit(relax.op.astype(low, "float32")), True
                a, b = call.args
                if op == "relax.divide":
                    low = relax.op.divide(low, b)
                else:
                    low = relax.op.multiply(low, b) if _scalar(b) else relax.op.multiply(a, low)
            else:
                a, b = call.args
                const = b if _power_of_two(b) else a
                half = relax.const(const.value.numpy().astype(dtype), dtype)
                if op == "relax.divide":
                    low = relax.op.divide(low, half)
                else:
                    low = relax.op.multiply(low, half) if const is b else relax.op.multiply(half, low)
            low = self.builder_.emit(low)
            if wide and not any(c.op.name in _SCALES for c in calls[i + 1 :]):
                # Round once, right after the last scale, as the original cast did: the views
                # after it move values only, so rounding before them is the same.
                low, wide = self.builder_.emit(relax.op.astype(low, dtype)), False
        self.set_var_remap(binding.var, low)


def cast_attention_operands(func: relax.Function) -> relax.Function:
    """matmul(astype(views(x), f16), ...) with float32 views -> the cast moved up to x, the views
    done in float16: torch.export of nn.MultiheadAttention after ToMixedPrecision splits heads,
    scales and transposes q, k and v in float32 and casts each just before its batched matmul,
    which hides the attention from its pattern (its operand views are those of the kernel's
    element type). Only where x is the float32 copy of 16-bit values (through take), and every
    step is bit-identical: the views (reshape, permute_dims, broadcast_to) change no value, so
    they run in the 16-bit type; a multiply or divide by a scalar 2**k (|k| <= 64) of float16
    values is exact in float32 and rounds once either way, so it runs in float16 too; any other
    scalar scale (ViT-B/16's 1/sqrt(8) on q and on k^T at head dim 64) runs in float32 on the
    same float32 values as before and is rounded right after it, as the original cast rounded
    (`astype(scale(astype(x16, f32)), f16)`, a form the operand pattern reads through; the
    kernel then applies the scales' product to the scores in float32). A cast whose input is
    astype(y, f16) to float32, possibly through take (the packed q/k/v projection split by
    index), becomes y (take of y): no cast at all. An operand of a batched matmul computed in
    float32 (q and k after a rotary embedding applied in float32, as transformers 5.24's Llama
    does) is rounded to 16 bits first, then as above: bit-identical through views and power-of-two
    scales, within one rounding through any other scale (the kernel reads q and k in 16 bits)."""
    known = _OperandCasts(func)
    plan: dict = {}
    for value in known.var2val.values():
        if not is_op_call(value, "relax.matmul"):
            continue
        for arg in value.args:
            cast = known.value(arg)
            if not (isinstance(arg, relax.Var) and is_op_call(cast, "relax.astype")) or arg in plan:
                continue
            dtype = str(cast.ty.dtype)
            if dtype not in ATTENTION_DTYPES or str(cast.args[0].ty.dtype) != "float32":
                continue
            # q, k and v of attention's batched matmuls may be computed in float32 (not 2-D weights' GEMMs)
            batched = all(len(expr_dims(a)) >= 3 for a in value.args)
            found = known.chain(cast.args[0], dtype, computed=batched)
            if found is not None:
                plan[arg] = (*found, dtype)
    if not plan:
        return func
    rewritten = _CastOperands(plan, known).visit_expr(func)
    return relax.analysis.remove_all_unused(rewritten)


@relax.expr_functor.mutator
class _MergeCasts(BlockScopedMutator):
    def __init__(self):
        super().__init__()
        self.reset_block_state()

    def reset_block_state(self) -> None:
        self.seen: dict = {}  # (source var, dtype) -> the first cast's var

    def visit_var_binding_(self, binding):
        value = binding.value
        if is_op_call(value, "relax.astype") and isinstance(binding.var, relax.DataflowVar):
            source = self.visit_expr(value.args[0])
            key = (source, str(value.ty.dtype))
            first = self.seen.get(key)
            if first is not None:
                self.set_var_remap(binding.var, first)
                return
            super().visit_var_binding_(binding)
            self.seen[key] = self.visit_expr(binding.var)
            return
        super().visit_var_binding_(binding)


def merge_repeated_casts(func: relax.Function) -> relax.Function:
    """Repeated astype(x, dtype) of one x in one block -> the first. ToMixedPrecision writes the
    float32 copy of the attention scores once for the softmax and once for torch's safe-softmax
    test; the attention pattern reads both as one value."""
    rewritten = _MergeCasts().visit_expr(func)
    return relax.analysis.remove_all_unused(rewritten)


def _split_output(mutator, binding, heads_first) -> relax.Expr:
    bsnv = mutator.builder_.emit(relax.op.permute_dims(mutator.visit_expr(heads_first), [0, 2, 1, 3]))
    return mutator.builder_.emit(relax.op.permute_dims(bsnv, [1, 0, 2, 3]))


def sequence_first_attention_outputs(func: relax.Function) -> relax.Function:
    """permute_dims chains taking a batched matmul's (B, N, S, V) result (through a reshape or a
    cast) to (S, B, N, V) -> one permute to (B, S, N, V), then one to (S, B, N, V).
    nn.MultiheadAttention is sequence-first: torch.export moves its heads back with three permutes
    that end in SBNV (torch.onnx with one), which the attention kernel (it writes BSNV) cannot
    write; split this way the region ends at the BSNV tensor and the last transpose stays in TVM.
    Permutes move values only: exact."""
    var2val = get_var2val(func)
    uses = use_counts(func)
    consumed = set()  # permutes whose result another permute takes
    for value in var2val.values():
        if is_op_call(value, "relax.permute_dims") and isinstance(value.args[0], relax.Var):
            consumed.add(value.args[0])
    plan = {}
    for var, value in var2val.items():
        if not is_op_call(value, "relax.permute_dims") or var in consumed or len(expr_dims(var)) != 4:
            continue
        axes = [0, 1, 2, 3]
        x = var
        while is_op_call(var2val.get(x), "relax.permute_dims") and (x is var or uses.get(x, 0) == 1):
            call = var2val[x]
            step = [int(a) for a in call.attrs.axes] if call.attrs.axes is not None else [3, 2, 1, 0]
            axes = [step[a] for a in axes]
            x = call.args[0]
        reshape = var2val.get(x)
        from_matmul = (is_op_call(reshape, "relax.reshape") and is_matmul_result(reshape.args[0], var2val, 1)) or (
            len(expr_dims(x)) == 4 and is_matmul_result(x, var2val, 2)  # torch.onnx: the 4-D matmul's cast
        )
        if axes == [2, 0, 1, 3] and from_matmul:
            plan[var] = x
    if not plan:
        return func
    return rewrite_planned_bindings(func, plan, _split_output)


def merged_batch_transposes(func: relax.Function) -> relax.Function:
    """reshape(permute_dims(reshape(x, (M, *rest)), (0, *p)), (*lead, *rest permuted by p)), x's
    leading dims and `lead` each of M elements -> permute_dims(reshape(x, (*lead, *rest)), p
    shifted): a transpose written on a batch-merged view, its batch merged and split back (the
    reshape goes where `lead` is x's own leading dims). torch.onnx's dynamo export writes k^T of an
    attention so: (B, N, T, H) to (B*N, T, H), transposed, back to (B, N, H, T); grouped-query keys
    repeated as (B, N_kv, G, T, H) to (B*N_kv*G, T, H), transposed, to (B, N_kv*G, H, T). Rewritten,
    the keys reach the matmul through the views the attention pattern follows (repeat_kv's reshape,
    then one transpose). Values are unchanged."""
    x = wildcard()
    inner = is_op("relax.reshape")(x, wildcard())
    transpose = is_op("relax.permute_dims")(inner)
    pattern = is_op("relax.reshape")(transpose, wildcard())
    analyzer = tvm.sym.Analyzer()

    def same(a: list, b: list) -> bool:
        return len(a) == len(b) and all(analyzer.can_prove_equal(p, q) for p, q in zip(a, b, strict=True))

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        source, middle, out = known_dims(m[x]), known_dims(m[inner]), known_dims(orig)
        axes = m[transpose].attrs.axes
        if source is None or middle is None or out is None or axes is None or int(axes[0]) != 0:
            return orig
        merged = len(source) - len(middle) + 1  # x's leading dims merged into one
        lead = len(out) - len(middle) + 1  # the dims the merged one splits back into
        rest = [int(a) for a in axes[1:]]
        if merged < 2 or lead < 1 or not same(source[merged:], middle[1:]):
            return orig
        if not same([math.prod(source[:merged])], [middle[0]]) or not same([math.prod(out[:lead])], [middle[0]]):
            return orig
        if not same(out[lead:], [middle[a] for a in rest]):
            return orig
        view = m[x] if same(out[:lead], source[:merged]) else relax.op.reshape(m[x], [*out[:lead], *middle[1:]])
        return relax.op.permute_dims(view, list(range(lead)) + [a + lead - 1 for a in rest])

    return rewrite_call(pattern, rewriter, func)


def _split_factors(dims: list, new: list) -> list[list[int]] | None:
    """For each of `dims`, the consecutive sizes of `new` it splits into, where a reshape from
    `dims` to `new` only splits dims (all static); None for any other reshape."""
    if any(static_dim(v) is None for v in [*dims, *new]):
        return None
    groups, j = [], 0
    for d in (static_dim(v) for v in dims):
        if j == len(new):
            return None
        group = [static_dim(new[j])]
        j += 1
        while math.prod(group) < d and j < len(new):
            group.append(static_dim(new[j]))
            j += 1
        if math.prod(group) != d:
            return None
        groups.append(group)
    return groups if j == len(new) else None


def splits_before_transposes(func: relax.Function) -> relax.Function:
    """reshape(permute_dims(x, p), sizes), the reshape only splitting dims -> permute_dims of x
    reshaped with those splits (two permutes before the reshape are composed into one).
    torch.onnx's dynamo export of nn.MultiheadAttention transposes k as (S, B*N, H) ->
    (B*N, S, H) -> (B*N, H, S) and then splits B*N: written so, the split reaches x's reshape
    (one view of the packed projection) and the transpose comes after it, as the attention pattern
    follows k. Values are unchanged; a permute not followed by such a split is left alone."""
    x, sizes = wildcard(), wildcard()
    once = is_op("relax.permute_dims")(x)
    twice = is_op("relax.permute_dims")(once)

    def move_split(orig: relax.Expr, m: dict, permutes: list) -> relax.Expr:
        source, permuted, out = known_dims(m[x]), known_dims(orig.args[0]), known_dims(orig)
        if source is None or permuted is None or out is None or len(out) == len(permuted):
            return orig
        if any(p.attrs.axes is None for p in permutes):
            return orig
        axes = list(range(len(source)))
        for p in permutes:  # innermost first
            axes = [axes[int(a)] for a in p.attrs.axes]
        groups = _split_factors(permuted, out)
        if groups is None:
            return orig
        by_source = {axes[i]: group for i, group in enumerate(groups)}  # x's dims, as the sizes they split into
        starts, sizes_in_x = {}, []
        for k in range(len(source)):
            starts[k] = len(sizes_in_x)
            sizes_in_x += by_source[k]
        order = [starts[axes[i]] + j for i, group in enumerate(groups) for j in range(len(group))]
        return relax.op.permute_dims(relax.op.reshape(m[x], sizes_in_x), order)

    func = rewrite_call(
        is_op("relax.reshape")(twice, sizes), lambda orig, m: move_split(orig, m, [m[once], m[twice]]), func
    )
    return rewrite_call(is_op("relax.reshape")(once, sizes), lambda orig, m: move_split(orig, m, [m[once]]), func)
