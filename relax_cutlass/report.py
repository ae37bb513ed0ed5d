"""offload_report: what was offloaded (op, epilogue, shapes, dtypes, kernel) and what stayed in TVM, why."""

from __future__ import annotations

import json
from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val

from .constants import offloaded_functions
from .patterns import matmul_problems


@dataclass(frozen=True)
class OffloadReport:
    offloaded: list[dict]
    left_in_tvm: list[dict]

    def to_json(self) -> str:
        return json.dumps({"offloaded": self.offloaded, "left_in_tvm": self.left_in_tvm}, indent=2)

    def __str__(self) -> str:
        lines = [
            f"relax_cutlass offload report: {len(self.offloaded)} region(s) offloaded, "
            f"{len(self.left_in_tvm)} candidate(s) left in TVM"
        ]
        for r in self.offloaded:
            m, n, k = r["mnk"]
            lines.append(
                f"  [offloaded] {r['op']:6s} M={m} N={n} K={k} epilogue={r['epilogue']} "
                f"{r['dtypes'].get('lhs')}->{r['dtypes']['out']} (acc {r['dtypes']['accumulator']}) "
                f"kernel={r['kernel']} ({r['selected_by']}{'; ' + r['note'] if r.get('note') else ''})"
            )
        for r in self.left_in_tvm:
            lines.append(f"  [in TVM]    {r['op']} in {r['function']} {r['shapes']}: {'; '.join(r['reasons'])}")
        return "\n".join(lines)


def _matmul_calls(func: relax.Function) -> list[relax.Call]:
    calls: list[relax.Call] = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.matmul":
            calls.append(expr)

    relax.analysis.post_order_visit(func.body, visit)
    return calls


def _left_in_tvm(mod: tvm.IRModule) -> list[dict]:
    rows = []
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or (func.attrs and "Codegen" in func.attrs):
            continue
        var2val = get_var2val(func)
        for call in _matmul_calls(func):
            rhs = call.args[1]
            producer = var2val.get(rhs) if isinstance(rhs, relax.Var) else None
            transposed = (
                isinstance(producer, relax.Call)
                and isinstance(producer.op, tvm.ir.Op)
                and producer.op.name == "relax.permute_dims"
            )
            reasons = matmul_problems(call, producer.args[0], producer) if transposed else matmul_problems(call, rhs)
            rank = len(rhs.ty.shape.values) if getattr(rhs.ty, "shape", None) is not None else 0
            rows.append(
                {
                    "function": gv.name_hint,
                    "op": "batched matmul" if rank > 2 else ("dense" if transposed else "matmul"),
                    "shapes": [str(a.ty.shape) if hasattr(a.ty, "shape") else "?" for a in call.args],
                    "reasons": reasons
                    or [
                        "no relax_cutlass pattern matched here (the matmul is not in a "
                        "dataflow block, or PartitionForCutlass has not run)"
                    ],
                }
            )
    return rows


def offload_report(mod: tvm.IRModule, arch: str | int | None = None, **options) -> OffloadReport:
    """Report for a module before offload (partitioned on a copy), after partition, or after codegen."""
    from .codegen import REGIONS_ATTR, CodegenOptions, plan_regions
    from .constants import LiftConstants
    from .partition import PartitionForCutlass

    attrs = mod.attrs or {}
    if REGIONS_ATTR in attrs:
        return OffloadReport(json.loads(str(attrs[REGIONS_ATTR])), _left_in_tvm(mod))
    arch = arch if arch is not None else int(attrs.get("relax_cutlass.arch", 80))
    if not any(True for _ in offloaded_functions(mod)):
        mod = PartitionForCutlass(arch)(mod)
    mod = LiftConstants()(mod)  # idempotent: a no-op when constants are already lifted
    opts = CodegenOptions.create(arch, **options)
    rows = [r.report_row() for r in plan_regions([f for _, f in offloaded_functions(mod)], opts)]
    return OffloadReport(rows, _left_in_tvm(mod))


__all__ = ["OffloadReport", "offload_report"]
