"""The relax_cutlass passes, for use in `tvm.transform.Sequential([...])`."""

from .broadcasts import MakeGemmBroadcastsExplicit
from .canonicalize import AccumulateInFloat32, FixTvmCudaForms, FoldLinearReshapes
from .codegen import CutlassCodegen
from .constants import LiftConstants
from .layout import ConvertToNHWC
from .partition import PartitionForCutlass

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
