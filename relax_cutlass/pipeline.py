"""offload_pipeline: the three passes in order, as one TVM pass."""

from __future__ import annotations

import tvm

from .arch import parse_arch
from .transform import CutlassCodegen, LiftConstants, PartitionForCutlass


def offload_pipeline(arch: str | int = "sm_80", **options) -> tvm.transform.Pass:
    """PartitionForCutlass -> LiftConstants -> CutlassCodegen.

    `arch="auto"` detects the local GPU (and fails clearly without one). Options go to
    CutlassCodegen: accumulator, m_hint, jobs, compile.
    """
    sm = parse_arch(arch)
    return tvm.transform.Sequential(
        [PartitionForCutlass(sm), LiftConstants(), CutlassCodegen(sm, **options)],
        name="relax_cutlass.offload_pipeline",
    )
