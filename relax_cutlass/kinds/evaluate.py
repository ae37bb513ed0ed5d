"""Evaluating, at build time, a value a function computes from no input.

Frontends leave tensors in a model that depend only on constants and `arange`s (Hugging Face's
causal mask: arange -> cumsum -> index_tensor -> where(..., 0, -inf)); FoldConstant does not fold
them (its size and op limits), so every inference recomputes them. A rewrite that needs to know
such a tensor's values (is this mask causal?) builds the bindings it depends on into a function of
no arguments, compiles it for the CPU and runs it once.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val

from .ir import static_shape

# Leaves an input-free value may read besides constants: shapes and scalars spelled out.
_LEAVES = (relax.ShapeExpr, tvm.tirx.IntImm, tvm.tirx.FloatImm)

# Beyond this many elements a value is not evaluated (2**26: an 8192 x 8192 mask).
MAX_ELEMENTS = 1 << 26


def _reads_no_input(node, free: set) -> bool:
    """`node` (a binding's value) reads only constants, spelled-out shapes and scalars, and vars of
    `free`, through pure operators with static shapes."""
    if isinstance(node, (tvm.ir.GenericConst, *_LEAVES)):
        return True
    if isinstance(node, relax.Tuple):
        return all(_reads_no_input(f, free) for f in node.fields)
    if isinstance(node, relax.Var):
        return node in free
    if not isinstance(node, relax.Call) or not isinstance(node.op, tvm.ir.Op):
        return False
    if node.op.name.startswith("relax.call_") or node.op.get_attr("FPurity") is False:
        return False
    if isinstance(node.ty, relax.TensorType) and static_shape(node) is None:
        return False
    return all(_reads_no_input(a, free) for a in node.args)


def input_free_vars(func: relax.Function) -> set:
    """The vars of `func` computed from no parameter (one pass over the bindings, in order)."""
    free: set = set()
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b, relax.VarBinding) and _reads_no_input(b.value, free):
                free.add(b.var)
    return free


def is_input_free(expr: relax.Expr, free: set) -> bool:
    """`expr` is a constant, or a var computed from no input (`free`: `input_free_vars(func)`)."""
    return isinstance(expr, tvm.ir.GenericConst) or (isinstance(expr, relax.Var) and expr in free)


def input_free_bindings(func: relax.Function, var: relax.Var, free: set | None = None) -> list[relax.VarBinding] | None:
    """The bindings input-free `var` depends on, in the function's order; None when `var` reads a
    parameter (`free`: `input_free_vars(func)`, when the caller already has it)."""
    free = input_free_vars(func) if free is None else free
    if var not in free:
        return None
    var2val = get_var2val(func)
    needed: set = set()
    stack = [var]
    while stack:
        v = stack.pop()
        if v not in needed:
            needed.add(v)
            stack.extend(relax.analysis.free_vars(var2val[v]))
    return [b for block in func.body.blocks for b in block.bindings if b.var in needed]


# LLVM at -O0: each value is built, run once on a small tensor and dropped, so optimizing its loops
# buys nothing; no level changes IEEE float results.
EVALUATION_TARGET = tvm.target.Target({"kind": "llvm", "opt-level": 0})


def evaluate_input_free(func: relax.Function, var: relax.Var, free: set | None = None) -> np.ndarray | None:
    """The value of `var` (a tensor computed from no input of `func`), evaluated on the CPU; None
    when it depends on an input, is too large, or does not build or run (never an error: callers
    then leave the graph as it is). `free`: as for `input_free_bindings`."""
    shape = static_shape(var) if isinstance(var.ty, relax.TensorType) else None
    if shape is None or int(np.prod(shape)) > MAX_ELEMENTS:
        return None
    bindings = input_free_bindings(func, var, free)
    if not bindings:
        return None
    if isinstance(bindings[-1].value, tvm.ir.GenericConst):
        return bindings[-1].value.value.numpy()
    out = relax.Var("value", var.ty)
    block = relax.DataflowBlock([*bindings, relax.VarBinding(out, var)])
    probe = relax.Function([], relax.SeqExpr([block], out), var.ty)
    try:
        ex = tvm.compile(tvm.IRModule({"main": probe}), EVALUATION_TARGET)
        return relax.VirtualMachine(ex, tvm.cpu())["main"]().numpy()
    except Exception:  # an op the CPU build lacks: the value stays unknown
        return None
