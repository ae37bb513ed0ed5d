"""The relax_cutlass passes, for use in `tvm.transform.Sequential([...])`."""

from .stages.broadcasts import MakeGemmBroadcastsExplicit
from .stages.canonicalize import AccumulateInFloat32, FixTvmCudaForms, FoldLinearReshapes
from .stages.codegen import CutlassCodegen
from .stages.constants import LiftConstants
from .stages.layout import ConvertToNHWC
from .stages.partition import PartitionForCutlass

__all__ = [
    "AccumulateInFloat32",
    "ConvertToNHWC",
    "CutlassCodegen",
    "FixTvmCudaForms",
    "FoldLinearReshapes",
    "LiftConstants",
    "MakeGemmBroadcastsExplicit",
    "PartitionForCutlass",
]
