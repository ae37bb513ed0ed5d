"""The patterns of the norm kind: [residual add, its operands optionally cast to float32] ->
LayerNorm (R.nn.layer_norm) or RMSNorm (R.nn.rms_norm, or its decomposition x * rsqrt(mean(x * x)
+ eps) * weight, rsqrt also as 1 / sqrt) over the last axis -> [cast]; their legality rules and
how a matched region reads back into a NormProblem."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from ...toolkit.literals import as_float32
from .. import CODEGEN
from ..epilogue import Epilogue
from ..epilogue_patterns import scalar_constant
from ..ir import dtype_of, same_shape, shape_dims, static_int, static_product, static_shape
from .records import MAX_N, NormProblem

NORMS = ("layer_norm", "rms_norm", "rms_decomposed")
DTYPES = ("float16", "bfloat16", "float32")
# The residual add's operands, each read as stored or through a cast ("cast": astype to the sum's
# dtype); add matches either operand order, so (plain, cast) covers (cast, plain).
RESIDUALS = ("none", "plain", "cast_one", "cast_both")


@dataclass(frozen=True)
class NormSpec:
    norm: str  # one of NORMS
    residual: str = "none"  # one of RESIDUALS
    cast: bool = False  # the norm's output is cast (astype) to another dtype

    @property
    def name(self) -> str:
        parts = ["norm", self.norm]
        if self.residual != "none":
            parts.append("add" if self.residual == "plain" else f"add_{self.residual}")
        if self.cast:
            parts.append("cast")
        return f"{CODEGEN}." + "_".join(parts)

    @property
    def size(self) -> float:
        # Below every other kind's pattern (all have size >= 1): a GEMM or conv whose epilogue can
        # take the residual add takes it first (one tensor less to write and read back), and the
        # norm region then starts at the norm. Larger norm patterns first among themselves.
        ops = {"none": 0, "plain": 1, "cast_one": 2, "cast_both": 3}[self.residual] + self.cast
        ops += 6 if self.norm == "rms_decomposed" else 1
        return ops / 100

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue()


def all_specs() -> list[NormSpec]:
    return [NormSpec(n, r, c) for n in NORMS for r in RESIDUALS for c in (True, False)]


def _operand(cast: bool) -> tuple[DFPattern, DFPattern]:
    x = wildcard()
    return (is_op("relax.astype")(x) if cast else x), x


@cache
def pattern(spec: NormSpec) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Annotations: data, residual (the add's operands before their casts), sum (the add), gamma,
    beta, epsilon (the decomposed RMSNorm's constant), root and norm (the norm's output)."""
    ann: dict[str, DFPattern] = {}
    if spec.residual == "none":
        h = wildcard()
        ann["data"] = h
    else:
        a_in, a = _operand(spec.residual in ("cast_one", "cast_both"))
        b_in, b = _operand(spec.residual == "cast_both")
        h = is_op("relax.add")(a_in, b_in)
        ann |= {"data": a, "residual": b, "sum": h}
    gamma = wildcard()
    ann["gamma"] = gamma
    if spec.norm == "layer_norm":
        beta = wildcard()
        norm = is_op("relax.nn.layer_norm")(h, gamma, beta)
        ann["beta"] = beta
    elif spec.norm == "rms_norm":
        norm = is_op("relax.nn.rms_norm")(h, gamma)
    else:  # multiply and add match either operand order
        eps, one = wildcard(), wildcard()
        mean = is_op("relax.mean")(is_op("relax.multiply")(h, h))
        variance = is_op("relax.add")(mean, eps)
        # rsqrt, or 1 / sqrt as ONNX writes it (it has no Rsqrt op): torch.onnx's Llama RMSNorm
        rstd = is_op("relax.rsqrt")(variance) | is_op("relax.divide")(one, is_op("relax.sqrt")(variance))
        norm = is_op("relax.multiply")(gamma, is_op("relax.multiply")(h, rstd))
        ann |= {"epsilon": eps, "mean": mean, "one": one}
    ann |= {"root": norm, "norm": norm}
    out = is_op("relax.astype")(norm) if spec.cast else norm
    return out, ann


def _last_axis(axes, ndim: int) -> bool:
    return axes is not None and len(axes) == 1 and int(axes[0]) in (-1, ndim - 1)


def _norm_attrs(spec: NormSpec, ann: dict) -> tuple[float | None, bool, bool, list[str]]:
    """-> (epsilon, center, scale, problems) of the matched norm."""
    root, sum_ = ann["root"], ann.get("sum", ann["data"])
    ndim = len(shape_dims(sum_))
    if spec.norm == "rms_decomposed":
        mean = ann["mean"]
        problems = []
        if not _last_axis(mean.attrs.axis, ndim) or not bool(mean.attrs.keepdims):
            problems.append("the RMSNorm's mean must be over the last axis only (keepdims)")
        eps = scalar_constant(ann["epsilon"])
        if eps is None:
            problems.append("the RMSNorm's epsilon must be a scalar constant (a kernel literal)")
        if "one" in ann and scalar_constant(ann["one"]) != 1.0:
            problems.append("the RMSNorm divides something else than 1 by the root mean square")
        return eps, False, True, problems
    axes = list(root.attrs.axes)
    problems = (
        []
        if _last_axis(axes, ndim)
        else [f"normalizes over axes {[int(a) for a in axes]}: the kernel normalizes the last axis only"]
    )
    if spec.norm == "layer_norm":
        return float(root.attrs.epsilon), bool(root.attrs.center), bool(root.attrs.scale), problems
    return float(root.attrs.epsilon), False, True, problems


def rules(spec: NormSpec, ann: dict, out: relax.Expr, _var2val) -> list[str]:
    """Last-axis normalization of a static size n <= MAX_N (any, even symbolic, rows), tensors of
    DTYPES, gamma/beta vectors of n elements, residual operands of the sum's shape."""
    tensors = [ann[k] for k in ("data", "residual", "gamma", "beta") if k in ann] + [ann["root"], out]
    if any(not isinstance(t.ty, relax.TensorType) or t.ty.shape is None for t in tensors):
        return ["operands are not tensors of known rank"]
    sum_ = ann.get("sum", ann["data"])
    problems = [
        f"{dtype_of(t)} tensors: the norm kernel takes {'/'.join(DTYPES)}" for t in tensors if dtype_of(t) not in DTYPES
    ]
    if problems:
        return problems[:1]
    eps, center, scale, problems = _norm_attrs(spec, ann)
    shape = shape_dims(sum_)
    n = static_int(shape[-1]) if shape else None
    if n is None:
        return [*problems, "the normalized (last) axis must be static"]
    if n > MAX_N:
        problems.append(f"normalized size {n} > {MAX_N}, the largest the kernel holds in registers")
    for role in ("residual", "data") if "sum" in ann else ():
        if not same_shape(shape_dims(ann[role]), shape):
            problems.append(f"the {role} of the residual add is broadcast to the sum (the kernel adds equal shapes)")
    if "sum" in ann:
        for role in ("data", "residual"):
            source, target = dtype_of(ann[role]), dtype_of(sum_)
            if source not in DTYPES:
                problems.append(f"the {role} dtype {source} is not one of {DTYPES}")
            elif source != target and target != "float32":
                # the kernel adds the operands as stored, in float32: exact only for widening casts
                problems.append(f"the {role} is cast from {source} to {target} before the add (a narrowing cast)")
    for role, used in (("gamma", scale), ("beta", center)):
        if role in ann and used:
            dims = static_shape(ann[role])
            if dims is None or not dims or dims[-1] != n or any(d != 1 for d in dims[:-1]):
                problems.append(f"the {role} must be a vector of the normalized size {n}")
    return problems


def read_problem(spec: NormSpec, ann: dict, out: relax.Expr, _var2val, _accumulator: str) -> NormProblem:
    eps, center, scale, _ = _norm_attrs(spec, ann)
    sum_ = ann.get("sum", ann["data"])
    shape = shape_dims(sum_)
    return NormProblem(
        rows=static_product(shape[:-1]),
        n=static_int(shape[-1]),
        norm="layer_norm" if spec.norm == "layer_norm" else "rms_norm",
        epsilon=as_float32(eps),
        data_dtype=dtype_of(ann["data"]),
        residual_dtype=dtype_of(ann["residual"]) if "residual" in ann else None,
        sum_dtype=dtype_of(sum_),
        gamma_dtype=dtype_of(ann["gamma"]) if scale else None,
        beta_dtype=dtype_of(ann["beta"]) if center and "beta" in ann else None,
        norm_dtype=dtype_of(ann["root"]),
        out_dtype=dtype_of(out),
    )
