"""Reading Relax expressions into the plain values the region records hold."""

from __future__ import annotations

import json
import math

import tvm
from tvm import relax


def dim(d) -> int | str:
    return int(d) if hasattr(d, "value") else str(d)


def shape_of(expr) -> tuple[int | str, ...]:
    if isinstance(expr.ty, relax.ShapeType):
        return tuple(dim(d) for d in expr.ty.values) if expr.ty.values is not None else ()
    return tuple(dim(d) for d in expr.ty.shape.values)


def dtype_or_shape(expr) -> str:
    return "shape" if isinstance(expr.ty, relax.ShapeType) else dtype_of(expr)


def accumulator_for(root, inputs, requested: str) -> str:
    # fp32 outputs and bf16 inputs always accumulate in fp32 (tensor cores have no bf16 accumulator).
    return "float32" if dtype_of(root) == "float32" or dtype_of(inputs) == "bfloat16" else requested


def dtype_of(expr: relax.Expr) -> str:
    """The tensor dtype of `expr` as a plain string ("float16")."""
    return str(expr.ty.dtype)


def tensor_dtype(expr: relax.Expr) -> str | None:
    """`dtype_of(expr)` where `expr` is a tensor, else None (a tuple, a shape)."""
    return dtype_of(expr) if isinstance(expr.ty, relax.TensorType) else None


def static_int(dim) -> int | None:
    """A dim as an int; None when it is symbolic."""
    return int(dim) if isinstance(dim, (int, tvm.tirx.IntImm)) else None


def static_product(dims) -> int | None:
    """The product of `dims` (the rows of the leading axes); None when one of them is symbolic."""
    product = 1
    for d in dims:
        if static_int(d) is None:
            return None
        product *= static_int(d)
    return product


def is_call(expr: relax.Expr, op: str) -> bool:
    """`expr` is a call of the operator named `op` ("relax.matmul")."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == op


def bound_value(expr: relax.Expr, var2val) -> relax.Expr:
    """What `expr` is bound to, where it is a var with a binding in `var2val`; else `expr` itself
    (a parameter, a constant)."""
    return var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr


def is_offloaded_function(func: relax.Function) -> bool:
    """A function that is an offloaded region (Codegen / Composite) or a fused primitive: its ops
    never reach TVM's own scheduler, so the rewrites of what stays in TVM leave it alone."""
    attrs = func.attrs
    return attrs is not None and any(key in attrs for key in ("Codegen", "Composite", "Primitive"))


def constant_value(expr: relax.Expr):
    """The numpy value of a constant; None for anything else."""
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def binding_readers(func: relax.Function) -> dict:
    """{var: [the bindings (or the body's result, None) that read it, one entry per read]}."""
    readers: dict = {}

    def reads(expr: relax.Expr, reader) -> None:
        def visit(e):
            if isinstance(e, relax.Var):
                readers.setdefault(e, []).append(reader)

        relax.analysis.post_order_visit(expr, visit)

    for block in func.body.blocks:
        for binding in block.bindings:
            reads(binding.value, binding)
    reads(func.body.body, None)
    return readers


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The tensor shape of `expr` as ints; None when it is unknown or has a symbolic dim."""
    values = getattr(getattr(expr.ty, "shape", None), "values", None)
    if values is None:
        return None
    dims = [static_int(d) for d in values]
    return None if None in dims else dims


def tensor_dims(expr: relax.Expr) -> list | None:
    """The tensor shape of `expr` as dims (ints or symbolic expressions); None when unknown."""
    values = getattr(getattr(expr.ty, "shape", None), "values", None)
    return None if values is None else list(values)


def shape_dims(expr: relax.Expr) -> list:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return []
    return list(ty.shape.values) if hasattr(ty.shape, "values") else list(ty.shape)


def same_shape(a: list, b: list) -> bool:
    """Both shapes provably equal, dim by dim (symbolic dims too)."""
    analyzer = tvm.sym.Analyzer()
    return len(a) == len(b) and all(analyzer.can_prove_equal(x, y) for x, y in zip(a, b, strict=True))


def is_depthwise(conv: relax.Call) -> bool:
    """A conv2d with groups == C == K > 1 (each output channel filters its own input channel): the
    depthwise kind's, where the conv2d kind takes groups == 1."""
    groups = int(conv.attrs.groups)
    data, weight = shape_dims(conv.args[0]), shape_dims(conv.args[1])  # the batch may be symbolic
    if groups == 1 or len(data) != 4 or len(weight) != 4:
        return False
    c = static_int(data[str(conv.attrs.data_layout).index("C")])
    k = static_int(weight[str(conv.attrs.kernel_layout).index("O")])
    return c == groups == k


def use_counts(func: relax.Function) -> dict:
    """{var: how many times the function's body reads it}: a rewrite may only move or drop a
    binding that nothing else reads."""
    uses: dict = {}

    def count(expr):
        if isinstance(expr, relax.Var):
            uses[expr] = uses.get(expr, 0) + 1

    relax.analysis.post_order_visit(func.body, count)
    return uses


@relax.expr_functor.mutator
class _PlannedBindings(relax.PyExprMutator):
    def __init__(self, plan: dict, rewrite):
        super().__init__()
        self.plan, self.rewrite = plan, rewrite

    def visit_var_binding_(self, binding):
        if binding.var not in self.plan:
            super().visit_var_binding_(binding)
            return
        self.set_var_remap(binding.var, self.rewrite(self, binding, self.plan[binding.var]))


def view_of_index(index, call: relax.Call):
    """The view `call` (permute_dims, or reshape / expand_dims / squeeze / a no-op broadcast_to, which
    keep the element order) applied to an index array of its input's elements, or None where the
    call moves data some other way (a broadcast that repeats it). The rewrites that decide on
    index arrays which views a rewrite may replace (packed q/k/v parts, row orders, view chains)
    read views through this one function."""
    if call.op.name == "relax.permute_dims":
        axes = call.attrs.axes
        return index.transpose([int(a) for a in axes] if axes is not None else None)
    shape = static_shape(call)
    if shape is None or math.prod(shape) != index.size:
        return None
    return index.reshape(shape)


def rewrite_planned_bindings(func: relax.Function, plan: dict, rewrite) -> relax.Function:
    """`func` with each binding whose var is a key of `plan` replaced: the var stands for what
    `rewrite(mutator, binding, plan[var])` returns (built with `mutator.visit_expr` and
    `mutator.builder_.emit`); the bindings nothing reads any more go."""
    return relax.analysis.remove_all_unused(_PlannedBindings(plan, rewrite).visit_expr(func))


def planned_rewrite(func: relax.Function, plan, rewrite) -> relax.Function:
    """`rewrite_planned_bindings(func, plan(func), rewrite)`, or `func` unchanged when nothing is
    planned or an unusual graph makes planning or rewriting raise: a rewrite never fails the
    user's pipeline."""
    try:
        planned = plan(func)
        return rewrite_planned_bindings(func, planned, rewrite) if planned else func
    except (tvm.TVMError, ValueError, TypeError, AttributeError):
        return func


def json_attr(mod: tvm.IRModule, name: str, default):
    """The JSON value the passes keep under module attribute `name` (the offload report's rows,
    refusals, returned regions), or `default` where the attribute is absent."""
    attrs = mod.attrs or {}
    return json.loads(str(attrs[name])) if name in attrs else default


def rules_at(pattern_of, rules, spec, call: relax.Call, var2val) -> list[str] | None:
    """The legality problems `rules` (a kind's) finds in `call` matched as the output of `spec`'s
    pattern (`pattern_of(spec)`: one that ends at its root op), or None where it does not match
    there: why an op a kind knows stayed in TVM, for the kind's `left_in_tvm` report row."""
    pattern, annotations = pattern_of(spec)
    matched = pattern.extract_matched_expr(call, var2val)
    if matched is None:
        return None
    ann = {name: matched[p] for name, p in annotations.items() if p in matched}
    return rules(spec, ann, call, var2val)


def is_scalar_constant(expr: relax.Expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and math.prod(expr.value.shape) == 1


@relax.expr_functor.mutator
class ConstantsToParams(relax.PyExprMutator):
    """Replace tensor constants with fresh Vars (one per constant, wherever it recurs), remembering
    which Var stands for which constant; scalars, and the constants in `visible`, stay."""

    def __init__(self, mod=None, name=lambda index, const: f"const_{index}", visible=()):
        super().__init__(mod)
        self.lifted: list[tuple[relax.Var, relax.Expr]] = []
        self.name = name
        self.visible = list(visible)

    def visit_generic_const_(self, const):
        if is_scalar_constant(const) or any(v.same_as(const) for v in self.visible):
            return const
        for var, seen in self.lifted:
            if seen.same_as(const):
                return var
        var = relax.Var(self.name(len(self.lifted), const), const.ty)
        self.lifted.append((var, const))
        return var


def rewrite_call_weights_hidden(pattern, rewriter, func: relax.Function, visible=()) -> relax.Function:
    """`relax.dpl.rewrite_call(pattern, rewriter, func)` with func's non-scalar constants standing in
    as Vars of the same type during the rewrite, and put back after. A rewrite that changes
    something costs TVM a structural hash of the whole function, weights' bytes included: about
    2 s per rewrite for one Llama-8B-shaped layer, 500 times what the same rewrite takes with
    the weights hidden (bench/import_cost.py). Only for patterns and rewriters that never look at
    a non-scalar constant's value or at whether an operand is one, except the constants in
    `visible`, which stay (as do scalars)."""
    hider = ConstantsToParams(name=lambda index, _const: f"weight_stand_in{index}", visible=visible)
    body = hider.visit_expr(func.body)
    if not hider.lifted:
        return relax.dpl.rewrite_call(pattern, rewriter, func)
    hidden = relax.Function(
        [*func.params, *(var for var, _ in hider.lifted)], body, func.ret_ty, func.is_pure, func.attrs, func.span
    )
    restored = relax.dpl.rewrite_call(pattern, rewriter, hidden).bind_params(dict(hider.lifted))
    return relax.Function(list(func.params), restored.body, restored.ret_ty, func.is_pure, func.attrs, func.span)
