"""Per-output-channel scales after a linear layer folded into its weights.

ConvNeXt's blocks end in `layer_scale * (x @ W + b) + residual` (CaiT-style layer scale, also in
DeiT-III and Swin-V2 variants): the multiply by a constant vector over the output features sits
between the GEMM and its residual add, so the add cannot fuse into the GEMM's epilogue and both
run as a separate TVM kernel over the whole activation. Since

    g * (x @ W + b) == x @ (W * g) + b * g        (g broadcast over the output features)

the scale is folded into the constant weight and bias once, at build time, and the GEMM's
epilogue then takes the residual add. The folded constants are computed in float32 and rounded
to the weights' dtype once; a fold is made only where that rounding is as accurate as storing the
product itself (relative Frobenius error within one 16-bit ulp, 2**-10): a scale that pushes the
weights into the subnormal range (a freshly initialized layer scale of 1e-6) is left as it was.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from ..ir import static_shape, use_counts

# Largest relative (Frobenius) error of a folded weight or bias against its exact float64 value.
FOLD_TOLERANCE = 2.0**-10


def _feature_vector(const: tvm.ir.GenericConst, n: int) -> np.ndarray | None:
    """The (n,) vector a constant broadcast over only the last axis holds, else None."""
    value = const.value.numpy()
    if value.ndim == 0 or value.shape[-1] != n or any(d != 1 for d in value.shape[:-1]):
        return None
    return value.reshape(n)


def _folded(value: np.ndarray, scale: np.ndarray) -> np.ndarray | None:
    """value * scale (scale over the last axis) in value's dtype, or None where rounding it there
    loses more than FOLD_TOLERANCE."""
    exact = value.astype("float64") * scale.astype("float64")
    rounded = exact.astype("float32").astype(value.dtype)
    norm = np.linalg.norm(exact)
    if not np.isfinite(rounded.astype("float64")).all() or norm == 0:
        return None
    return rounded if np.linalg.norm(rounded.astype("float64") - exact) <= FOLD_TOLERANCE * norm else None


def fold_output_scales(func: relax.Function) -> relax.Function:
    """`g * (x @ W [+ b])` with constant W (K, N), b and g over N -> `x @ (W * g) [+ b * g]`, where
    the GEMM's (and bias add's) result feeds nothing else (module docstring)."""
    x, weight, bias, scale = wildcard(), is_const(), is_const(), is_const()
    gemm = is_op("relax.matmul")(x, weight)
    biased = is_op("relax.add")(gemm, bias)
    scaled = is_op("relax.multiply")(gemm | biased, scale)
    uses = use_counts(func)
    bound = {value: var for var, value in relax.analysis.get_var2val(func).items()}

    def single_use(expr: relax.Expr) -> bool:
        var = bound.get(expr)
        return var is not None and uses.get(var, 0) == 1

    def rewrite(orig: relax.Call, m: dict) -> relax.Expr:
        w_shape = static_shape(m[weight])
        # rewrite_call also offers the variable of a var-to-var binding (gv = lv): the call is
        # rewritten where it is bound, once
        if not isinstance(orig, relax.Call) or w_shape is None or len(w_shape) != 2 or not single_use(m[gemm]):
            return orig
        n = w_shape[1]
        g = _feature_vector(m[scale], n)
        if g is None or (biased in m and not single_use(m[biased])):
            return orig
        w = _folded(m[weight].value.numpy(), g)
        if w is None:
            return orig
        y = relax.op.matmul(m[x], relax.const(w), out_dtype=str(m[gemm].attrs.out_dtype) or None)
        if biased in m:
            b = _folded(m[bias].value.numpy(), g) if _feature_vector(m[bias], n) is not None else None
            if b is None:
                return orig
            y = relax.op.add(y, relax.const(b))
        return y

    return rewrite_call(scaled, rewrite, func)
