"""The patterns of the channel-affine kind, their legality rules, and how a matched region reads
back into its problem record.

After ConvertToNHWC and ToMixedPrecision a DenseNet layer's input is

    astype(relu(batch_norm(astype(concat((p0, ..., pn), axis=3), f32), gamma, beta, mean, var)[0]), f16)

(a pre-activation batch norm: a ReLU stands between it and the conv, so it cannot be folded into
the conv's weights). TVM ran each as one fused kernel that selects, per element, which part it
reads. One spec per number of parts (relax.dpl tuples have a fixed arity): one part is the batch
norm and ReLU of one tensor, as pre-activation ResNets and DenseNet's transitions have them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, is_tuple, is_tuple_get_item, wildcard

from ...toolkit.literals import as_float32
from .. import CODEGEN
from ..epilogue import Epilogue
from ..ir import dtype_of, rules_at, shape_dims, static_int, static_product, static_shape
from .records import MAX_PARTS, VECTOR, ChannelAffineProblem

ACTIVATIONS = ("relu",)
ELEMENTS = ("float16", "bfloat16")
BN_PARAMETERS = ("gamma", "beta", "mean", "var")


def part_role(i: int) -> str:
    return f"part{i}"


@dataclass(frozen=True)
class ChannelAffineSpec:
    parts: int  # 1 .. MAX_PARTS tensors concatenated along the channels (1: no concat)
    activation: str = "relu"

    @property
    def name(self) -> str:
        concat = f"concat{self.parts}_" if self.parts > 1 else ""
        return f"{CODEGEN}.{concat}batch_norm_{self.activation}"

    @property
    def size(self) -> float:
        # Below every GEMM/conv pattern (sizes >= 1), like the norm kind's, more parts first.
        return (4 + self.parts / MAX_PARTS) / 100

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue(activation=self.activation)


def all_specs() -> list[ChannelAffineSpec]:
    return [ChannelAffineSpec(n, a) for n in range(1, MAX_PARTS + 1) for a in ACTIVATIONS]


@cache
def pattern(spec: ChannelAffineSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Annotations: part0 .., gamma, beta, mean, var, data (the concatenation, or the one part),
    bn (the batch norm call), root (the activation)."""
    parts = [wildcard() for _ in range(spec.parts)]
    data = is_op("relax.concat")(is_tuple(parts)) if spec.parts > 1 else parts[0]
    params = {name: wildcard() for name in BN_PARAMETERS}
    bn = is_op("relax.nn.batch_norm")(is_op("relax.astype")(data), *params.values())
    root = is_op(f"relax.nn.{spec.activation}")(is_tuple_get_item(bn, 0))
    out = is_op("relax.astype")(root)
    ann = {part_role(i): p for i, p in enumerate(parts)} | params | {"data": data, "bn": bn, "root": root}
    return out, ann


def _last_axis(axis, ndim: int) -> bool:
    return axis is not None and int(axis) in (-1, ndim - 1)


def rules(spec: ChannelAffineSpec, ann: dict, out: relax.Expr, _var2val) -> list[str]:
    """16-bit parts of one dtype over the same leading axes, each a whole number of 16-byte
    vectors of channels, concatenated and normalized along the last axis in float32 (inference
    mode, scale and center), float32 parameter vectors as long as the channels, the activation's
    output cast back to the parts' dtype."""
    parts = [ann[part_role(i)] for i in range(spec.parts)]
    if not all(isinstance(p.ty, relax.TensorType) for p in parts):
        return ["the concatenated operands are not tensors"]
    element = dtype_of(parts[0])
    # (judged at the activation, for the report of one left in TVM, the cast after it is not seen)
    out_dtype = element if out.same_as(ann["root"]) else dtype_of(out)
    if element not in ELEMENTS or any(dtype_of(p) != element for p in parts) or out_dtype != element:
        return [f"the parts and the output must share one 16-bit float dtype ({', '.join(ELEMENTS)})"]
    if dtype_of(ann["root"]) != "float32":
        return ["the batch norm must run in float32 (the kernel computes it so)"]
    shapes = [shape_dims(p) for p in parts]
    ndim = len(shapes[0])
    if ndim < 2 or any(len(s) != ndim for s in shapes):
        return ["the parts must have one rank of at least 2"]
    channels = [static_int(s[-1]) for s in shapes]
    if any(c is None or c % VECTOR for c in channels):
        return [f"every part's channels (the last axis) must be static and a multiple of {VECTOR} (16-byte vectors)"]
    leading = [[static_int(d) if static_int(d) is not None else str(d) for d in s[:-1]] for s in shapes]
    if any(lead != leading[0] for lead in leading):
        return ["the parts differ in their leading axes"]
    problems = []
    total = sum(channels)
    if spec.parts > 1 and not _last_axis(ann["data"].attrs.axis, ndim):
        problems.append("the concatenation must be along the last axis (NHWC channels)")
    attrs = ann["bn"].attrs
    if not _last_axis(attrs.axis, ndim):
        problems.append("the batch norm must normalize the last axis (NHWC channels)")
    if bool(attrs.training) or not bool(attrs.center) or not bool(attrs.scale):
        problems.append("the batch norm must be in inference mode with scale and center")
    for name in BN_PARAMETERS:
        shape = static_shape(ann[name])
        if dtype_of(ann[name]) != "float32" or shape != [total]:
            problems.append(f"the batch norm's {name} must be a float32 vector of the {total} channels")
    return problems


def read_problem(spec: ChannelAffineSpec, ann: dict, out: relax.Expr, _var2val, _accumulator: str):
    parts = [ann[part_role(i)] for i in range(spec.parts)]
    return ChannelAffineProblem(
        rows=static_product(shape_dims(parts[0])[:-1]),
        channels=tuple(static_int(shape_dims(p)[-1]) for p in parts),
        epsilon=as_float32(float(ann["bn"].attrs.epsilon)),
        activation=spec.activation,
        element=dtype_of(parts[0]),
    )


def left_in_tvm_row(call: relax.Call, var2val, _layout_skipped):
    """The report row of an activation of a batch norm left in TVM (this kind's root): why the
    kind refused it; None for any other activation (not this kind's op)."""

    def value(expr):
        return var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr

    item = value(call.args[0])
    bn = value(item.tuple_value) if isinstance(item, relax.TupleGetItem) else None
    if not (isinstance(bn, relax.Call) and getattr(bn.op, "name", "") == "relax.nn.batch_norm"):
        return None
    cast = value(bn.args[0])
    data = value(cast.args[0]) if isinstance(cast, relax.Call) and cast.op.name == "relax.astype" else cast
    is_concat = isinstance(data, relax.Call) and getattr(data.op, "name", "") == "relax.concat"
    fields = value(data.args[0]) if is_concat else None
    parts = len(fields.fields) if isinstance(fields, relax.Tuple) else 1
    activation = call.op.name.removeprefix("relax.nn.")
    op = f"batch_norm_{activation}"
    if parts > MAX_PARTS:
        return op, 0, [f"{parts} parts: the kernel concatenates at most {MAX_PARTS}"]
    spec = ChannelAffineSpec(parts, activation)
    reasons = rules_at(lambda s: (pattern(s)[1]["root"], pattern(s)[1]), rules, spec, call, var2val)
    return op, 0, reasons or []
