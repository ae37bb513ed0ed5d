"""launches_per_forward: how many kernels one call of a built module's function launches, the
offloaded ones and TVM's own. Time between the kernels (DenseNet's concatenations and batch norms,
squeeze-excitation scales) shows as TVM kernels here before it shows in a profile."""

from __future__ import annotations

import tvm
from tvm import relax

from ..kinds.ir import json_attr
from .codegen import REGIONS_ATTR


def _tvm_fusion() -> tvm.transform.Pass:
    """What tvm.compile's CUDA pipeline does to the ops left in TVM before it schedules them: TVM's
    zero pipeline (LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR, as
    tvm.relax.backend.cuda.pipeline's legalize_passes run them), then dataflow_lower_passes' view
    reshapes. Every fused TIR function left is one kernel of TVM's."""
    return tvm.transform.Sequential([relax.pipeline.zero_pipeline(), relax.transform.RewriteDataflowReshape()])


_CALL_TIR = ("relax.call_tir", "relax.call_tir_inplace", "relax.call_tir_with_grad")


def launches_per_forward(mod: tvm.IRModule, function: str = "main") -> dict[str, int]:
    """-> {"relax_cutlass": its kernel calls, "tvm": TVM's fused kernels, "other_externs": other
    packed calls} for one call of `function` in `mod`, a module `offload_pipeline` returned (built
    with `compile=False` or not). Counted in the IR, so each call site counts once; a TVM function
    holding several reductions may launch a few kernels where it is counted as one."""
    if function not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError(f"launches_per_forward: the module has no function {function!r}")
    if any(f.attrs is not None and "Codegen" in f.attrs for _, f in mod.functions_items()):
        raise ValueError(
            "launches_per_forward counts the module offload_pipeline returns; this one is only "
            "partitioned (its regions are still functions): run the whole pipeline first"
        )
    ours = {row["symbol"] for row in json_attr(mod, REGIONS_ATTR, [])}
    lowered = _tvm_fusion()(mod)
    counts = {"relax_cutlass": 0, "tvm": 0, "other_externs": 0}

    def visit(expr):
        if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
            return
        if expr.op.name in _CALL_TIR:
            counts["tvm"] += 1
        elif expr.op.name == "relax.call_dps_packed" and isinstance(expr.args[0], relax.ExternFunc):
            counts["relax_cutlass" if str(expr.args[0].global_symbol) in ours else "other_externs"] += 1

    relax.analysis.post_order_visit(lowered[function].body, visit)
    return counts


def launches_or_none(mod: tvm.IRModule) -> dict[str, int] | None:
    """`launches_per_forward(mod)`, or None where the module has no main or is not one the pipeline
    returned, or TVM's lowering of what it kept fails: for reports and records, which keep their
    other numbers (tvm.compile says why)."""
    try:
        return launches_per_forward(mod)
    except Exception:
        return None
