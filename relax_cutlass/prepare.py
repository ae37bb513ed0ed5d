"""Preparing an imported module for offload: weights bound and folded, NHWC, 16-bit compute.

What `from_torch` applies to the module it imports, public for modules imported another way (TVM's
ONNX frontend, hand-built modules), and the module to give TVM's own build as a baseline.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .rewrites.angles import AnglesInFloat32
from .rewrites.broadcasts import MakeGemmBroadcastsExplicit
from .rewrites.canonicalize import AccumulateInFloat32, UnbroadcastWeights
from .rewrites.fold import FoldWeightsInNumpy
from .rewrites.layout import ConvertToNHWC
from .rewrites.retype import RetypeFloat16
from .rewrites.shapes import BoundSymbolicShapes


def bind_weights(mod: tvm.IRModule, weights: dict[str, np.ndarray]) -> tvm.IRModule:
    """bind_params_by_name + FoldConstant: the scenario in which weights reach the offload passes
    as R.const tensors (and FoldConstant folds their permute_dims)."""
    mod = relax.transform.BindParams("main", weights)(mod)
    return relax.transform.FoldConstant()(mod)


def bind_float16(mod: tvm.IRModule, weights: dict[str, np.ndarray], dtype: str = "float16") -> tvm.IRModule:
    """A float32 model imported from a framework -> weights bound, NHWC, float16 compute
    (bind_params_by_name, then `to_float16`)."""
    return to_float16(relax.transform.BindParams("main", weights)(mod), dtype)


def to_float16(
    mod: tvm.IRModule, dtype: str = "float16", convert_layout: bool = True, accumulate_in_float32: bool = False
) -> tvm.IRModule:
    """A float32 model with its weights bound -> NHWC, float16 compute: ConvertToNHWC (batch norm
    folded into convolutions, filters re-laid out once), then TVM's ToMixedPrecision and
    FoldConstant, so every weight reaches the offload passes as a float16 constant. Inputs and
    outputs stay float32, as the framework model's.

    ToMixedPrecision gives each matmul the 16-bit out_dtype, which TVM's own build sums in;
    `accumulate_in_float32` spells them as float32 matmuls cast to `dtype` (AccumulateInFloat32),
    so that a TVM build of the module sums as torch does (from_torch sets it; offload_pipeline
    folds the casts back before partitioning). Angles that reach sin/cos are computed in float32
    (AnglesInFloat32): in 16 bits a rotary embedding is off by a quarter radian at position 511."""

    # symbolic shapes exact under the exported Dims' bounds, or FoldConstant cannot legalize the
    # module (rewrites/shapes.py; from_torch's import has applied it already)
    mod = BoundSymbolicShapes()(mod)
    mod = UnbroadcastWeights()(mod)  # before FoldConstant could materialize a broadcast weight
    if convert_layout:
        mod = ConvertToNHWC()(mod)
    # ToMixedPrecision lowers to float16 only (its out_dtype is the accumulator's): bfloat16 is
    # that graph retyped, before the weights are folded (rewrites/retype.py)
    mod = relax.transform.ToMixedPrecision(out_dtype="float16")(mod)
    if accumulate_in_float32:
        mod = AccumulateInFloat32()(mod)
    # sin/cos of rotary angles in float32, as torch computes them (rewrites/angles.py)
    mod = AnglesInFloat32()(mod)
    if dtype != "float16":
        mod = RetypeFloat16(dtype)(mod)
    return fold_weights(mod)


def fold_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """FoldConstant with the weight ops folded in numpy first (FoldWeightsInNumpy): bit for bit
    TVM's constants, without compiling an llvm kernel per weight op."""
    return relax.transform.FoldConstant()(FoldWeightsInNumpy()(mod))


def tvm_baseline(mod: tvm.IRModule) -> tvm.IRModule:
    """The module to give TVM's default build (`tvm.compile`, DLight schedules) as the baseline of
    a model that relax_cutlass offloads: `mod` (e.g. `bind_float16`'s NHWC float16 graph) with
    `MakeGemmBroadcastsExplicit` applied, and nothing else changed.

    TVM 0.27 cannot build a conv/matmul whose output a later op broadcasts (the squeeze-excitation
    scale of MobileNetV3: FuseOps fuses `scale * x` into the 1x1 conv's kernel and DLight's Matmul
    rule asserts "There are some consumers of the cache-write stage that are not properly
    inlined."). The rewrite spells such broadcasts out as `broadcast_to`, which keeps them out of
    the GEMM's kernel; values are unchanged and modules without the form are returned as they are.
    `offload_pipeline` applies the same pass to what it leaves in TVM.
    """

    return MakeGemmBroadcastsExplicit()(mod)
