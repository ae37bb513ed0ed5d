"""offload_pipeline: the relax_cutlass passes in order, as one TVM pass."""

from __future__ import annotations

import tvm

from .arch import parse_arch
from .transform import ConvertToNHWC, CutlassCodegen, LiftConstants, PartitionForCutlass


def offload_pipeline(arch: str | int = "sm_80", convert_layout: bool = True, **options) -> tvm.transform.Pass:
    """[ConvertToNHWC ->] PartitionForCutlass -> LiftConstants -> CutlassCodegen.

    `arch="auto"` detects the local GPU (and fails clearly without one). `convert_layout` brings
    NCHW convolutions to NHWC first (a no-op without conv2d). Options go to CutlassCodegen:
    accumulator, m_hint, jobs, compile, family, tile.
    """
    sm = parse_arch(arch)
    layout = [ConvertToNHWC()] if convert_layout else []
    return tvm.transform.Sequential(
        [*layout, PartitionForCutlass(sm), LiftConstants(), CutlassCodegen(sm, **options)],
        name="relax_cutlass.offload_pipeline",
    )
