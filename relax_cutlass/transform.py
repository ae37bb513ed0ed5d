"""The relax_cutlass passes, for use in `tvm.transform.Sequential([...])`."""

from .rewrites.broadcasts import MakeGemmBroadcastsExplicit
from .rewrites.canonicalize import AccumulateInFloat32, FixTvmCudaForms, FoldLinearReshapes
from .rewrites.conv1d import Conv1dAsConv2d
from .rewrites.gated import SplitPackedGatedProjections
from .rewrites.gathers import TakesAsSlices
from .rewrites.layout import ConvertToNHWC
from .rewrites.narrowing import NarrowFloat32Islands
from .rewrites.patchify import PatchifyConvs
from .rewrites.projections import FuseParallelProjections
from .rewrites.reductions import FastTvmReductions
from .rewrites.shapes import BoundSymbolicShapes
from .rewrites.token_order import CancelRowPermutations, SinkTokenPermutes
from .stages.codegen import CutlassCodegen
from .stages.constants import LiftConstants
from .stages.partition import PartitionForCutlass

__all__ = [
    "AccumulateInFloat32",
    "BoundSymbolicShapes",
    "CancelRowPermutations",
    "Conv1dAsConv2d",
    "ConvertToNHWC",
    "CutlassCodegen",
    "FastTvmReductions",
    "FixTvmCudaForms",
    "FoldLinearReshapes",
    "FuseParallelProjections",
    "LiftConstants",
    "MakeGemmBroadcastsExplicit",
    "NarrowFloat32Islands",
    "PartitionForCutlass",
    "PatchifyConvs",
    "SinkTokenPermutes",
    "SplitPackedGatedProjections",
    "TakesAsSlices",
]
