"""The patterns of the GEMM kind (dense / matmul + epilogue), its legality rules, how a matched region
reads back into a GemmProblem, and the report row of a matmul left in TVM."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from .. import CODEGEN
from ..epilogue_patterns import (
    SUPPORTED_INPUT_DTYPES,
    SUPPORTED_OUTPUT_DTYPES,
    EpilogueSpec,
    dtype_of,
    epilogue_pattern,
    epilogue_specs,
    shape_dims,
    static_int,
)
from ..ir import accumulator_for, shape_of, static_shape
from .records import GemmProblem


@dataclass(frozen=True)
class GemmPatternSpec(EpilogueSpec):
    """The shape of one composite: GEMM root, then bias, activation, residual add(+relu) or
    multiply (a gated MLP's product), cast."""

    b_transposed: bool  # rhs reaches the matmul through permute_dims: a (N, K) "dense" weight
    bias: bool = False
    activation: str = "identity"
    residual: bool = False
    residual_relu: bool = False
    cast: bool = False
    residual_op: str = "add"  # RESIDUAL_OPS: "add", or "multiply" (gated MLPs)

    @property
    def name(self) -> str:
        parts = ["dense" if self.b_transposed else "matmul", *self.epilogue.parts()] + ["cast"] * self.cast
        return f"{CODEGEN}." + "_".join(parts)

    @property
    def size(self) -> int:
        """Operators covered: larger patterns are tried first so the longest fusion wins."""
        return (
            1
            + self.b_transposed
            + self.bias
            + (self.activation != "identity") * 2
            + (self.residual + self.residual_relu + self.cast)
        )


def all_gemm_specs() -> list[GemmPatternSpec]:
    """Every supported combination (b_transposed, epilogue, cast), largest first; the residual may
    also be a multiply (every GEMM family emits it: the SM80 residual block's binary functor, a
    compute node of the SM90 / SM100 EVT)."""
    return epilogue_specs(GemmPatternSpec, before=1, after=1, residual_ops=("add", "multiply"))


@cache
def gemm_pattern(spec: GemmPatternSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Build the DFPattern for `spec` with annotations lhs, rhs, root, [bias], [residual], ..."""
    lhs, rhs = wildcard(), wildcard()
    ann: dict[str, DFPattern] = {"lhs": lhs, "rhs": rhs}
    rhs_in = rhs
    if spec.b_transposed:
        rhs_in = ann["transpose"] = is_op("relax.permute_dims")(rhs)
    ann["root"] = root = is_op("relax.matmul")(lhs, rhs_in)
    out = epilogue_pattern(root, ann, spec)
    return out, dict(ann)


def matmul_problems(matmul: relax.Call, rhs: relax.Expr, transpose: relax.Call | None = None) -> list[str]:
    """Why this R.matmul cannot become a CUTLASS GEMM (empty when it can).

    `rhs` is the weight as stored; `transpose` the permute_dims call between it and the matmul, if any.
    """
    lhs = matmul.args[0]
    problems = []
    for role, e in (("lhs", lhs), ("rhs", rhs)):
        dtype = dtype_of(e)
        if dtype not in SUPPORTED_INPUT_DTYPES:
            problems.append(f"{role} dtype is {dtype}; only {'/'.join(SUPPORTED_INPUT_DTYPES)} inputs are offloaded")
    out_dtype = dtype_of(matmul)
    if out_dtype not in SUPPORTED_OUTPUT_DTYPES:
        problems.append(f"matmul out_dtype {out_dtype} is not one of {SUPPORTED_OUTPUT_DTYPES}")
    lshape, rshape = shape_dims(lhs), shape_dims(rhs)
    if len(lshape) < 2:
        problems.append(f"lhs has rank {len(lshape)}; a GEMM needs a (..., M, K) lhs of rank >= 2")
    if len(rshape) != 2:
        problems.append(
            f"rhs has rank {len(rshape)}; only a 2-D weight (ND x 2D matmul) is offloaded, "
            "batched ND x ND matmul stays in TVM"
        )
    if problems:
        return problems
    if transpose is not None:
        axes = transpose.attrs.axes
        if axes is not None and [int(a) for a in axes] != [1, 0]:
            problems.append(f"permute_dims axes {list(axes)} is not a 2-D transpose")
        n, k = (static_int(d) for d in rshape)
    else:
        k, n = (static_int(d) for d in rshape)
    if k is None or n is None:
        problems.append("K and N must be static; only M (the leading dims of lhs) may be symbolic")
        return problems
    lhs_k = static_int(lshape[-1])
    if lhs_k != k:
        problems.append(f"lhs inner dim {lshape[-1]} does not match the weight's K={k}")
    if k % 2 or n % 2:
        problems.append(
            f"K={k} and N={n} must both be even (fp16 tensor-op kernels need at least 2-element "
            "aligned rows); pad the weight to offload"
        )
    return problems


def read_problem(spec, ann, out_expr, _var2val, accumulator: str) -> GemmProblem:
    rhs_shape = shape_of(ann["rhs"])
    n, k = rhs_shape if spec.b_transposed else rhs_shape[::-1]
    m = 1
    for d in shape_of(ann["lhs"])[:-1]:
        m = m * d if isinstance(d, int) and isinstance(m, int) else None
    return GemmProblem(
        m=m,
        n=int(n),
        k=int(k),
        b_transposed=spec.b_transposed,
        element_a=dtype_of(ann["lhs"]),
        element_b=dtype_of(ann["rhs"]),
        element_out=dtype_of(out_expr),
        element_accumulator=accumulator_for(ann["root"], ann["lhs"], accumulator),
    )


def left_in_tvm_row(call: relax.Call, var2val, _layout_skipped: str | None) -> tuple:
    """(op, FLOPs, reasons) of a matmul left in TVM (FLOPs: 2 x output elements x K, None when a
    shape is symbolic)."""
    rhs = call.args[1]
    producer = var2val.get(rhs) if isinstance(rhs, relax.Var) else None
    transposed = (
        isinstance(producer, relax.Call)
        and isinstance(producer.op, tvm.ir.Op)
        and producer.op.name == "relax.permute_dims"
    )
    reasons = matmul_problems(call, producer.args[0], producer) if transposed else matmul_problems(call, rhs)
    rank = len(rhs.ty.shape.values) if getattr(rhs.ty, "shape", None) is not None else 0
    op = "batched matmul" if rank > 2 else ("dense" if transposed else "matmul")
    out, lhs = static_shape(call), static_shape(call.args[0])
    flops = None if out is None or lhs is None or static_shape(rhs) is None else 2 * math.prod(out) * lhs[-1]
    return op, flops, reasons
