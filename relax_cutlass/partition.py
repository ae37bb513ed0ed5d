"""PartitionForCutlass: group offloadable GEMM + epilogue regions into composite functions."""

from __future__ import annotations

import tvm
from tvm import relax

from .patterns import fusion_patterns


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.PartitionForCutlass")
class PartitionForCutlass:
    """Mark each legal GEMM + epilogue region as a composite function for the relax_cutlass codegen.

    Constants stay bound inside the regions (LiftConstants then turns tensor constants into
    parameters and keeps scalar ones as kernel literals). Regions that fail a legality rule stay in
    TVM; `relax_cutlass.offload_report` says why.

    Parameters
    ----------
    arch: target SM as "sm_80", "sm_90a", 80, ... ("auto" detects the local GPU). Kept on the
        module so later stages and the report agree on what the partition was checked against.
    """

    def __init__(self, arch: str | int = "sm_80"):
        from .arch import parse_arch

        self.arch = parse_arch(arch)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = relax.transform.ConvertToDataflow()(mod)
        mod = relax.transform.FuseOpsByPattern(fusion_patterns(), bind_constants=True, annotate_codegen=True)(mod)
        return mod.with_attr("relax_cutlass.arch", self.arch)
