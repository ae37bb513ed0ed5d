"""The pattern of the bias + activation kind, its legality rules, and how a matched region reads
back into its problem record."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from .. import CODEGEN
from ..ir import dtype_of, static_product, static_shape
from .records import BiasActProblem

ACTIVATIONS = ("relu", "silu")


@dataclass(frozen=True)
class BiasActSpec:
    """act(x + bias), `bias` a vector over the last axis of `x`."""

    activation: str

    @property
    def name(self) -> str:
        return f"{CODEGEN}.bias_act_{self.activation}"

    @property
    def size(self) -> int:
        return 2  # smaller than every GEMM pattern: an epilogue after a matmul stays the GEMM's


def all_specs() -> list[BiasActSpec]:
    return [BiasActSpec(a) for a in ACTIVATIONS]


@cache
def pattern(spec: BiasActSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Annotations: data, bias, root (the add)."""
    data, bias = wildcard(), wildcard()
    root = is_op("relax.add")(data, bias)
    out = is_op(f"relax.nn.{spec.activation}")(root)
    return out, {"data": data, "bias": bias, "root": root}


def rules(spec: BiasActSpec, ann: dict, out: relax.Expr, _var2val) -> list[str]:
    """float16 in and out, a static last axis, a bias of exactly that length."""
    data, bias = ann["data"], ann["bias"]
    if not isinstance(data.ty, relax.TensorType) or not isinstance(bias.ty, relax.TensorType):
        return ["operands are not tensors"]
    if dtype_of(data) != "float16" or dtype_of(bias) != "float16" or dtype_of(out) != "float16":
        return ["the bias + activation kernel takes float16 only"]
    bias_shape = static_shape(bias)
    n = data.ty.shape.values[-1] if data.ty.shape is not None and len(data.ty.shape.values) >= 1 else None
    if bias_shape is None or len(bias_shape) != 1 or not hasattr(n, "value") or int(n) != bias_shape[0]:
        return ["the bias must be a vector as long as the (static) last axis of x"]
    return []


def read_problem(spec: BiasActSpec, ann: dict, _out, _var2val, _accumulator: str) -> BiasActProblem:
    dims = ann["data"].ty.shape.values
    return BiasActProblem(
        rows=static_product(dims[:-1]), n=int(dims[-1]), activation=spec.activation, element=dtype_of(ann["data"])
    )
