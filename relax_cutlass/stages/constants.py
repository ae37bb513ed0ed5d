"""LiftConstants: no tensor data ever reaches generated C++.

After `bind_params_by_name` + `FoldConstant`, offloaded regions hold weights and folded biases as
`R.const` tensors. This pass makes each non-scalar constant a parameter of the offloaded function
(and of its composite), passed in by the caller, so the kernel reads it from device memory like any
other argument. Scalar constants (numel == 1, e.g. the 0.5 / 1/sqrt(2) / 1.0 of a decomposed gelu)
stay in the composite: codegen folds them into the kernel as literals.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..kinds import CODEGEN
from ..kinds.ir import ConstantsToParams


def _lift_function(func: relax.Function) -> tuple[relax.Function, list[relax.Expr]]:
    """func(params) -> func'(params + lifted), and the constants the caller must now pass."""
    lifter = ConstantsToParams()
    body = lifter.visit_expr(func.body)
    if not lifter.lifted:
        return func, []
    new_params = list(func.params) + [var for var, _ in lifter.lifted]
    new_func = relax.Function(new_params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
    return new_func, [const for _, const in lifter.lifted]


def composite_of(func: relax.Function) -> relax.Function:
    """The composite function an offloaded function wraps (FuseOpsByPattern, annotate_codegen)."""
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Function) and value.attrs and "Composite" in value.attrs:
                return value
    raise ValueError(f"offloaded function {func.attrs.get('global_symbol')} wraps no composite")


def _lift_offloaded(func: relax.Function) -> tuple[relax.Function, list[relax.Expr]]:
    """outer(p) { composite(p) } -> outer(p, c) { composite'(p, c) }, and the constants c."""
    composite, consts = _lift_function(composite_of(func))
    if not consts:
        return func, []
    params = list(func.params) + [relax.Var(f"const_{i}", c.ty) for i, c in enumerate(consts)]
    composite_var = relax.Var("local_func", composite.ty)
    out = relax.Var("output", func.ret_ty)
    body = relax.SeqExpr(
        [
            relax.BindingBlock(
                [
                    relax.VarBinding(composite_var, composite),
                    relax.VarBinding(out, relax.Call(composite_var, params)),
                ]
            )
        ],
        out,
    )
    return relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs, func.span), consts


@mutator
class _PassLiftedConstants(PyExprMutator):
    """At call sites of the rewritten offloaded functions, call the new function with the constants."""

    def __init__(self, mod, replaced: dict[tvm.ir.GlobalVar, tuple[tvm.ir.GlobalVar, list[relax.Expr]]]):
        super().__init__(mod)
        self.replaced = replaced

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.GlobalVar) and call.op in self.replaced:
            new_gv, consts = self.replaced[call.op]
            return relax.Call(new_gv, list(call.args) + consts, call.attrs, call.ty_args, call.span)
        return call


def offloaded_functions(mod: tvm.IRModule):
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and func.attrs and func.attrs.get("Codegen") == CODEGEN:
            yield gv, func


def call_counts(mod: tvm.IRModule) -> dict[str, int]:
    """How many call sites each offloaded function has, by its global symbol. Regions with the
    same shapes and no bound constants (weights passed as parameters) share one function."""
    symbols = {gv: str(func.attrs["global_symbol"]) for gv, func in offloaded_functions(mod)}
    counts = dict.fromkeys(symbols.values(), 0)

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op in symbols:
            counts[symbols[expr.op]] += 1

    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and gv not in symbols:
            relax.analysis.post_order_visit(func.body, visit)
    return counts


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.LiftConstants")
class LiftConstants:
    """Turn every non-scalar constant inside a relax_cutlass region into a caller-passed parameter."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        # A GlobalVar carries its function's type, so a function that gains parameters needs a new
        # GlobalVar (made by BlockBuilder.add_func, which types it) and every call site re-pointed.
        typer = relax.BlockBuilder()
        replaced = {}
        for gv, func in offloaded_functions(mod):
            new_func, consts = _lift_offloaded(func)
            if consts:
                replaced[gv] = (typer.add_func(new_func, gv.name_hint), consts)
        if not replaced:
            return mod
        caller = _PassLiftedConstants(mod, replaced)
        functions = {}
        for gv, func in mod.functions_items():
            if gv in replaced:
                new_gv = replaced[gv][0]
                functions[new_gv] = typer.get()[new_gv]
            elif isinstance(func, relax.Function):
                functions[gv] = caller.visit_expr(func)
            else:
                functions[gv] = func
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
