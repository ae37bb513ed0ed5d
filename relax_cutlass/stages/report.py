"""offload_report: what was offloaded (op, epilogue, shapes, dtypes, kernel) and what stayed in TVM, why."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val

from ..patterns import conv2d_problems, matmul_problems, static_shape
from .constants import offloaded_functions
from .layout import layout_skipped


@dataclass(frozen=True)
class OffloadReport:
    """offloaded: one row per offloaded function; left_in_tvm: GEMM/conv2d ops that stayed in TVM,
    with the reasons; not_fused: offloaded roots where a larger fusion (their epilogue) was refused,
    with the pattern refused, the reasons, and the pattern offloaded instead."""

    offloaded: list[dict]
    left_in_tvm: list[dict]
    not_fused: list[dict] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(
            {
                "offloaded": self.offloaded,
                "left_in_tvm": self.left_in_tvm,
                "not_fused": self.not_fused,
                "offloaded_flop_fraction": self.offloaded_flop_fraction,
            },
            indent=2,
        )

    @property
    def offloaded_flop_fraction(self) -> float | None:
        """The offloaded share of the module's GEMM and conv2d FLOPs (call sites counted), or None
        when a symbolic shape makes a count unknown."""
        done = [_row_flops(r) * r.get("calls", 1) for r in self.offloaded if _row_flops(r) is not None]
        left = [r.get("flops") for r in self.left_in_tvm]
        if len(done) != len(self.offloaded) or None in left or not done + left:
            return None
        return sum(done) / (sum(done) + sum(left))

    def __str__(self) -> str:
        sites = sum(r.get("calls", 1) for r in self.offloaded)
        fraction = self.offloaded_flop_fraction
        targets = ", ".join(sorted({r["target"] for r in self.offloaded if "target" in r}))
        title = f"relax_cutlass offload report{' for ' + targets if targets else ''}"
        lines = [
            f"{title}: {sites} call(s) of {len(self.offloaded)} offloaded function(s), "
            f"{len(self.left_in_tvm)} candidate(s) left in TVM"
            + (f"; {100 * fraction:.1f}% of the GEMM/conv2d FLOPs offloaded" if fraction is not None else "")
        ]
        for r in self.offloaded:
            if r["op"] == "attention":
                lines.append(_attention_line(r))
                continue
            m, n, k = r["mnk"]
            dtypes = r["dtypes"]
            conv = r.get("conv")
            detail = (
                f" {'x'.join(map(str, conv['kernel_size']))} stride {conv['stride']} pad {conv['padding']}"
                + (f" split-K {conv['split_k']}" if conv["split_k"] > 1 else "")
                if conv
                else ""
            )
            lines.append(
                f"  [offloaded] {r['op']:6s} M={m} N={n} K={k}{detail} epilogue={r['epilogue']} "
                f"{dtypes.get('lhs', dtypes.get('data'))}->{dtypes['out']} (acc {dtypes['accumulator']}) "
                f"kernel={r['kernel']} ({r['selected_by']}{'; ' + r['note'] if r.get('note') else ''})"
                + (f" x{r['calls']} calls" if r.get("calls", 1) > 1 else "")
            )
        for r in self.left_in_tvm:
            lines.append(f"  [in TVM]    {r['op']} in {r['function']} {r['shapes']}: {'; '.join(r['reasons'])}")
        for r in self.not_fused:
            largest = r["refused"][0]
            outcome = f"offloaded as {r['fused_as']}" if r["fused_as"] else "stays in TVM"
            lines.append(
                f"  [not fused] {r['root']}: {largest['pattern']} refused ({'; '.join(largest['reasons'])}); {outcome}"
            )
        return "\n".join(lines)


def _row_flops(row: dict) -> int | None:
    """An offloaded row's FLOPs: attention rows carry theirs, GEMM/conv2d ones 2*M*N*K."""
    if "flops" in row:
        return row["flops"]
    return 2 * math.prod(row["mnk"]) if all(isinstance(d, int) for d in row["mnk"]) else None


def _attention_line(r: dict) -> str:
    a = r["attention"]
    return (
        f"  [offloaded] attention B={a['batch']} N={a['heads']} S={a['seq_q']} S_kv={a['seq_kv']} "
        f"H={a['head_dim']}/{a['head_dim_value']} scale={a['scale']:.6g} "
        + (f"bias={a['bias']} masked_rows={a['masked_rows']} " if "bias" in a else "")
        + f"{r['dtypes']['query']}->"
        f"{r['dtypes']['out']} (acc {r['dtypes']['accumulator']}) kernel={r['kernel']} "
        f"({r['selected_by']}{'; ' + r['note'] if r.get('note') else ''})"
        + (f" x{r['calls']} calls" if r.get("calls", 1) > 1 else "")
    )


def _calls(func: relax.Function, op_name: str) -> list[relax.Call]:
    calls: list[relax.Call] = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == op_name:
            calls.append(expr)

    relax.analysis.post_order_visit(func.body, visit)
    return calls


NOT_MATCHED = (
    "no relax_cutlass pattern matched here (the op is not in a dataflow block, or PartitionForCutlass has not run)"
)


def _shapes(call: relax.Call) -> list[str]:
    return [str(a.ty.shape) if hasattr(a.ty, "shape") else "?" for a in call.args]


def _flops(call: relax.Call) -> int | None:
    """Multiply-add FLOPs of a matmul (2 x output elements x K) or conv2d (2 x output elements x
    C/groups x R x S); None when a shape is symbolic."""
    out, lhs, rhs = static_shape(call), static_shape(call.args[0]), static_shape(call.args[1])
    if out is None or lhs is None or rhs is None:
        return None
    if call.op.name == "relax.nn.conv2d":
        out_channels = rhs[str(call.attrs.kernel_layout).index("O")]
        return 2 * math.prod(out) * math.prod(rhs) // out_channels
    return 2 * math.prod(out) * lhs[-1]


def _matmul_row(name: str, call: relax.Call, var2val, _layout_skipped: str | None) -> dict:
    rhs = call.args[1]
    producer = var2val.get(rhs) if isinstance(rhs, relax.Var) else None
    transposed = (
        isinstance(producer, relax.Call)
        and isinstance(producer.op, tvm.ir.Op)
        and producer.op.name == "relax.permute_dims"
    )
    reasons = matmul_problems(call, producer.args[0], producer) if transposed else matmul_problems(call, rhs)
    rank = len(rhs.ty.shape.values) if getattr(rhs.ty, "shape", None) is not None else 0
    op = "batched matmul" if rank > 2 else ("dense" if transposed else "matmul")
    return {
        "function": name,
        "op": op,
        "shapes": _shapes(call),
        "flops": _flops(call),
        "reasons": reasons or [NOT_MATCHED],
    }


def _conv2d_row(name: str, call: relax.Call, _var2val, layout_skipped: str | None) -> dict:
    return {
        "function": name,
        "op": "conv2d",
        "shapes": _shapes(call),
        "flops": _flops(call),
        "reasons": conv2d_problems(call, layout_skipped) or [NOT_MATCHED],
    }


ROOT_OPS = {"relax.matmul": _matmul_row, "relax.nn.conv2d": _conv2d_row}


def _left_in_tvm(mod: tvm.IRModule) -> list[dict]:
    rows, skipped = [], layout_skipped(mod)  # functions ConvertToNHWC left in NCHW, and why
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or (func.attrs and "Codegen" in func.attrs):
            continue
        var2val = get_var2val(func)
        for op_name, row in ROOT_OPS.items():
            rows += [row(gv.name_hint, call, var2val, skipped.get(gv.name_hint)) for call in _calls(func, op_name)]
    return rows


def offload_report(mod: tvm.IRModule, arch: str | int | None = None, **options) -> OffloadReport:
    """Report for a module before offload (partitioned on a copy), after partition, or after codegen."""
    from ..transform import ConvertToNHWC, FoldLinearReshapes
    from .codegen import REGIONS_ATTR, CodegenOptions, plan_regions
    from .constants import LiftConstants, call_counts
    from .partition import PartitionForCutlass

    attrs = mod.attrs or {}
    if REGIONS_ATTR in attrs:
        return OffloadReport(json.loads(str(attrs[REGIONS_ATTR])), _left_in_tvm(mod), _not_fused(mod))
    arch = arch if arch is not None else int(attrs.get("relax_cutlass.arch", 80))
    if "relax_cutlass.arch" not in attrs:  # not partitioned yet: do what offload_pipeline does, on a copy
        mod = PartitionForCutlass(arch)(ConvertToNHWC()(FoldLinearReshapes()(mod)))
    mod = LiftConstants()(mod)  # idempotent: a no-op when constants are already lifted
    # A report previews the plan; it never runs the GPU (the build itself profiles, see CodegenOptions).
    opts = CodegenOptions.create(arch, **({"profile": "never"} | options))
    calls = call_counts(mod)
    regions = plan_regions([f for _, f in offloaded_functions(mod)], opts)
    rows = [r.report_row() | {"calls": calls[r.symbol]} for r in regions]
    return OffloadReport(rows, _left_in_tvm(mod), _not_fused(mod))


def _not_fused(mod: tvm.IRModule) -> list[dict]:
    from .partition import NOT_FUSED_ATTR

    attrs = mod.attrs or {}
    return json.loads(str(attrs[NOT_FUSED_ATTR])) if NOT_FUSED_ATTR in attrs else []


__all__ = ["OffloadReport", "offload_report"]
