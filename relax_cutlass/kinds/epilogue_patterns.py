"""The epilogue every CUTLASS GEMM-like kind fuses (bias, activation, residual add(+relu) or multiply,
cast): its dataflow patterns, activation patterns (built-in and registered), and legality rules."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax.backend.patterns import make_residual_block_pattern
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from .epilogue import RESIDUAL_OPS, Epilogue
from .ir import dtype_of, same_shape, shape_dims, static_int

SUPPORTED_INPUT_DTYPES = ("float16", "bfloat16")


SUPPORTED_OUTPUT_DTYPES = ("float16", "bfloat16", "float32")


ACCUMULATOR_DTYPES = ("float16", "float32")


# Built-in fused activations; `relax_cutlass.extend.register_activation` adds more (see
# `fused_activations`).
FUSED_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "hardswish")


class EpilogueSpec:
    """The epilogue fields (bias, activation, residual, residual_relu) every pattern spec has, and
    `residual_op` (RESIDUAL_OPS), a field only of the kinds that fuse more than the residual add."""

    bias: bool
    activation: str
    residual: bool
    residual_relu: bool
    residual_op: str = "add"

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue(
            bias=self.bias,
            activation=self.activation,
            residual=self.residual,
            residual_activation="relu" if self.residual_relu else "identity",
            residual_op=self.residual_op,
        )


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


def _gelu_tanh_decomposed(x: DFPattern, ann: dict[str, DFPattern]) -> DFPattern:
    """0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))): GPT-2's NewGELUActivation (and
    every `transformers` model with "gelu_new"), with x^3 as the multiplies FixTvmCudaForms makes
    of `x ** 3`, or with x factored out of the tanh's argument as BLOOM writes it; tanh may run in
    fp32 between two casts. The four scalar constants are annotated
    so the check can verify their values."""
    c_cubic, c_inner, c_one, c_half = is_const(), is_const(), is_const(), is_const()
    ann.update(gelu_tanh_cubic=c_cubic, gelu_tanh_inner=c_inner, gelu_tanh_one=c_one, gelu_tanh_half=c_half)
    mul, add = is_op("relax.multiply"), is_op("relax.add")

    def by(a: DFPattern, c: DFPattern) -> DFPattern:
        return mul(a, c) | mul(c, a)

    square = mul(x, x)
    cubic = by(mul(square, x) | mul(x, square), c_cubic)
    # BLOOM's bloom_gelu_forward factors x out: sqrt(2 / pi) * x * (1 + 0.044715 * x * x)
    c_one_inner = is_const()
    ann.update(gelu_tanh_one_inner=c_one_inner)
    scaled_square = by(square, c_cubic) | mul(by(x, c_cubic), x) | mul(x, by(x, c_cubic))
    one_plus_square = add(scaled_square, c_one_inner) | add(c_one_inner, scaled_square)
    factored = mul(by(x, c_inner), one_plus_square) | mul(one_plus_square, by(x, c_inner))
    inner = by(add(x, cubic) | add(cubic, x), c_inner) | factored
    tanh = is_op("relax.tanh")(inner) | is_op("relax.astype")(is_op("relax.tanh")(is_op("relax.astype")(inner)))
    one_plus = add(tanh, c_one) | add(c_one, tanh)
    return mul(by(x, c_half), one_plus) | mul(one_plus, by(x, c_half)) | by(mul(x, one_plus) | mul(one_plus, x), c_half)


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
    "gelu_tanh": lambda x, ann: is_op("relax.nn.gelu_tanh")(x) | _gelu_tanh_decomposed(x, ann),
    "silu": lambda x, ann: is_op("relax.nn.silu")(x) | is_op("relax.multiply")(x, is_op("relax.sigmoid")(x)),
    "sigmoid": lambda x, ann: is_op("relax.sigmoid")(x),
    "hardswish": lambda x, ann: _hardswish_decomposed(x, ann),
}


# Annotation key of a custom activation's scalar constant -> (the value it must have, activation).
CUSTOM_CONSTANTS: dict[str, tuple[float, str]] = {}


def fused_activations() -> tuple[str, ...]:
    """The built-in fused activations, then the registered custom ones."""
    return FUSED_ACTIVATIONS + tuple(name for name in ACTIVATION_PATTERNS if name not in FUSED_ACTIVATIONS)


def epilogue_specs(make, before: int = 0, after: int = 0, residual_ops: tuple[str, ...] = ("add",)) -> list:
    """`make(*b, bias, activation, residual, residual_relu, *a)` for every combination (a relu after
    the residual only with a residual), largest first (stable: in product order at equal size);
    `before` / `after`: how many boolean fields of the kind's own come first / last.

    `residual_ops` beyond "add" (RESIDUAL_OPS; only for kinds whose emitters fuse them): the same
    combinations with a residual and no relu after it, made with `residual_op=<op>`, each after
    the residual-add specs of its size (so every residual-add spec keeps its place)."""
    flags = (True, False)
    axes = [*[flags] * before, flags, ("identity", *fused_activations()), flags, flags, *[flags] * after]
    combos = [values for values in itertools.product(*axes) if values[before + 2] or not values[before + 3]]
    specs = [make(*values) for values in combos]
    for op in residual_ops:
        if op != "add":
            specs += [make(*v, residual_op=op) for v in combos if v[before + 2] and not v[before + 3]]
    return sorted(specs, key=lambda s: -s.size)


def _activation(name: str, x: DFPattern, ann: dict[str, DFPattern]) -> DFPattern:
    return ACTIVATION_PATTERNS[name](x, ann)


def epilogue_pattern(out: DFPattern, ann: dict[str, DFPattern], spec) -> DFPattern:
    """root -> [+ bias] -> [activation] -> [+ or * residual [-> relu]] -> [cast], shared by every op kind.

    The bias add is matched in either operand order (frontends emit both)."""
    if spec.bias:
        ann["bias"] = bias = wildcard()
        out = ann["bias_add"] = is_op("relax.add")(out, bias) | is_op("relax.add")(bias, out)
    if spec.activation != "identity":
        out = _activation(spec.activation, out, ann)
    if spec.residual:
        out, ann_res = make_residual_block_pattern(
            (out, ann),
            binary_op=RESIDUAL_OPS[spec.residual_op].relax_op,
            activation="relax.nn.relu" if spec.residual_relu else None,
        )
        ann.update(ann_res)
    if spec.cast:
        out = ann["cast"] = is_op("relax.astype")(out)
    return out


def epilogue_problems(spec, ann: dict[str, relax.Expr], out: relax.Expr) -> list[str]:
    """Why the matched epilogue cannot run inside the kernel's epilogue (empty when it can)."""
    problems = []
    root = ann["root"]
    out_dtype = dtype_of(out)
    out_shape = shape_dims(out)
    n = shape_dims(root)[-1] if shape_dims(root) else None
    if out_dtype not in SUPPORTED_OUTPUT_DTYPES:
        problems.append(f"output dtype {out_dtype} is not one of {SUPPORTED_OUTPUT_DTYPES}")
    if not same_shape(shape_dims(root), out_shape):
        problems.append(
            f"the epilogue changes the shape {[str(d) for d in shape_dims(root)]} to {[str(d) for d in out_shape]}; "
            "a kernel epilogue is elementwise"
        )
    if not spec.cast and dtype_of(root) != out_dtype:
        problems.append("output dtype differs from the matmul's")
    if spec.cast and dtype_of(root) == out_dtype:
        problems.append("the cast does not change the dtype")
    if spec.bias:
        bias = ann["bias"]
        bshape = shape_dims(bias)
        numel = math.prod(int(d) for d in bshape) if all(static_int(d) is not None for d in bshape) else None
        if not bshape or n is None or static_int(bshape[-1]) != static_int(n) or numel != static_int(n):
            problems.append(f"bias shape {[str(d) for d in bshape]} is not a per-column vector of length N={n}")
        if dtype_of(bias) != out_dtype:
            problems.append(
                f"bias dtype {dtype_of(bias)} differs from the output dtype {out_dtype} "
                "(the CUTLASS epilogue reads bias as the output element type)"
            )
    if spec.residual:
        res = ann["residual"]
        # The multiply's other operand is read through the residual (C) operand: the same rules.
        what, adjective = (
            ("residual", "broadcast residuals")
            if spec.residual_op == "add"
            else (f"{spec.residual_op} operand", f"broadcast {spec.residual_op} operands")
        )
        if not same_shape(shape_dims(res), out_shape):
            problems.append(
                f"{what} shape {[str(d) for d in shape_dims(res)]} differs from the output shape "
                f"{[str(d) for d in out_shape]} ({adjective} are not fused)"
            )
        if dtype_of(res) != out_dtype:
            problems.append(f"{what} dtype {dtype_of(res)} differs from the output dtype {out_dtype}")
    return problems + _activation_constant_problems(ann)


def scalar_constant(expr: relax.Expr) -> float | None:
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
    if "gelu_tanh_inner" in ann:
        what = "tanh gelu"
        expected |= {
            "gelu_tanh_cubic": (0.044715, what),
            "gelu_tanh_inner": (math.sqrt(2.0 / math.pi), what),
            "gelu_tanh_one": (1.0, what),
            "gelu_tanh_half": (0.5, what),
        }
        if "gelu_tanh_one_inner" in ann:
            expected["gelu_tanh_one_inner"] = (1.0, what)
    if "hardswish_three" in ann:
        expected |= {"hardswish_three": (3.0, "hardswish"), "hardswish_six": (6.0, "hardswish")}
    if "hardswish_low" in ann:
        expected |= {"hardswish_low": (0.0, "hardswish"), "hardswish_high": (6.0, "hardswish")}
    expected |= {key: CUSTOM_CONSTANTS[key] for key in ann if key in CUSTOM_CONSTANTS}
    problems = []
    for key, (want, what) in expected.items():
        got = scalar_constant(ann[key])
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


def residual_input(spec, ann: dict) -> list[tuple]:
    """The residual must not be computed from the region's own output (RegionKind.independent_inputs)."""
    return [(ann["residual"], "the residual is computed from the region's own output")] if spec.residual else []
