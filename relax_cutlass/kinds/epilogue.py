"""What a kernel computes, as small frozen records.

Everything downstream of partitioning (kernel choice, C++ emission, compilation, the offload report)
reads these records instead of Relax IR, so each stage can be tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..toolkit.dtypes import DTYPE_BITS
from ..toolkit.literals import cxx_float
from .epilogue_templates import GELU16_FUNCTOR, SIGMOID16_FUNCTOR


def widest_vector(*extents: int) -> int:
    """The widest 16-bit vector access (8, 4 or 2 elements; else 1) that divides every extent."""
    return next((w for w in (8, 4, 2) if all(e % w == 0 for e in extents)), 1)


@dataclass(frozen=True)
class Activation:
    """An elementwise activation applied in the epilogue, and the CUTLASS functor that computes it."""

    name: str
    functor: str
    # CUTLASS skips the source (bias) load when it can; "heavy" functors tell the epilogue to
    # evaluate them once per fragment rather than inline per element.
    is_heavy: bool = False
    # C++ defining `functor` (a template over the element or Array type), which every kernel TU
    # using it must contain: set for custom activations (relax_cutlass.extend), empty for CUTLASS's.
    definition: str = ""
    # A cheaper form, accurate to 16-bit outputs, for kernels that write fp16/bf16 (None: same form).
    narrow: Activation | None = None

    def for_output(self, element_out: str) -> Activation:
        """The form a kernel writing `element_out` instantiates."""
        return self.narrow if self.narrow is not None and DTYPE_BITS[element_out] == 16 else self


# log2(1 - Phi(t)) ~ sum(c[i] * t**i) for t >= 0: weighted minimax fit by relax_cutlass/testing/gelu16.py.
GELU16_LOG2_TAIL = (-1.00012076, -1.14917588, -0.464120954, -0.0482372046, 0.00582726812, -0.000320508756)
_GELU16 = Activation(
    "gelu16",
    "RelaxCutlassGelu16",
    is_heavy=True,
    definition=GELU16_FUNCTOR.substitute(
        functor="RelaxCutlassGelu16", **{f"c{i}": cxx_float(c) for i, c in enumerate(GELU16_LOG2_TAIL)}
    ),
)


# Sigmoid-based forms for 16-bit outputs (templates.SIGMOID16_FUNCTOR): (name, functor, sigmoid's
# argument z, result from x and s = sigmoid(z)). gelu_tanh's z is 2 sqrt(2/pi) (x + 0.044715 x^3).
SIGMOID16_FORMS = {
    "silu": ("silu16", "RelaxCutlassSilu16", "x", "x * s"),
    "sigmoid": ("sigmoid16", "RelaxCutlassSigmoid16", "x", "s"),
    "gelu_tanh": ("gelu_tanh16", "RelaxCutlassGeluTanh16", "x * fmaf(0.0713548162f, x * x, 1.59576912f)", "x * s"),
}


def _sigmoid16(base: str) -> Activation:
    name, functor, argument, result = SIGMOID16_FORMS[base]
    definition = SIGMOID16_FUNCTOR.substitute(name=name, functor=functor, argument=argument, result=result)
    return Activation(name, functor, is_heavy=True, definition=definition)


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation("identity", "cutlass::epilogue::thread::Identity"),
        Activation("relu", "cutlass::epilogue::thread::ReLu"),
        # erf form, as R.nn.gelu and the decomposed 0.5*x*(1+erf(x/sqrt(2))); erff for float32
        # outputs, the polynomial form (within 1 ulp, about a third of the instructions) for 16-bit.
        Activation("gelu", "cutlass::epilogue::thread::GELU", is_heavy=True, narrow=_GELU16),
        # tanh form, as R.nn.gelu_tanh; tanhf for float32 outputs, x * sigmoid(2u) for 16-bit.
        Activation(
            "gelu_tanh", "cutlass::epilogue::thread::GELU_taylor", is_heavy=True, narrow=_sigmoid16("gelu_tanh")
        ),
        Activation("silu", "cutlass::epilogue::thread::SiLu", is_heavy=True, narrow=_sigmoid16("silu")),
        Activation("sigmoid", "cutlass::epilogue::thread::Sigmoid", is_heavy=True, narrow=_sigmoid16("sigmoid")),
        # x * relu6(x + 3) / 6, as PyTorch's Hardswish (frontends decompose it; see patterns).
        Activation("hardswish", "cutlass::epilogue::thread::HardSwish", is_heavy=True),
    )
}


@dataclass(frozen=True)
class ResidualOp:
    """How the epilogue combines act(acc + bias) with the residual operand: the Relax op that
    does it in the graph, the CUTLASS functor that does it in a kernel, and its name in
    `Epilogue.parts()` (so kernel names, tuning keys and the report tell the forms apart)."""

    name: str
    relax_op: str
    functor: str
    part: str


# The residual add of ResNet/Transformer blocks, and the multiply of gated MLPs
# (silu(x @ W_gate) * (x @ W_up): either GEMM takes the other's product as its "residual").
RESIDUAL_OPS: dict[str, ResidualOp] = {
    op.name: op
    for op in (
        ResidualOp("add", "relax.add", "cutlass::plus", "residual_add"),
        ResidualOp("multiply", "relax.multiply", "cutlass::multiplies", "residual_mul"),
    )
}


@dataclass(frozen=True)
class Epilogue:
    """D = post(act(acc + bias) (residual_op) residual), cast to the output dtype.

    `residual_op` is "add" (the residual block) or "multiply" (a gated MLP's product);
    `post` is only meaningful with a residual (the ResNet/Transformer `relu(x + f(x))` shape).
    """

    bias: bool = False
    activation: str = "identity"
    residual: bool = False
    residual_activation: str = "identity"
    residual_op: str = "add"

    def __post_init__(self) -> None:
        for name in (self.activation, self.residual_activation):
            if name not in ACTIVATIONS:
                raise ValueError(f"unknown epilogue activation {name!r}; known: {sorted(ACTIVATIONS)}")
        if self.residual_activation != "identity" and not self.residual:
            raise ValueError("a post-residual activation needs a residual")
        if self.residual_op not in RESIDUAL_OPS:
            raise ValueError(f"unknown residual op {self.residual_op!r}; known: {sorted(RESIDUAL_OPS)}")
        if self.residual_op != "add" and not self.residual:
            raise ValueError(f"a residual op ({self.residual_op}) needs a residual")

    @property
    def combine(self) -> ResidualOp:
        """How the residual is combined (RESIDUAL_OPS)."""
        return RESIDUAL_OPS[self.residual_op]

    def parts(self) -> list[str]:
        """The fused steps in order, e.g. ["bias", "gelu", "residual_add", "relu"] or ["silu", "residual_mul"]."""
        steps = [
            ("bias", self.bias),
            (self.activation, self.activation != "identity"),
            (self.combine.part, self.residual),
            (self.residual_activation, self.residual_activation != "identity"),
        ]
        return [name for name, present in steps if present]

    def describe(self) -> str:
        return "+".join(self.parts()) or "none"

    def functors(self, element_out: str) -> tuple[Activation, Activation]:
        """(activation, post-residual activation) in the forms a kernel writing `element_out` uses."""
        return tuple(ACTIVATIONS[name].for_output(element_out) for name in (self.activation, self.residual_activation))

    def definitions(self, element_out: str) -> str:
        """The C++ definitions of the functors this epilogue uses that CUTLASS does not define."""
        return "".join(dict.fromkeys(a.definition for a in self.functors(element_out)))


def epilogue_key(epilogue: Epilogue, element_out: str) -> str:
    """TuningKey.epilogue of a region's epilogue: "" for none (stage 1's timing is the kernel's).
    Activations are named in the form a kernel writing `element_out` computes ("bias+gelu16"), so a
    record timed with another form of the same epilogue is not taken for this one."""
    if epilogue == Epilogue():
        return ""
    names = (epilogue.activation, epilogue.residual_activation)
    forms = dict(zip(names, (form.name for form in epilogue.functors(element_out)), strict=True))
    return "+".join(forms.get(part, part) for part in epilogue.parts())
