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

from ..kinds.ir import static_shape

# Leaves an input-free value may read besides constants: shapes and scalars spelled out.
_LEAVES = (relax.ShapeExpr, tvm.tirx.IntImm, tvm.tirx.FloatImm)

# Beyond this many elements a value is not evaluated (2**26: an 8192 x 8192 mask).
MAX_ELEMENTS = 1 << 26


def input_free_bindings(func: relax.Function, expr: relax.Expr, var2val=None) -> list[relax.VarBinding] | None:
    """The bindings `expr` depends on, in the function's order, when it reads no parameter and
    every call on the way is a pure operator with static shapes; None otherwise."""
    var2val = get_var2val(func) if var2val is None else var2val
    needed: set = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (tvm.ir.GenericConst, *_LEAVES)):
            continue
        if isinstance(node, relax.Tuple):
            stack.extend(node.fields)
            continue
        if isinstance(node, relax.Var):
            if node in needed:
                continue
            value = var2val.get(node)
            if value is None:  # a parameter, or bound by a match_cast / outside the function
                return None
            needed.add(node)
            stack.append(value)
            continue
        if not isinstance(node, relax.Call) or not isinstance(node.op, tvm.ir.Op):
            return None
        if node.op.name.startswith("relax.call_") or node.op.get_attr("FPurity") is False:
            return None
        if isinstance(node.ty, relax.TensorType) and static_shape(node) is None:
            return None
        stack.extend(node.args)
    bindings = [
        b for block in func.body.blocks for b in block.bindings if b.var in needed and isinstance(b, relax.VarBinding)
    ]
    return bindings if len(bindings) == len(needed) else None


def evaluate_input_free(func: relax.Function, var: relax.Var, var2val=None) -> np.ndarray | None:
    """The value of `var` (a tensor computed from no input of `func`), evaluated on the CPU; None
    when it depends on an input, is too large, or does not build or run (never an error: callers
    then leave the graph as it is)."""
    shape = static_shape(var) if isinstance(var.ty, relax.TensorType) else None
    if shape is None or int(np.prod(shape)) > MAX_ELEMENTS:
        return None
    if var2val is None:
        var2val = get_var2val(func)
    value = var2val.get(var)
    if isinstance(value, tvm.ir.GenericConst):
        return value.value.numpy()
    bindings = input_free_bindings(func, var, var2val)
    if not bindings:
        return None
    out = relax.Var("value", var.ty)
    block = relax.DataflowBlock([*bindings, relax.VarBinding(out, var)])
    probe = relax.Function([], relax.SeqExpr([block], out), var.ty)
    try:
        ex = tvm.compile(tvm.IRModule({"main": probe}), tvm.target.Target({"kind": "llvm", "opt-level": 1}))
        return relax.VirtualMachine(ex, tvm.cpu())["main"]().numpy()
    except Exception:  # an op the CPU build lacks: the value stays unknown
        return None
