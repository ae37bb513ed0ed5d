"""MakeGemmBroadcastsExplicit: keep a broadcasting consumer of a GEMM out of the GEMM's fused kernel.

TVM 0.27's default CUDA build cannot compile a conv2d or matmul whose output is *broadcast* by a
later elementwise op, as in a squeeze-excitation block (MobileNetV3, EfficientNet):

    s = hardsigmoid(conv2d(relu(conv2d(mean(x)))) + b)     # (N, 1, 1, C)
    y = s * x                                             # (N, H, W, C)

`AnnotateTIROpPattern` labels the legalized broadcasting `multiply` kElemWise (op_pattern 0, as
for a same-shape multiply; `broadcast_to` gets kBroadcast), so `FuseOps` fuses it into the conv's
kOutEWiseFusable group like any epilogue. The fused PrimFunc's output is then (N, H, W, C) while its
reduction writes (N, 1, 1, C). DLight's `gpu.Matmul` rule caches the reduction's output tile and
inlines every consumer into that cache-write stage; the multiply, whose iteration space is H*W
times larger, cannot be inlined, and the rule asserts "There are some consumers of the cache-write
stage that are not properly inlined." (With one row, N = 1, the Matmul rule does not apply and the
function builds; from N = 2 on it fails.)

The rewrite spells the broadcast out: `s * x` -> `broadcast_to(s, (N, H, W, C)) * x`. `broadcast_to`
is annotated kBroadcast, so the GEMM's group stops before it (a kOutEWiseFusable group only takes
consumers reached through elementwise edges) and it fuses into the multiply's kernel instead, where
it is only an index computation. The GEMM keeps its same-shape epilogue (bias, hardsigmoid); values
are unchanged. Only operands produced by a conv/matmul (possibly through ops of the same shape, as
FuseOps would fuse them) are touched, so bias adds, attention masks and the like stay as they are.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..kinds.epilogue_patterns import same_shape
from ..kinds.ir import is_offloaded_function

# Relax ops that FuseOps may fuse a GEMM into as an epilogue (their legalized form is a reduction
# that AnnotateTIROpPattern marks kOutEWiseFusable).
GEMM_OPS = frozenset(
    {
        "relax.matmul",
        "relax.nn.conv1d",
        "relax.nn.conv2d",
        "relax.nn.conv3d",
        "relax.nn.conv1d_transpose",
        "relax.nn.conv2d_transpose",
    }
)
# Elementwise ops that broadcast their operands (numpy rules).
BROADCASTING_OPS = frozenset(
    {
        "relax.add",
        "relax.subtract",
        "relax.multiply",
        "relax.divide",
        "relax.floor_divide",
        "relax.power",
        "relax.maximum",
        "relax.minimum",
        "relax.mod",
        "relax.floor_mod",
        "relax.where",
    }
)
_MAX_DEPTH = 64  # how far back through same-shape ops an operand is traced to a GEMM


def _op_name(expr: relax.Expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def _shape(expr: relax.Expr) -> list | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return list(ty.shape.values)


def _widened(operand: list, out: list) -> bool:
    """The op broadcasts the operand along some dim of its output (leading unit dims added by
    numpy's rule do not count: they leave the elements where they are)."""
    if len(operand) > len(out):
        return False
    return not same_shape([1] * (len(out) - len(operand)) + operand, out)


class _GemmTracer:
    """Is a value computed by a GEMM, through ops that keep its shape (the chain FuseOps fuses)?"""

    def __init__(self, var2val: dict):
        self.var2val = var2val
        self.memo: dict = {}

    def from_gemm(self, expr: relax.Expr, depth: int = 0) -> bool:
        if not isinstance(expr, relax.Var) or depth > _MAX_DEPTH:
            return False
        if expr in self.memo:
            return self.memo[expr]
        self.memo[expr] = False  # cycles cannot happen in a dataflow graph; this bounds the walk
        value = self.var2val.get(expr)
        name = _op_name(value)
        found = False
        if name in GEMM_OPS:
            found = True
        elif name is not None:
            shape = _shape(expr)
            if shape is not None:
                found = any(
                    self.from_gemm(arg, depth + 1)
                    for arg in value.args
                    if isinstance(arg, relax.Var) and (s := _shape(arg)) is not None and same_shape(s, shape)
                )
        self.memo[expr] = found
        return found


@mutator
class _ExplicitBroadcasts(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, var2val: dict):
        super().__init__(mod)
        self.tracer = _GemmTracer(var2val)
        self.rewritten = 0

    def visit_call_(self, call):
        widen = []
        if _op_name(call) in BROADCASTING_OPS and (out := _shape(call)) is not None:
            for i, arg in enumerate(call.args):
                shape = _shape(arg)
                if shape is not None and _widened(shape, out) and self.tracer.from_gemm(arg):
                    widen.append(i)
        new = super().visit_call_(call)
        if not widen:
            return new
        target = relax.ShapeExpr(_shape(call))
        args = [
            self.builder_.emit(relax.op.broadcast_to(a, target)) if i in widen else a for i, a in enumerate(new.args)
        ]
        self.rewritten += len(widen)
        return relax.Call(new.op, args, new.attrs, new.ty_args, new.span)


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.MakeGemmBroadcastsExplicit")
class MakeGemmBroadcastsExplicit:
    """`op(gemm_out, x)` broadcasting gemm_out -> `op(broadcast_to(gemm_out, shape), x)`, so that
    TVM's FuseOps does not fuse the broadcast into the GEMM's kernel (which DLight cannot schedule).

    A no-op on modules without such a broadcast. Offloaded functions (Codegen / Composite) are left
    alone: their GEMMs do not reach TVM's scheduler.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or is_offloaded_function(func):
                continue
            rewriter = _ExplicitBroadcasts(mod, relax.analysis.get_var2val(func))
            new_func = rewriter.visit_expr(func)
            if rewriter.rewritten:
                updates[gv] = new_func
        if not updates:
            return mod
        functions = {gv: updates.get(gv, func) for gv, func in mod.functions_items()}
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
