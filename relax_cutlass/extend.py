"""Teach relax_cutlass a new fused activation: the Relax pattern to match and the C++ to fuse.

Example::

    from tvm.relax.dpl import is_op
    from relax_cutlass.extend import register_activation, check_activation

    register_activation(
        "quick_gelu",  # x * sigmoid(1.702 x), as CLIP's and GPT-J's QuickGELU
        pattern=lambda x, const: is_op("relax.multiply")(
            x, is_op("relax.sigmoid")(is_op("relax.multiply")(x, const(1.702)))
        ),
        expression="x / (1.0f + expf(-1.702f * x))",
    )
    check_activation("quick_gelu", lambda x: x / (1 + np.exp(-1.702 * x)))

From then on every GEMM and conv2d pattern also matches `<root> [+ bias] -> quick_gelu [+ residual
[-> relu]] [-> cast]` (a GEMM's also `[* operand]`, a gated MLP's multiply), and the kernels (SM80
and SM90) evaluate `expression` in fp32 inside their epilogue. Register before the partition runs;
the registry is per process.

What keeps a custom activation from being silently wrong:

- the pattern may use only `x`, scalar constants made with `const(value)` (whose values the
  partition checks), and elementwise ops from `ELEMENTWISE_OPS`; anything else is refused here;
- a matched region whose epilogue changes the shape stays in TVM (patterns.epilogue_problems);
- `check_activation` compiles the C++ functor with nvcc and compares it with a reference.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tvm
from tvm.relax.dpl import DFPattern, is_const, wildcard
from tvm.relax.dpl import pattern as dpl

from .kinds import epilogue_patterns as patterns
from .kinds.epilogue import ACTIVATIONS, Activation
from .kinds.epilogue_templates import ACTIVATION_CHECK_PROGRAM, ACTIVATION_FUNCTOR
from .stages.patterns import clear_caches
from .toolkit.literals import cxx_float

__all__ = [
    "ELEMENTWISE_OPS",
    "ActivationCheckError",
    "check_activation",
    "register_activation",
    "registered_activations",
    "unregister_activation",
]

# Relax ops a custom activation may be built from: each computes every output element from the
# same element of its inputs, which is what an epilogue can do.
ELEMENTWISE_OPS = frozenset(
    f"relax.{op}"
    for op in (
        "add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
        "negative", "abs", "exp", "log", "sqrt", "rsqrt", "square", "tanh", "sigmoid", "erf",
        "sin", "cos", "floor", "ceil", "sign", "astype",
        "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.leakyrelu",
    )
)  # fmt: skip
# Names that already mean something in a composite's name ("dense_bias_relu_residual_add_cast").
_RESERVED = frozenset(
    {"identity", "bias", "residual", "add", "residual_add", "mul", "residual_mul", "cast", "dense", "matmul", "conv2d"}
)
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_EXPRESSIONS: dict[str, str] = {}  # custom activation -> its C++ expression


class ActivationCheckError(AssertionError):
    """The C++ expression of a custom activation disagrees with its reference."""


ConstFactory = Callable[[float], DFPattern]


def register_activation(
    name: str,
    pattern: Callable[[DFPattern, ConstFactory], DFPattern],
    expression: str,
    *,
    replace: bool = False,
) -> Activation:
    """Register activation `name` for every GEMM and conv2d epilogue.

    Parameters
    ----------
    name
        lower_snake_case; becomes part of composite, C++ and kernel names.
    pattern
        `pattern(x, const)` -> the DFPattern of the activation applied to `x` (the GEMM or conv
        output, after the bias). Scalar constants must be `const(value)`: a region matches only if
        the graph's constant has that value. Use `|` for alternative forms.
    expression
        A C++ expression of `float x` giving the activation in fp32 (device and host code: expf,
        tanhf, erff, fmaxf, ... and float literals such as 1.702f).
    replace
        Allow re-registering `name` (built-in activations can never be replaced).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"activation name {name!r} must be lower_snake_case (it becomes part of C++ and kernel names)")
    if name in patterns.FUSED_ACTIVATIONS or name in _RESERVED:
        raise ValueError(f"{name!r} is a built-in activation or a reserved word; register it under another name")
    if name in patterns.ACTIVATION_PATTERNS and not replace:
        raise ValueError(f"activation {name!r} is already registered; pass replace=True to redefine it")
    _check_expression(name, expression)
    _validate_pattern(name, pattern)

    def build(x: DFPattern, ann: dict[str, DFPattern]) -> DFPattern:
        def const(value: float) -> DFPattern:
            key = f"{name}.const{len([k for k in ann if k.startswith(name + '.const')])}"
            ann[key] = c = is_const()
            patterns.CUSTOM_CONSTANTS[key] = (float(value), name)
            return c

        return pattern(x, const)

    functor = f"RelaxCutlassActivation_{name}"
    activation = Activation(
        name,
        functor,
        is_heavy=True,
        definition=ACTIVATION_FUNCTOR.substitute(name=name, functor=functor, expression=expression),
    )
    patterns.ACTIVATION_PATTERNS[name] = build
    ACTIVATIONS[name] = activation
    _EXPRESSIONS[name] = expression
    clear_caches()
    return activation


def unregister_activation(name: str) -> None:
    """Forget a custom activation (regions partitioned with it can no longer be compiled)."""
    if name in patterns.FUSED_ACTIVATIONS or name not in patterns.ACTIVATION_PATTERNS:
        raise ValueError(f"{name!r} is not a registered custom activation; registered: {registered_activations()}")
    del patterns.ACTIVATION_PATTERNS[name]
    del ACTIVATIONS[name]
    del _EXPRESSIONS[name]
    for key in [k for k, (_, owner) in patterns.CUSTOM_CONSTANTS.items() if owner == name]:
        del patterns.CUSTOM_CONSTANTS[key]
    clear_caches()


def registered_activations() -> list[str]:
    """The custom activations registered in this process, in registration order."""
    return [name for name in patterns.fused_activations() if name not in patterns.FUSED_ACTIVATIONS]


def _check_expression(name: str, expression: str) -> None:
    if not isinstance(expression, str) or not re.search(r"\bx\b", expression):
        raise ValueError(f"the expression of {name!r} must be a C++ expression of `float x`, got {expression!r}")
    if any(ch in expression for ch in ";{}#\\\"'") or "//" in expression or "/*" in expression:
        raise ValueError(
            f"the expression of {name!r} must be one C++ expression (no ';', braces, quotes, comments or "
            f"preprocessor lines), got {expression!r}"
        )


def _validate_pattern(name: str, pattern: Callable) -> None:
    """Build the pattern once on a probe `x` and refuse anything a kernel epilogue cannot compute."""
    x = wildcard()
    made: list[DFPattern] = []

    def const(value: float) -> DFPattern:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"const() of activation {name!r} takes a number, got {value!r}")
        made.append(c := is_const())
        return c

    try:
        built = pattern(x, const)
    except Exception as err:
        raise ValueError(f"the pattern builder of activation {name!r} failed: {err}") from err
    if not isinstance(built, DFPattern):
        got = type(built).__name__
        raise TypeError(f"the pattern builder of activation {name!r} must return a DFPattern, got {got}")
    if built.same_as(x):
        raise ValueError(f"the pattern of activation {name!r} is just x; an activation must apply an op")
    uses_x = _walk(name, built, x, made)
    if not uses_x:
        raise ValueError(f"the pattern of activation {name!r} never uses x (its input)")


def _walk(name: str, node: DFPattern, x: DFPattern, made: list[DFPattern]) -> bool:
    """Check one pattern node; -> whether `x` occurs below it."""
    if node.same_as(x):
        return True
    if isinstance(node, dpl.ConstantPattern):
        if not any(node.same_as(c) for c in made):
            raise ValueError(
                f"activation {name!r}: write scalar constants as const(value), not is_const(), so the "
                "partition can check their values"
            )
        return False
    if isinstance(node, dpl.CallPattern):
        op = node.op.expr if isinstance(node.op, dpl.ExprPattern) else None
        if not isinstance(op, tvm.ir.Op) or op.name not in ELEMENTWISE_OPS:
            what = op.name if isinstance(op, tvm.ir.Op) else type(node.op).__name__
            raise ValueError(
                f"activation {name!r} uses {what}, which is not an elementwise op a kernel epilogue can "
                f"compute; allowed: {sorted(ELEMENTWISE_OPS)}"
            )
        return any([_walk(name, arg, x, made) for arg in node.args])
    if isinstance(node, (dpl.OrPattern, dpl.AndPattern)):
        return any([_walk(name, node.left, x, made), _walk(name, node.right, x, made)])
    if isinstance(node, (dpl.AttrPattern, dpl.DataTypePattern, dpl.ShapePattern)):
        return _walk(name, node.pattern, x, made)
    if isinstance(node, dpl.WildcardPattern):
        raise ValueError(
            f"activation {name!r} reads a tensor other than x (a wildcard); an epilogue sees only the "
            "GEMM/conv output, so use x and const(value) only"
        )
    raise ValueError(f"activation {name!r}: pattern node {type(node).__name__} is not supported in an activation")


def evaluate_functor(activation: Activation, xs: np.ndarray, arch: str | int = "sm_80") -> np.ndarray:
    """`activation`'s C++ functor on the host at float32 inputs `xs`, compiled with nvcc (the device
    side too, for `arch`, but never launched): (len(xs), 2) values, elementwise and Array form."""
    from .arch import nvcc_gencode, parse_arch
    from .toolkit.compile import CompileError, cache_dir, toolchain

    source = ACTIVATION_CHECK_PROGRAM.substitute(
        definition=activation.definition,
        functor=activation.functor,
        inputs=", ".join(cxx_float(v) for v in xs),
    )
    tc = toolchain()
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        src, exe = Path(tmp) / f"check_{activation.name}.cu", Path(tmp) / f"check_{activation.name}"
        src.write_text(source)
        cmd = [
            tc.nvcc, "-std=c++17", "-O2", "-w", "--expt-relaxed-constexpr",
            *nvcc_gencode(parse_arch(arch)), *(f"-I{p}" for p in tc.includes_cuda), str(src), "-o", str(exe),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(src, cmd, proc.stdout + proc.stderr)
        run = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    return np.array([line.split() for line in run.stdout.splitlines()], dtype=np.float64)


def check_activation(
    name: str,
    reference: Callable[[np.ndarray], np.ndarray],
    *,
    inputs: np.ndarray | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    arch: str | int = "sm_80",
) -> float:
    """Compile the C++ functor of `name` with nvcc and compare it with `reference` (numpy, float64).

    The device side is compiled for `arch` (so expressions that only build on the host fail here,
    not in a model build); values are computed on the host, elementwise and through the Array form
    the kernels call. Returns the largest error relative to `atol + rtol * |reference|` (<= 1 passes);
    raises ActivationCheckError naming the worst input otherwise.
    """
    if name not in ACTIVATIONS or not ACTIVATIONS[name].definition:
        raise ValueError(f"{name!r} is not a registered custom activation; registered: {registered_activations()}")
    activation = ACTIVATIONS[name]
    xs = np.asarray(
        inputs if inputs is not None else np.concatenate([np.linspace(-10, 10, 2001), [-30, -0.0, 1e-3, 30]]),
        dtype=np.float32,
    )
    got = evaluate_functor(activation, xs, arch)
    want = np.broadcast_to(np.asarray(reference(xs.astype(np.float64)), dtype=np.float64)[:, None], got.shape)
    close = np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if not close.all():
        diff = np.where(close, 0.0, np.nan_to_num(np.abs(got - want), nan=np.inf))
        row, form = np.unravel_index(np.argmax(diff), diff.shape)
        raise ActivationCheckError(
            f"activation {name!r}: the C++ expression `{_EXPRESSIONS[name]}` gives {got[row, form]:.7g} at "
            f"x={xs[row]:.7g} ({('elementwise', 'Array')[form]} form), the reference {want[row, form]:.7g} "
            f"({int((~close).any(axis=1).sum())} of {len(xs)} inputs differ beyond rtol={rtol}, atol={atol}); "
            "fix the expression or the reference"
        )
    return float(np.nanmax(np.abs(got - want)))
