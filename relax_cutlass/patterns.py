"""Dataflow patterns for the regions relax_cutlass offloads, and the legality rules they must pass.

A pattern is built from a `GemmPatternSpec` (data), never from its name string; the spec is also what
codegen reads back from a composite's name, so partition and codegen cannot drift apart.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import tvm
from tvm import relax
from tvm.relax.backend.patterns import make_residual_block_pattern
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from .attention import ATTENTION_SPECS, AttentionPatternSpec, attention_pattern, attention_problems
from .kernel_spec import Epilogue

CODEGEN = "relax_cutlass"
SUPPORTED_INPUT_DTYPES = ("float16", "bfloat16")
SUPPORTED_OUTPUT_DTYPES = ("float16", "bfloat16", "float32")
ACCUMULATOR_DTYPES = ("float16", "float32")
# Built-in fused activations; `relax_cutlass.extend.register_activation` adds more (see
# `fused_activations`).
FUSED_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "hardswish")
# conv2d: NHWC activations x OHWI filters (what ConvertToNHWC produces).
CONV2D_LAYOUTS = {"data_layout": "NHWC", "kernel_layout": "OHWI", "out_layout": "NHWC"}


class _EpilogueSpec:
    """The epilogue fields (bias, activation, residual, residual_relu) every pattern spec has."""

    bias: bool
    activation: str
    residual: bool
    residual_relu: bool

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue(
            bias=self.bias,
            activation=self.activation,
            residual=self.residual,
            residual_activation="relu" if self.residual_relu else "identity",
        )


@dataclass(frozen=True)
class GemmPatternSpec(_EpilogueSpec):
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
            ("identity", *fused_activations()),
            (True, False),
            (True, False),
            (True, False),
        )
        if res or not res_relu
    ]
    return sorted(specs, key=lambda s: -s.size)


@dataclass(frozen=True)
class Conv2dPatternSpec(_EpilogueSpec):
    """The shape of one conv2d composite: conv2d root, then bias, activation, residual add(+relu)."""

    bias: bool = False
    activation: str = "identity"
    residual: bool = False
    residual_relu: bool = False
    cast: bool = False  # never set: conv outputs keep the input dtype (see conv2d_problems)

    @property
    def name(self) -> str:
        return f"{CODEGEN}." + "_".join(["conv2d", *self.epilogue.parts()])

    @property
    def size(self) -> int:
        return 1 + self.bias + (self.activation != "identity") * 2 + self.residual + self.residual_relu


def all_conv2d_specs() -> list[Conv2dPatternSpec]:
    specs = [
        Conv2dPatternSpec(bias, act, res, res_relu)
        for bias, act, res, res_relu in itertools.product(
            (True, False), ("identity", *fused_activations()), (True, False), (True, False)
        )
        if res or not res_relu
    ]
    return sorted(specs, key=lambda s: -s.size)


PatternSpec = GemmPatternSpec | Conv2dPatternSpec | AttentionPatternSpec


def all_specs() -> list[PatternSpec]:
    """Every pattern, largest first (attention, whose matmuls no GEMM pattern may take alone, then
    GEMM before conv2d at equal size: the sort is stable)."""
    return sorted([*ATTENTION_SPECS, *all_gemm_specs(), *all_conv2d_specs()], key=lambda s: -s.size)


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


def _hardswish_decomposed(x: DFPattern, ann: dict[str, DFPattern]) -> DFPattern:
    """x * clip(x + 3, 0, 6) / 6, as the PyTorch frontend writes Hardswish (Relax has no op); the
    clip may also be the minimum(maximum(., 0), 6) that ConvertToNHWC turns it into."""
    c_three, c_six, c_low, c_high = is_const(), is_const(), is_const(), is_const()
    shifted = is_op("relax.add")(x, c_three)
    clip = is_op("relax.clip")(shifted, wildcard(), wildcard())
    ann.update(hardswish_three=c_three, hardswish_six=c_six, hardswish_clip=clip)
    ann.update(hardswish_low=c_low, hardswish_high=c_high)
    clamped = clip | is_op("relax.minimum")(is_op("relax.maximum")(shifted, c_low), c_high)
    mul, div = is_op("relax.multiply"), is_op("relax.divide")
    return mul(x, div(clamped, c_six)) | mul(div(clamped, c_six), x) | div(mul(x, clamped), c_six)


# name -> builder(x, annotations) of the activation's pattern; custom activations are added by
# `relax_cutlass.extend.register_activation`.
ACTIVATION_PATTERNS: dict[str, Callable[[DFPattern, dict[str, DFPattern]], DFPattern]] = {
    "relu": lambda x, ann: is_op("relax.nn.relu")(x),
    "gelu": lambda x, ann: is_op("relax.nn.gelu")(x) | _gelu_erf_decomposed(x, ann),
    "gelu_tanh": lambda x, ann: is_op("relax.nn.gelu_tanh")(x),
    "silu": lambda x, ann: is_op("relax.nn.silu")(x) | is_op("relax.multiply")(x, is_op("relax.sigmoid")(x)),
    "sigmoid": lambda x, ann: is_op("relax.sigmoid")(x),
    "hardswish": lambda x, ann: _hardswish_decomposed(x, ann),
}
# Annotation key of a custom activation's scalar constant -> (the value it must have, activation).
CUSTOM_CONSTANTS: dict[str, tuple[float, str]] = {}


def fused_activations() -> tuple[str, ...]:
    """The built-in fused activations, then the registered custom ones."""
    return FUSED_ACTIVATIONS + tuple(name for name in ACTIVATION_PATTERNS if name not in FUSED_ACTIVATIONS)


def clear_caches() -> None:
    """Forget the built patterns and specs (after the set of activations changed)."""
    for cached in (gemm_pattern, conv2d_pattern, spec_by_name):
        cached.cache_clear()


def _activation(name: str, x: DFPattern, ann: dict[str, DFPattern]) -> DFPattern:
    return ACTIVATION_PATTERNS[name](x, ann)


def _epilogue_pattern(out: DFPattern, ann: dict[str, DFPattern], spec) -> DFPattern:
    """root -> [+ bias] -> [activation] -> [+ residual [-> relu]] -> [cast], shared by every op kind.

    The bias add is matched in either operand order (frontends emit both)."""
    if spec.bias:
        ann["bias"] = bias = wildcard()
        out = ann["bias_add"] = is_op("relax.add")(out, bias) | is_op("relax.add")(bias, out)
    if spec.activation != "identity":
        out = _activation(spec.activation, out, ann)
    if spec.residual:
        out, ann_res = make_residual_block_pattern(
            (out, ann), binary_op="relax.add", activation="relax.nn.relu" if spec.residual_relu else None
        )
        ann.update(ann_res)
    if spec.cast:
        out = ann["cast"] = is_op("relax.astype")(out)
    return out


@cache
def gemm_pattern(spec: GemmPatternSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Build the DFPattern for `spec` with annotations lhs, rhs, root, [bias], [residual], ..."""
    lhs, rhs = wildcard(), wildcard()
    ann: dict[str, DFPattern] = {"lhs": lhs, "rhs": rhs}
    rhs_in = rhs
    if spec.b_transposed:
        rhs_in = ann["transpose"] = is_op("relax.permute_dims")(rhs)
    ann["root"] = root = is_op("relax.matmul")(lhs, rhs_in)
    out = _epilogue_pattern(root, ann, spec)
    return out, dict(ann)


@cache
def conv2d_pattern(spec: Conv2dPatternSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Build the DFPattern for `spec` with annotations data, weight, root, [bias], [residual], ..."""
    data, weight = wildcard(), wildcard()
    ann: dict[str, DFPattern] = {"data": data, "weight": weight}
    ann["root"] = root = is_op("relax.nn.conv2d")(data, weight)
    out = _epilogue_pattern(root, ann, spec)
    return out, dict(ann)


def pattern_of(spec) -> tuple[DFPattern, dict[str, DFPattern]]:
    builders = {Conv2dPatternSpec: conv2d_pattern, AttentionPatternSpec: attention_pattern}
    return builders.get(type(spec), gemm_pattern)(spec)


@cache
def spec_by_name() -> dict[str, PatternSpec]:
    return {s.name: s for s in all_specs()}


# ---------------------------------------------------------------------------------------------
# Legality: each rule returns the problems it finds as sentences, so the same rules drive the
# pattern check (offload or not) and the offload report (why not).
# ---------------------------------------------------------------------------------------------


def dtype_of(expr: relax.Expr) -> str:
    """The tensor dtype of `expr` as a plain string ("float16")."""
    return str(expr.ty.dtype)


def _static_int(dim) -> int | None:
    return int(dim) if isinstance(dim, (int, tvm.tirx.IntImm)) else None


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The tensor shape of `expr` as ints; None when it is unknown or has a symbolic dim."""
    values = getattr(getattr(expr.ty, "shape", None), "values", None)
    if values is None:
        return None
    dims = [_static_int(d) for d in values]
    return None if None in dims else dims


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


def same_shape(a: list, b: list) -> bool:
    """Both shapes provably equal, dim by dim (symbolic dims too)."""
    analyzer = tvm.sym.Analyzer()
    return len(a) == len(b) and all(analyzer.can_prove_equal(x, y) for x, y in zip(a, b, strict=True))


def epilogue_problems(
    spec: GemmPatternSpec | Conv2dPatternSpec, ann: dict[str, relax.Expr], out: relax.Expr
) -> list[str]:
    """Why the matched epilogue cannot run inside the kernel's epilogue (empty when it can)."""
    problems = []
    root = ann["root"]
    out_dtype = dtype_of(out)
    out_shape = _shape(out)
    n = _shape(root)[-1] if _shape(root) else None
    if out_dtype not in SUPPORTED_OUTPUT_DTYPES:
        problems.append(f"output dtype {out_dtype} is not one of {SUPPORTED_OUTPUT_DTYPES}")
    if not same_shape(_shape(root), out_shape):
        problems.append(
            f"the epilogue changes the shape {[str(d) for d in _shape(root)]} to {[str(d) for d in out_shape]}; "
            "a kernel epilogue is elementwise"
        )
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
        if not same_shape(_shape(res), out_shape):
            problems.append(
                f"residual shape {[str(d) for d in _shape(res)]} differs from the output shape "
                f"{[str(d) for d in out_shape]} (broadcast residuals are not fused)"
            )
        if dtype_of(res) != out_dtype:
            problems.append(f"residual dtype {dtype_of(res)} differs from the output dtype {out_dtype}")
    return problems + _activation_constant_problems(ann)


def _scalar(expr: relax.Expr) -> float | None:
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    value = expr.value.numpy()
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def _activation_constant_problems(ann: dict[str, relax.Expr]) -> list[str]:
    """The scalar constants of a decomposed activation must be the ones that make it that activation."""
    expected: dict[str, tuple[float, str]] = {}
    if "gelu_inner" in ann:
        inner = math.sqrt(2.0) if "gelu_scaled_div" in ann else 1.0 / math.sqrt(2.0)
        expected |= {"gelu_inner": (inner, "erf gelu"), "gelu_one": (1.0, "erf gelu"), "gelu_half": (0.5, "erf gelu")}
    if "hardswish_three" in ann:
        expected |= {"hardswish_three": (3.0, "hardswish"), "hardswish_six": (6.0, "hardswish")}
    if "hardswish_low" in ann:
        expected |= {"hardswish_low": (0.0, "hardswish"), "hardswish_high": (6.0, "hardswish")}
    expected |= {key: CUSTOM_CONSTANTS[key] for key in ann if key in CUSTOM_CONSTANTS}
    problems = []
    for key, (want, what) in expected.items():
        got = _scalar(ann[key])
        if got is None or not math.isclose(got, want, rel_tol=2e-3, abs_tol=1e-6):
            problems.append(f"activation constant {key}={got} is not {want:.6g}, so the expression is not {what}")
    if "hardswish_clip" in ann:
        clip = ann["hardswish_clip"]
        # TVM 0.27 keeps clip's bounds as IntImm / FloatImm arguments.
        bounds = [
            float(a.value) if isinstance(a, (tvm.tirx.IntImm, tvm.tirx.FloatImm)) else None for a in clip.args[1:]
        ]
        if bounds != [0.0, 6.0]:
            problems.append(f"hardswish clip bounds {bounds} are not [0, 6]")
    return problems


def conv2d_problems(conv: relax.Call, layout_skipped: str | None = None) -> list[str]:
    """Why this R.nn.conv2d cannot become a CUTLASS implicit-GEMM fprop kernel (empty when it can).

    layout_skipped: why ConvertToNHWC left the conv's function in NCHW, if it did."""
    data, weight = conv.args
    attrs = conv.attrs
    problems = []
    layouts = {key: str(getattr(attrs, key)) for key in CONV2D_LAYOUTS}
    if layouts != CONV2D_LAYOUTS:
        problems.append(
            f"layouts {layouts} are not NHWC/OHWI; "
            + (
                f"ConvertToNHWC skipped the layout conversion of this function ({layout_skipped})"
                if layout_skipped
                else "run relax_cutlass.transform.ConvertToNHWC() first (offload_pipeline does)"
            )
        )
    if int(attrs.groups) != 1:
        problems.append(
            f"groups={int(attrs.groups)}: grouped and depthwise conv2d are not offloaded yet (no CUTLASS "
            "2.x fprop kernel here), the conv stays in TVM"
        )
    in_dtype = dtype_of(data)
    if in_dtype not in SUPPORTED_INPUT_DTYPES or dtype_of(weight) != in_dtype:
        problems.append(
            f"data/weight dtypes {in_dtype}/{dtype_of(weight)}: both must be one of {SUPPORTED_INPUT_DTYPES}"
        )
    if dtype_of(conv) != in_dtype:
        problems.append(f"out_dtype {dtype_of(conv)} differs from the input dtype {in_dtype}")
    dshape, wshape, oshape = _shape(data), _shape(weight), _shape(conv)
    if len(dshape) != 4 or len(wshape) != 4 or len(oshape) != 4:
        problems.append("data, weight and output must be 4-D")
        return problems
    static = [_static_int(d) for d in (*dshape[1:], *wshape, *oshape[1:])]
    if None in static:
        problems.append("H, W, C and the filter shape must be static; only the batch N may be symbolic")
        return problems
    if problems:
        return problems
    c, k = _static_int(dshape[3]), _static_int(wshape[0])
    if _static_int(wshape[3]) != c:
        problems.append(f"filter channels {wshape[3]} do not match the input's C={c}")
    if c % 2 or k % 2:
        problems.append(
            f"C={c} and K={k} must both be even (fp16 tensor-op kernels need at least 2-element aligned "
            "channels); pad the channels to offload (e.g. an RGB stem conv with C=3 stays in TVM)"
        )
    return problems


def region_problems(spec, ann: dict[str, relax.Expr], out: relax.Expr, var2val=None) -> list[str]:
    """All legality problems of one matched region: its root op, then its epilogue. `var2val`
    (the bindings of the region) is needed by attention, whose rules follow chains of views."""
    if isinstance(spec, AttentionPatternSpec):
        return attention_problems(spec, ann, out, var2val or {})
    if isinstance(spec, Conv2dPatternSpec):
        problems = conv2d_problems(ann["root"])
    else:
        problems = matmul_problems(ann["root"], ann["rhs"], ann.get("transpose"))
    return problems or epilogue_problems(spec, ann, out)


def _make_check(spec: PatternSpec, log=None):
    """The pattern check: offload iff `check_problems` finds none; `log.record(spec, ctx, problems)`
    sees every decision (PartitionForCutlass uses it to report refused fusions)."""

    def check(ctx: relax.transform.PatternCheckContext) -> bool:
        problems = check_problems(spec, ctx)
        if log is not None:
            log.record(spec, ctx, problems)
        return not problems

    return check


def check_problems(spec: PatternSpec, ctx: relax.transform.PatternCheckContext) -> list[str]:
    """Why the structurally matched region `ctx` must not be offloaded as `spec` (empty: it may)."""
    from tvm.relax.backend.utils import has_leaking_intermediate_variables

    if has_leaking_intermediate_variables(ctx):
        return ["an intermediate value of the region is also used outside it (a fused kernel does not produce it)"]
    ann = dict(ctx.annotated_expr)
    if getattr(spec, "residual", False) and not _independent(ann["residual"], ann, ctx):
        return ["the residual is computed from the region's own output"]
    bias = ann.get("bias") if isinstance(spec, AttentionPatternSpec) else None
    if bias is not None and not isinstance(bias, tvm.ir.GenericConst) and not _independent(bias, ann, ctx):
        return ["the attention's mask/bias is computed from its own scores"]
    var2val = {var: value for value, var in ctx.value_to_bound_var.items()} | dict(ctx.matched_bindings)
    return region_problems(spec, ann, ctx.matched_expr, var2val)


def _independent(expr, ann, ctx) -> bool:
    """A region input (a residual, an attention mask) must not be computed from the region's root
    (it would be read before written)."""
    from tvm.relax.backend.cuda.cutlass import _has_dependency

    if not isinstance(expr, relax.Var):
        expr = ctx.value_to_bound_var.get(expr)
        if expr is None:
            return False
    root_var = ctx.value_to_bound_var[ann["root"]]
    return not _has_dependency(from_var=expr, to_var=root_var, var_usages=ctx.var_usages)


def fusion_patterns(log=None) -> list[relax.transform.FusionPattern]:
    """All relax_cutlass patterns, in priority order, for FuseOpsByPattern (`log`: see _make_check)."""
    return [relax.transform.FusionPattern(spec.name, *pattern_of(spec), _make_check(spec, log)) for spec in all_specs()]
