"""Attention masks brought to the form the kernel reads: additive float masks cast to the operand
dtype where exact (a swamping finite mask value kept distinguishable), `where` fills made scalar."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val
from tvm.relax.dpl import is_op, wildcard

from ..evaluate import input_free_vars, is_input_free
from ..ir import bound_value, rewrite_call_weights_hidden, same_shape, static_shape, use_counts
from .patterns import ATTENTION_DTYPES, VIEW_OPS, safe_softmax_tail
from .trace import is_op_call, known_dims, softmax_adds, static_dim

# A finite mask value at or below this swamps any float16 score in a float32 add: fl32(s + m) == m
# for |s| <= 65504 once ulp(m) / 2 > 65504, i.e. |m| >= 2**40 (finfo(float32).min, which Hugging
# Face's eager attention uses, is about 2**128).
SWAMPING_MASK = -(2.0**40)
# What a swamping float32 mask value becomes in a bfloat16 mask: finite, a power of two (exact in
# bfloat16), and still swamping every score below 2**76 in magnitude in the kernels' float32 add,
# so a masked key gets probability exactly 0 and a row whose every key is masked the uniform
# softmax of equal values, as with the float32 minimum. Not the bfloat16 minimum: the kernels scale
# the biased scores (by log2(e), or divide the bias by the softmax scale) in float32, which would
# overflow it to -inf, and a fully masked row would then be NaN, not the mean of the values.
BFLOAT16_SWAMPING_MASK = -(2.0**100)


_MASK_VIEWS = ("relax.broadcast_to", "relax.reshape", "relax.expand_dims", "relax.permute_dims", "relax.squeeze")
# ops whose result is 0 or 1 whatever their operands (`_MaskValues.bounds`)
_COMPARISONS = frozenset(
    f"relax.{name}"
    for name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_not",
                 "logical_and", "logical_or")
)  # fmt: skip
_ARITHMETIC = ("relax.add", "relax.subtract", "relax.multiply")
_MAX_BOUNDS_DEPTH = 64  # ops between a bias and its tables (T5's relative-position buckets: about 30)
_FLOAT16_MAX = float(np.finfo(np.float16).max)


class _TooDeep(Exception):
    """`_MaskValues.bounds` went deeper than _MAX_BOUNDS_DEPTH: no bound, and none of the
    expressions on the way is memoized (reached by a shorter path, one may have a bound)."""


def _exact_in(values: np.ndarray, dtype: str) -> bool:
    """Every value of `values` (float32) survives a round trip through `dtype`."""
    values = np.asarray(values, dtype="float32")
    if np.isnan(values).any():
        return False
    if dtype == "bfloat16":
        return bool((values.view("uint32") & 0xFFFF == 0).all())
    with np.errstate(over="ignore"):
        back = values.astype("float16").astype("float32")
    return bool((back == values).all())


class _MaskValues:
    """What the values of a float32 mask are known to be, from the bindings that produce it."""

    def __init__(self, var2val):
        self.var2val = var2val
        self._bounds: dict = {}  # expr -> bounds(expr): a bias's graph may share subexpressions

    def value(self, expr):
        return self.var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def constant(self, expr) -> np.ndarray | None:
        """The values of a constant-valued expression (a constant, full, casts and views of one)."""
        value = self.value(expr)
        if isinstance(value, tvm.ir.GenericConst):
            known = value.value.numpy()
            return known.astype("float32") if known.dtype.kind in "fiub" else None
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        op = value.op.name
        if op in _MASK_VIEWS:
            return self.constant(value.args[0])
        source = value.args[1] if op == "relax.full" else value.args[0] if op == "relax.astype" else None
        known = self.constant(source) if source is not None else None
        dtype = str(value.ty.dtype)
        if known is None or dtype not in ("float16", "float32", "float64", "bool", "int8", "int32", "int64"):
            return None
        return known.astype(dtype).astype("float32")

    def exact(self, expr, dtype: str) -> bool:
        """The expression's values are all exact in `dtype`."""
        known = self.constant(expr)
        if known is not None:
            return _exact_in(known, dtype)
        value = self.value(expr)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return False
        op = value.op.name
        if op in _MASK_VIEWS:
            return self.exact(value.args[0], dtype)
        if op == "relax.where":
            return self.exact(value.args[1], dtype) and self.exact(value.args[2], dtype)
        if op == "relax.take":  # rows of a table (T5's position bias): exact where the table is
            return self.exact(value.args[0], dtype)
        if op == "relax.astype":
            source = str(value.args[0].ty.dtype)
            if source in (dtype, "bool", "int8", "uint8"):
                return True
            return source == "float32" and self.exact(value.args[0], dtype)
        return False

    def bounds(self, expr) -> tuple[float, float] | None:
        """[lo, hi] holding every value of `expr`, where it is computed from weights and constants
        alone (tables read by take, constant masks, comparisons, views, casts, where, add,
        subtract, multiply and running sums of them); None where a value depends on an input's
        numbers, or on an op not known here. A comparison's result is 0 or 1 whatever it compares;
        a positive base's power (ALiBi's slopes) is monotonic in base and exponent."""
        try:
            return self._bounded(expr, 0)
        except _TooDeep:
            return None

    def _bounded(self, expr, depth: int) -> tuple[float, float] | None:
        if expr not in self._bounds:
            if depth > _MAX_BOUNDS_DEPTH:
                raise _TooDeep
            self._bounds[expr] = self._compute_bounds(expr, depth)
        return self._bounds[expr]

    def _compute_bounds(self, expr, depth: int) -> tuple[float, float] | None:
        value = self.value(expr)
        if isinstance(value, tvm.ir.GenericConst):
            known = value.value.numpy()
            if known.size == 0 or known.dtype.kind not in "fiub":
                return None
            known = known.astype("float64")
            return None if np.isnan(known).any() else (float(known.min()), float(known.max()))
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None  # a parameter: an input's values
        op = value.op.name
        if op in _COMPARISONS:
            return 0.0, 1.0
        if op in _MASK_VIEWS or op in ("relax.take", "relax.tile"):  # take: rows of a table, any indices
            return self._bounded(value.args[0], depth + 1)
        if op == "relax.astype":
            known = self._bounded(value.args[0], depth + 1)
            return None if known is None else ((0.0, 1.0) if str(value.ty.dtype) == "bool" else known)
        if op == "relax.full":
            return self._bounded(value.args[1], depth + 1)
        if op == "relax.arange":  # start, end, step: integer literals, or none known
            start, stop, step = value.args[:3]
            if all(isinstance(v, tvm.tirx.IntImm) for v in (start, stop, step)) and int(step.value) != 0:
                return tuple(sorted((float(start.value), float(stop.value - step.value))))
            return None
        if op == "relax.cumsum":  # BLOOM's key positions, counted from its attention mask
            return self._cumsum_bounds(value, depth)
        if op == "relax.power":  # ALiBi's slopes, base ** (-8 h / N), base > 0: monotonic in each operand
            parts = [self._bounded(arg, depth + 1) for arg in value.args]
            if None in parts or parts[0][0] <= 0:
                return None
            with np.errstate(all="ignore"):
                corners = [b**e for b in parts[0] for e in parts[1]]
            return None if not np.isfinite(corners).all() else (min(corners), max(corners))
        if op not in ("relax.where", *_ARITHMETIC):
            return None
        args = value.args[1:] if op == "relax.where" else value.args
        parts = [self._bounded(arg, depth + 1) for arg in args]
        if None in parts:
            return None
        (a_lo, a_hi), (b_lo, b_hi) = parts
        if op == "relax.where":
            return min(a_lo, b_lo), max(a_hi, b_hi)
        if op == "relax.add":
            return a_lo + b_lo, a_hi + b_hi
        if op == "relax.subtract":
            return a_lo - b_hi, a_hi - b_lo
        products = [a * b for a in (a_lo, a_hi) for b in (b_lo, b_hi)]
        return None if any(np.isnan(products)) else (min(products), max(products))

    def _cumsum_bounds(self, value: relax.Call, depth: int) -> tuple[float, float] | None:
        """A running sum of k <= n terms in [lo, hi] (n: the summed axis's length, or the size
        when it sums the flattened tensor) lies in [min(lo, n lo), max(hi, n hi)]."""
        known = self._bounded(value.args[0], depth + 1)
        shape = static_shape(value.args[0])
        if known is None or shape is None:
            return None
        axis = value.attrs.axis
        n = int(np.prod(shape)) if axis is None else shape[int(axis)]
        lo, hi = known
        return min(lo, n * lo), max(hi, n * hi)

    def rounds_like_weights(self, expr, dtype: str) -> bool:
        """The values of `expr` are computed from weights and constants (`bounds`) and lie within
        `dtype`'s finite range (float16's, for either 16-bit type: the kernels scale the bias in
        float32 and must not overflow): casting them to `dtype` rounds them as `from_torch(...,
        dtype=dtype)` rounds every weight of the model, with no value turning infinite. A relative
        position bias (BEiT, Swin, T5 from float32 weights) is such a tensor; a padding mask, from
        an input, or a mask value beyond float16's range (finfo(float32).min) is not."""
        known = self.bounds(expr)
        return known is not None and max(abs(known[0]), abs(known[1])) <= _FLOAT16_MAX

    def castable(self, expr, dtype: str) -> bool:
        """A float32 mask or bias the kernel may read in `dtype`: exact there, or a tensor of
        weights rounded as the model's other weights are (`rounds_like_weights`)."""
        return self.exact(expr, dtype) or self.rounds_like_weights(expr, dtype)

    def swamping_where(self, expr, dtype: str) -> tuple[relax.Call, int, float | relax.Expr] | None:
        """(where, index of its swamping branch, the other branch) for a float32 mask
        where(cond, kept, m) (either way round): m a finite scalar <= SWAMPING_MASK, kept a finite
        scalar exact in `dtype` (returned as its value) or a tensor whose values are provably exact
        in `dtype` (returned as the expression: T5's position bias, rows of an embedding table)."""
        where = self.value(expr)
        if not is_op_call(where, "relax.where"):
            return None
        for index in (2, 1):
            huge, kept = self.constant(where.args[index]), where.args[3 - index]
            if huge is None or huge.size != 1 or not np.isfinite(huge).all() or huge.reshape(-1)[0] > SWAMPING_MASK:
                continue
            value = self.constant(kept)
            if value is not None and value.size == 1:
                if np.isfinite(value).all() and _exact_in(value, dtype):
                    return where, index, float(value.reshape(-1)[0])
            elif self.castable(kept, dtype):
                return where, index, kept
        return None


def is_matmul_result(expr, var2val, depth: int = 8) -> bool:
    """`expr` is a matmul's result, through views, casts, scalar scales and a soft-capping tanh
    (the scores)."""
    for _ in range(depth):
        value = var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr
        if is_op_call(value, "relax.matmul"):
            return True
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return False
        if value.op.name not in (*VIEW_OPS, "relax.astype", "relax.multiply", "relax.divide", "relax.tanh"):
            return False
        expr = value.args[0]
    return False


def _plan_masks(func: relax.Function) -> tuple[dict, dict, dict, dict]:
    """-> ({add var: (mask index, element dtype, swamping where or None)}, {softmax var: keys},
    {NaN-test where var: softmax var} (`_nan_tails`), {the graph's own safe-softmax tail var:
    (keys, logits var)} (`_own_tail`): a softmax with its own tail gets 1/T as that
    tail's fill instead of a tail written after it)."""
    var2val = get_var2val(func)
    uses = use_counts(func)
    known = _MaskValues(var2val)
    adds, tails, own_tails = {}, {}, {}
    free = None  # input_free_vars(func), once needed
    for var, x, add in softmax_adds(var2val):
        if str(add.ty.dtype) != "float32":
            continue
        for index in (1, 0):
            mask, element = add.args[index], _cast_scores(add.args[1 - index], var2val)
            if element is not None and str(mask.ty.dtype) == "float32":
                break
        else:
            free = input_free_vars(func) if free is None else free
            term = _term_beside_causal_mask(add, var2val, known, free)
            if term is not None:
                adds[term[0]] = (term[1], term[2], None)
            continue
        if known.castable(mask, element):
            adds[x] = (index, element, None)
            continue
        swamping = known.swamping_where(mask, element)
        if swamping is not None and element == "bfloat16":  # a finite stand-in: no row changes
            adds[x] = (index, element, swamping)
            continue
        dims = known_dims(x)
        keys = static_dim(dims[-1]) if dims else None
        if swamping is None or not dims or int(var2val[var].attrs.axis) not in (-1, len(dims) - 1):
            continue
        # float16: -inf, and a tail that keeps a full row's mean: the graph's own safe-softmax
        # tail (which never fired with the finite mask) given that fill, else one written
        shared = uses.get(x, 0) != 1
        own_tail = _own_tail(var2val, uses, x, var) if shared else None
        if shared and own_tail is None:
            continue
        adds[x] = (index, element, swamping)
        if own_tail is not None:
            own_tails[own_tail] = (keys, x)
        else:
            tails[var] = keys
    return adds, tails, _nan_tails(var2val, tails), own_tails


def _cast_scores(expr, var2val) -> str | None:
    """The element type of scores cast to float32 (astype of a 16-bit matmul result), or None."""
    cast = bound_value(expr, var2val)
    if not is_op_call(cast, "relax.astype") or str(cast.args[0].ty.dtype) not in ATTENTION_DTYPES:
        return None
    return str(cast.args[0].ty.dtype) if is_matmul_result(cast.args[0], var2val) else None


def _term_beside_causal_mask(add: relax.Call, var2val, known: _MaskValues, free: set) -> tuple | None:
    """(the inner add's var, its term's index, the element type) for softmax((astype(scores, f32) +
    term) + mask), a float32 `term` castable to the scores' type (`castable`: BLOOM's ALiBi from
    constants) and a `mask` computed from no input (a causal mask, made canonical by
    `constant_causal_masks` after this); None for any other add."""
    for index in (1, 0):
        inner_var, mask = add.args[1 - index], add.args[index]
        inner = bound_value(inner_var, var2val)
        if not is_op_call(inner, "relax.add") or str(inner.ty.dtype) != "float32" or not is_input_free(mask, free):
            continue
        for term_index in (1, 0):
            scores, term = known.value(inner.args[1 - term_index]), inner.args[term_index]
            if is_op_call(scores, "relax.reshape"):  # BLOOM's, moved in front of its ALiBi
                scores = scores.args[0]
            element = _cast_scores(scores, var2val)
            if element is not None and str(term.ty.dtype) == "float32" and known.castable(term, element):
                return inner_var, term_index, element
    return None


def _own_tail(var2val, uses: dict, logits: relax.Var, probs: relax.Var) -> relax.Var | None:
    """The var of torch's safe-softmax tail (`safe_softmax_tail`, as the attention pattern reads it)
    on `logits` and its softmax `probs`, when `logits` feeds only the two, else None."""
    if uses.get(logits, 0) != 2:
        return None
    x, ann = wildcard(), {}
    tail = safe_softmax_tail(x, is_op("relax.nn.softmax")(x), ann)
    for var, value in var2val.items():
        if not is_op_call(value, "relax.where") or not value.args[2].same_as(probs):
            continue
        matched = tail.extract_matched_expr(value, var2val)  # a var's match is its bound value
        if not matched or not matched[x].same_as(var2val.get(logits, logits)):
            continue
        inf = matched[ann["tail_inf"]].value.numpy().reshape(-1)  # the row test's: -inf, or no such tail
        if inf.size == 1 and np.isneginf(inf[0]):
            return var
    return None


def _nan_tails(var2val, tails: dict) -> dict:
    """{where var: softmax var} for torch.onnx's safe softmax where(isnan(p), c, p) of a softmax
    that `cast_attention_masks` gives its own tail: with a finite mask no row is NaN, so that where
    never fired, and the tail written in its place (1/T on a fully masked row) already gives what
    the row gave."""
    found = {}
    for var, value in var2val.items():
        if not is_op_call(value, "relax.where") or not is_op_call(var2val.get(value.args[0]), "relax.isnan"):
            continue
        probs = value.args[2]
        if probs in tails and var2val[value.args[0]].args[0].same_as(probs):
            found[var] = probs
    return found


class BlockScopedMutator(relax.PyExprMutator):
    """A mutator whose memo of earlier bindings (`reset_block_state`) holds within one binding block:
    a var bound in another block is not in scope there."""

    def reset_block_state(self) -> None:
        raise NotImplementedError

    def visit_dataflow_block_(self, block):
        self.reset_block_state()
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block):
        self.reset_block_state()
        return super().visit_binding_block_(block)


@relax.expr_functor.mutator
class _CastMasks(BlockScopedMutator):
    def __init__(self, adds: dict, tails: dict, nan_tails: dict, own_tails: dict):
        super().__init__()
        self.adds, self.tails, self.nan_tails, self.own_tails = adds, tails, nan_tails, own_tails
        self.reset_block_state()

    def reset_block_state(self) -> None:
        self.cast: dict = {}  # mask var -> its float16 copy

    def visit_var_binding_(self, binding):
        var = binding.var
        if var in self.adds:
            index, element, swamping = self.adds[var]
            mask = self.visit_expr(binding.value.args[index])
            low = self.cast.get(mask)
            if low is None:
                if swamping is None:
                    low = self.builder_.emit(relax.op.astype(mask, element))
                else:  # float16: the swamping value becomes -inf (the tail below keeps what a full
                    # row gives); bfloat16: BFLOAT16_SWAMPING_MASK, which changes no row
                    where, huge, kept = swamping
                    fill = -np.inf if element == "float16" else BFLOAT16_SWAMPING_MASK
                    if isinstance(kept, float):
                        kept_low = relax.const(kept, element)
                    else:
                        kept_low = self.builder_.emit(relax.op.astype(self.visit_expr(kept), element))
                    branches = [kept_low, relax.const(fill, element)]
                    args = branches if huge == 2 else branches[::-1]
                    low = self.builder_.emit(relax.op.where(self.visit_expr(where.args[0]), *args))
                self.cast[mask] = low
            args = list(binding.value.args)
            args[index] = self.builder_.emit(relax.op.astype(low, "float32"))
            args[1 - index] = self.visit_expr(args[1 - index])
            self.set_var_remap(var, self.builder_.emit(relax.op.add(*args)))
            return
        if var in self.nan_tails:
            self.set_var_remap(var, self.visit_expr(self.nan_tails[var]))
            return
        if var in self.own_tails:  # the graph's own tail, its fill now 1/T
            keys, logits = self.own_tails[var]
            where = binding.value
            fill = self.uniform(self.visit_expr(logits), keys)
            self.set_var_remap(
                var,
                self.builder_.emit(
                    relax.op.where(self.visit_expr(where.args[0]), fill, self.visit_expr(where.args[2]))
                ),
            )
            return
        if var in self.tails:
            x = self.visit_expr(binding.value.args[0])
            probs = self.builder_.emit(relax.op.nn.softmax(x, axis=-1))
            emit = self.builder_.emit
            # torch's _safe_softmax test, so that the attention pattern reads it as such.
            finite = emit(relax.op.logical_not(emit(relax.op.equal(x, relax.const(-np.inf, "float32")))))
            row_any = emit(relax.op.max(emit(relax.op.astype(finite, "int8")), axis=[-1], keepdims=True))
            masked_row = emit(relax.op.logical_not(emit(relax.op.astype(row_any, "bool"))))
            self.set_var_remap(var, emit(relax.op.where(masked_row, self.uniform(x, self.tails[var]), probs)))
            return
        super().visit_var_binding_(binding)

    def uniform(self, logits: relax.Expr, keys: int | None) -> relax.Expr:
        """1/T: a constant for a static key count T, else the softmax of a row of zeros."""
        if keys is not None:
            return relax.const(np.float32(1.0) / np.float32(keys), "float32")
        emit = self.builder_.emit
        return emit(relax.op.nn.softmax(emit(relax.op.zeros_like(logits)), axis=-1))


def cast_attention_masks(func: relax.Function) -> relax.Function:
    """softmax(astype(scores, f32) + mask) with a float32 mask -> the same with the mask cast to
    the scores' (the kernel's) element type, where that changes no result:

    * the mask's values are provably exact in that type (a 0/-inf mask: `where(keep, 0, -inf)`,
      as torch's scaled_dot_product_attention writes a boolean mask): the cast is exact;
    * `where(keep, c, m)` for float16 scores, c finite and exact (a scalar, or a tensor such as
      T5's position bias, rows of an exact embedding table), m finite and <= -2**40 (Hugging
      Face's eager attention: c = 0, m = finfo(float32).min): m swamps every float16 score, so a
      masked key gets probability exactly 0, as with -inf, and a row whose every key is masked
      gets the uniform softmax of equal values. m becomes -inf, and torch's safe-softmax tail,
      with the value 1/T (not 0), keeps what such a row gives: the mean of the values (the
      graph's own tail where it has one, which never fired with the finite mask, else one written
      after the softmax). With a symbolic key count T the tail's 1/T is the softmax of a row of
      zeros (the attention pattern reads either as the kernel's "mean" rows). torch.onnx's own
      safe softmax after it, where(isnan(p), 0, p), never fired with the finite mask and goes.
    * the same for bfloat16 scores, m becoming BFLOAT16_SWAMPING_MASK: finite and swamping, it
      changes no row, and no tail is needed.

    Other float32 masks are left alone (the attention region then stays in TVM, saying why)."""
    adds, tails, nan_tails, own_tails = _plan_masks(func)
    if not adds:
        return func
    rewritten = _CastMasks(adds, tails, nan_tails, own_tails).visit_expr(func)
    return relax.analysis.remove_all_unused(rewritten)


def scalar_where_fills(func: relax.Function) -> relax.Function:
    """where(cond, constant tensor of one repeated value, x) -> where(cond, that scalar, x) when x
    has the result's shape. torch.export writes the 0 of its safe softmax as a zeros tensor of the
    scores' shape; as a scalar it stays a literal of the attention region rather than becoming a
    tensor argument of it. With a symbolic sequence length the zeros are `full_like(scores, 0)`
    (or `full(shape, 0)`), computed at run time: the same scalar."""
    cond, fill, x = wildcard(), wildcard(), wildcard()
    pattern = is_op("relax.where")(cond, fill, x)
    var2val = get_var2val(func)

    def fill_value(expr) -> np.ndarray | None:
        """The one value of a fill: a constant of one repeated value, or full/full_like of a scalar constant."""
        value = bound_value(expr, var2val)
        if isinstance(value, tvm.ir.GenericConst):
            values = value.value.numpy()
        elif is_op_call(value, "relax.full_like") or is_op_call(value, "relax.full"):
            source = value.args[1]
            if not isinstance(source, tvm.ir.GenericConst) or source.value.numpy().size != 1:
                return None
            values = source.value.numpy().astype(str(value.ty.dtype))
        else:
            return None
        if values.size == 0 or not (values == values.reshape(-1)[0]).all():
            return None
        return values.reshape(-1)[0]

    def rewriter(orig: relax.Expr, m: dict) -> relax.Expr:
        if isinstance(m[fill], tvm.ir.GenericConst) and m[fill].value.numpy().ndim == 0:
            return orig  # already a scalar
        value = fill_value(m[fill])
        if value is None:
            return orig
        dims, out = known_dims(m[x]), known_dims(orig)
        if dims is None or out is None or not same_shape(dims, out):
            return orig
        return relax.op.where(m[cond], relax.const(value, str(value.dtype)), m[x])

    # only the fills' own constants are read: every other weight may stand in as a Var
    fills = []

    def collect(expr):
        fill = bound_value(expr.args[1], var2val) if is_op_call(expr, "relax.where") else None
        if isinstance(fill, tvm.ir.GenericConst):
            fills.append(fill)

    relax.analysis.post_order_visit(func.body, collect)
    return rewrite_call_weights_hidden(pattern, rewriter, func, fills)
