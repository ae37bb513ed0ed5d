"""Dataflow patterns for the regions relax_cutlass offloads, and the legality rules they must pass.

A pattern is built from a `GemmPatternSpec` (data), never from its name string; the spec is also what
codegen reads back from a composite's name, so partition and codegen cannot drift apart.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cache

import tvm
from tvm import relax
from tvm.relax.backend.patterns import make_residual_block_pattern
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from .kernel_spec import Epilogue

CODEGEN = "relax_cutlass"
SUPPORTED_INPUT_DTYPES = ("float16", "bfloat16")
SUPPORTED_OUTPUT_DTYPES = ("float16", "bfloat16", "float32")
ACCUMULATOR_DTYPES = ("float16", "float32")
FUSED_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")


@dataclass(frozen=True)
class GemmPatternSpec:
    """The shape of one composite: GEMM root, then bias, activation, residual add(+relu), cast."""

    b_transposed: bool  # rhs reaches the matmul through permute_dims: a (N, K) "dense" weight
    bias: bool = False
    activation: str = "identity"
    residual: bool = False
    residual_relu: bool = False
    cast: bool = False

    @property
    def name(self) -> str:
        parts = ["dense" if self.b_transposed else "matmul", *self.epilogue.parts()] + ["cast"] * self.cast
        return f"{CODEGEN}." + "_".join(parts)

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue(
            bias=self.bias,
            activation=self.activation,
            residual=self.residual,
            residual_activation="relu" if self.residual_relu else "identity",
        )

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
    """Every supported combination, largest first."""
    specs = [
        GemmPatternSpec(bt, bias, act, res, res_relu, cast)
        for bt, bias, act, res, res_relu, cast in itertools.product(
            (True, False),
            (True, False),
            ("identity", *FUSED_ACTIVATIONS),
            (True, False),
            (True, False),
            (True, False),
        )
        if res or not res_relu
    ]
    return sorted(specs, key=lambda s: -s.size)


# ---------------------------------------------------------------------------------------------
# Pattern construction
# ---------------------------------------------------------------------------------------------


def _gelu_erf_decomposed(x: DFPattern, ann: dict[str, DFPattern]) -> DFPattern:
    """0.5 * x * (1 + erf(x / sqrt(2))), in the arrangements frontends and FoldConstant produce.

    The scale may be a multiply by 1/sqrt(2) or a divide by sqrt(2); erf may run in fp32 between
    two casts. The three scalar constants are annotated so the check can verify their values.
    """
    c_inner, c_one, c_half = is_const(), is_const(), is_const()
    ann.update(gelu_inner=c_inner, gelu_one=c_one, gelu_half=c_half)
    scaled_mul = is_op("relax.multiply")(x, c_inner)
    scaled_div = is_op("relax.divide")(x, c_inner)
    ann.update(gelu_scaled_div=scaled_div)
    scaled = scaled_mul | scaled_div
    erf = is_op("relax.erf")(scaled) | is_op("relax.astype")(is_op("relax.erf")(is_op("relax.astype")(scaled)))
    one_plus = is_op("relax.add")(erf, c_one)
    mul = is_op("relax.multiply")
    return mul(mul(x, c_half), one_plus) | mul(mul(x, one_plus), c_half) | mul(x, mul(one_plus, c_half))


def _activation(name: str, x: DFPattern, ann: dict[str, DFPattern]) -> DFPattern:
    builders = {
        "relu": lambda: is_op("relax.nn.relu")(x),
        "gelu": lambda: is_op("relax.nn.gelu")(x) | _gelu_erf_decomposed(x, ann),
        "gelu_tanh": lambda: is_op("relax.nn.gelu_tanh")(x),
        "silu": lambda: is_op("relax.nn.silu")(x) | is_op("relax.multiply")(x, is_op("relax.sigmoid")(x)),
        "sigmoid": lambda: is_op("relax.sigmoid")(x),
    }
    return builders[name]()


@cache
def gemm_pattern(spec: GemmPatternSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Build the DFPattern for `spec` with annotations lhs, rhs, root, [bias], [residual], ..."""
    lhs, rhs = wildcard(), wildcard()
    ann: dict[str, DFPattern] = {"lhs": lhs, "rhs": rhs}
    rhs_in = rhs
    if spec.b_transposed:
        rhs_in = ann["transpose"] = is_op("relax.permute_dims")(rhs)
    out = ann["root"] = is_op("relax.matmul")(lhs, rhs_in)
    if spec.bias:
        ann["bias"] = bias = wildcard()
        out = ann["bias_add"] = is_op("relax.add")(out, bias)
    if spec.activation != "identity":
        out = _activation(spec.activation, out, ann)
    if spec.residual:
        out, ann = make_residual_block_pattern(
            (out, ann), binary_op="relax.add", activation="relax.nn.relu" if spec.residual_relu else None
        )
    if spec.cast:
        out = ann["cast"] = is_op("relax.astype")(out)
    return out, dict(ann)


@cache
def spec_by_name() -> dict[str, GemmPatternSpec]:
    return {s.name: s for s in all_gemm_specs()}


# ---------------------------------------------------------------------------------------------
# Legality: each rule returns the problems it finds as sentences, so the same rules drive the
# pattern check (offload or not) and the offload report (why not).
# ---------------------------------------------------------------------------------------------


def dtype_of(expr: relax.Expr) -> str:
    """The tensor dtype of `expr` as a plain string ("float16")."""
    return str(expr.ty.dtype)


def _static_int(dim) -> int | None:
    return int(dim) if isinstance(dim, (int, tvm.tirx.IntImm)) else None


def _shape(expr: relax.Expr) -> list:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return []
    return list(ty.shape.values) if hasattr(ty.shape, "values") else list(ty.shape)


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
    lshape, rshape = _shape(lhs), _shape(rhs)
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
        n, k = (_static_int(d) for d in rshape)
    else:
        k, n = (_static_int(d) for d in rshape)
    if k is None or n is None:
        problems.append("K and N must be static; only M (the leading dims of lhs) may be symbolic")
        return problems
    lhs_k = _static_int(lshape[-1])
    if lhs_k != k:
        problems.append(f"lhs inner dim {lshape[-1]} does not match the weight's K={k}")
    if k % 2 or n % 2:
        problems.append(
            f"K={k} and N={n} must both be even (fp16 tensor-op kernels need at least 2-element "
            "aligned rows); pad the weight to offload"
        )
    return problems


def _same_shape(a: list, b: list) -> bool:
    analyzer = tvm.sym.Analyzer()
    return len(a) == len(b) and all(analyzer.can_prove_equal(x, y) for x, y in zip(a, b, strict=True))


def epilogue_problems(spec: GemmPatternSpec, ann: dict[str, relax.Expr], out: relax.Expr) -> list[str]:
    """Why the matched epilogue cannot run inside the GEMM's epilogue (empty when it can)."""
    problems = []
    root = ann["root"]
    out_dtype = dtype_of(out)
    out_shape = _shape(out)
    n = _shape(root)[-1] if _shape(root) else None
    if out_dtype not in SUPPORTED_OUTPUT_DTYPES:
        problems.append(f"output dtype {out_dtype} is not one of {SUPPORTED_OUTPUT_DTYPES}")
    if not spec.cast and dtype_of(root) != out_dtype:
        problems.append("output dtype differs from the matmul's")
    if spec.cast and dtype_of(root) == out_dtype:
        problems.append("the cast does not change the dtype")
    if spec.bias:
        bias = ann["bias"]
        bshape = _shape(bias)
        numel = math.prod(int(d) for d in bshape) if all(_static_int(d) is not None for d in bshape) else None
        if not bshape or n is None or _static_int(bshape[-1]) != _static_int(n) or numel != _static_int(n):
            problems.append(f"bias shape {[str(d) for d in bshape]} is not a per-column vector of length N={n}")
        if dtype_of(bias) != out_dtype:
            problems.append(
                f"bias dtype {dtype_of(bias)} differs from the output dtype {out_dtype} "
                "(the CUTLASS epilogue reads bias as the output element type)"
            )
    if spec.residual:
        res = ann["residual"]
        if not _same_shape(_shape(res), out_shape):
            problems.append(
                f"residual shape {[str(d) for d in _shape(res)]} differs from the output shape "
                f"{[str(d) for d in out_shape]} (broadcast residuals are not fused)"
            )
        if dtype_of(res) != out_dtype:
            problems.append(f"residual dtype {dtype_of(res)} differs from the output dtype {out_dtype}")
    if "gelu_inner" in ann:
        problems += _gelu_constant_problems(ann)
    return problems


def _scalar(expr: relax.Expr) -> float | None:
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    value = expr.value.numpy()
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def _gelu_constant_problems(ann: dict[str, relax.Expr]) -> list[str]:
    inner_expected = math.sqrt(2.0) if "gelu_scaled_div" in ann else 1.0 / math.sqrt(2.0)
    expected = {"gelu_inner": inner_expected, "gelu_one": 1.0, "gelu_half": 0.5}
    problems = []
    for key, want in expected.items():
        got = _scalar(ann[key])
        if got is None or not math.isclose(got, want, rel_tol=2e-3):
            problems.append(f"decomposed gelu constant {key}={got} is not {want:.6f}: not an erf gelu")
    return problems


def region_problems(spec: GemmPatternSpec, ann: dict[str, relax.Expr], out: relax.Expr) -> list[str]:
    problems = matmul_problems(ann["root"], ann["rhs"], ann.get("transpose"))
    return problems or epilogue_problems(spec, ann, out)


def _make_check(spec: GemmPatternSpec):
    from tvm.relax.backend.utils import has_leaking_intermediate_variables

    def check(ctx: relax.transform.PatternCheckContext) -> bool:
        if has_leaking_intermediate_variables(ctx):
            return False
        ann = dict(ctx.annotated_expr)
        if spec.residual and not _residual_independent(ann, ctx):
            return False
        return not region_problems(spec, ann, ctx.matched_expr)

    return check


def _residual_independent(ann, ctx) -> bool:
    """The residual must not be computed from the GEMM itself (it would be read before written)."""
    from tvm.relax.backend.cuda.cutlass import _has_dependency

    residual = ann["residual"]
    if not isinstance(residual, relax.Var):
        residual = ctx.value_to_bound_var.get(residual)
        if residual is None:
            return False
    root_var = ctx.value_to_bound_var[ann["root"]]
    return not _has_dependency(from_var=residual, to_var=root_var, var_usages=ctx.var_usages)


def fusion_patterns() -> list[relax.transform.FusionPattern]:
    """All relax_cutlass patterns, in priority order, for FuseOpsByPattern."""
    return [
        relax.transform.FusionPattern(spec.name, *gemm_pattern(spec), _make_check(spec)) for spec in all_gemm_specs()
    ]
