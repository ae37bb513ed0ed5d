"""The relax_cutlass passes, for use in `tvm.transform.Sequential([...])`."""

from .broadcasts import MakeGemmBroadcastsExplicit
from .canonicalize import FoldLinearReshapes, WidenNarrowCumsums
from .codegen import CutlassCodegen
from .constants import LiftConstants
from .layout import ConvertToNHWC
from .partition import PartitionForCutlass

__all__ = [
    "ConvertToNHWC",
    "CutlassCodegen",
    "FoldLinearReshapes",
    "LiftConstants",
    "MakeGemmBroadcastsExplicit",
    "PartitionForCutlass",
    "WidenNarrowCumsums",
]
