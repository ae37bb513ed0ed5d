"""Why an attention stayed in TVM, for the offload report's rows of its batched matmuls.

An attention that no pattern matches (BLOOM's ALiBi added beside a padding mask) leaves two
batched matmuls in TVM, and the GEMM kind's reason for them ("batched ND x ND matmul stays in TVM")
says nothing of the attention. This module finds, in a function, each
softmax whose input is computed from a matmul (q @ k^T, through elementwise ops and views) and
whose output feeds a matmul's left operand (@ v), and names the ops between the scores and the
softmax: the part the attention patterns did not read."""

from __future__ import annotations

import tvm
from tvm import relax

from ..ir import binding_readers

# ops that move or retype the scores without computing on them
VIEWS = frozenset(
    ("relax.astype", "relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze", "relax.broadcast_to")
)
# what the attention patterns read between the scores and the softmax: a scale, a mask or bias
# added, a masked fill (where), soft-capping's tanh, and their fp32 casts (views)
READ = frozenset(("relax.multiply", "relax.divide", "relax.add", "relax.where", "relax.tanh"))
_MAX_DEPTH = 24  # ops between a softmax and its scores' matmul (Gemma-2: 8)


def _call(expr, var2val) -> relax.Call | None:
    value = var2val.get(expr) if isinstance(expr, relax.Var) else expr
    return value if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else None


def _scores_path(expr, var2val, seen: set | None = None, depth: int = 0):
    """(the matmul computing the scores, the ops from it to `expr`, first to last), following every
    tensor operand back (each binding once: a residual network's adds would otherwise branch
    exponentially); None where no matmul is reached."""
    seen = set() if seen is None else seen
    call = _call(expr, var2val)
    if call is None or depth > _MAX_DEPTH or expr in seen:
        return None
    seen.add(expr)
    if call.op.name == "relax.matmul":
        return call, []
    if call.op.name == "relax.nn.softmax":  # another attention's probabilities: not these scores
        return None
    for arg in call.args:
        if isinstance(arg, relax.Var) and isinstance(arg.ty, relax.TensorType):
            found = _scores_path(arg, var2val, seen, depth + 1)
            if found is not None:
                return found[0], [*found[1], call]
    return None


def _describe(call: relax.Call) -> str:
    name = call.op.name.removeprefix("relax.").removeprefix("nn.")
    scalars = [a.value.numpy() for a in call.args if isinstance(a, tvm.ir.GenericConst) and a.value.numpy().size == 1]
    if name in ("multiply", "divide") and scalars:
        return f"{name} by {float(scalars[0].reshape(-1)[0]):g}"
    return name


def _attention_matmuls(func: relax.Function, var2val) -> dict[relax.Call, tuple[str, list[relax.Call]]]:
    """{matmul call: ("q @ k^T" | "@ v", the ops between the scores and the softmax)}."""
    readers = binding_readers(func)
    found = {}
    for var, value in var2val.items():
        softmax = _call(value, var2val)
        if softmax is None or softmax.op.name != "relax.nn.softmax":
            continue
        scores = _scores_path(softmax.args[0], var2val)
        if scores is None:
            continue
        # the probabilities, through views (and a safe softmax's where), as a matmul's left operand
        frontier, pv = [var], None
        while frontier and pv is None:
            current = frontier.pop()
            for reader in readers.get(current, []):
                call = _call(reader.value, var2val) if reader is not None else None
                if call is None:
                    continue
                if call.op.name == "relax.matmul" and call.args[0].same_as(current):
                    pv = call
                    break
                if call.op.name in VIEWS or call.op.name == "relax.where":  # where: a safe softmax's zero rows
                    frontier.append(reader.var)
        if pv is None:
            continue
        qk, path = scores
        found[qk] = ("q @ k^T", path)
        found[pv] = ("@ v", path)
    return found


def _note(role: str, path: list[relax.Call]) -> str:
    computed = [c for c in path if c.op.name not in VIEWS]
    unread = sorted({c.op.name.removeprefix("relax.") for c in computed if c.op.name not in READ})
    adds = sum(c.op.name == "relax.add" for c in computed)
    if unread:
        why = f"{', '.join(unread)} there is not a form the attention kernels compute"
    elif adds > 1:
        why = f"{adds} additions there (a position bias such as ALiBi beside a mask): no attention pattern reads them"
    else:
        why = (
            "no attention pattern matched this form, or its region was returned to TVM (see the [not fused] rows "
            "for a refused one, and any reason after this one)"
        )
    steps = " -> ".join(_describe(c) for c in computed) or "nothing"
    return (
        f"the {role} matmul of an attention (q @ k^T -> softmax -> @ v) left in TVM: between the scores and "
        f"the softmax it computes {steps}; {why}"
    )


def explain_left_in_tvm(func: relax.Function, var2val) -> dict[relax.Call, str]:
    """Notes for the report on `func`'s attention matmuls (left in TVM): which of an attention's two
    matmuls each is, and the ops between its scores and its softmax that no attention pattern read."""
    return {call: _note(role, path) for call, (role, path) in _attention_matmuls(func, var2val).items()}
