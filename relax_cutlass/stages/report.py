"""offload_report: what was offloaded (op, epilogue, shapes, dtypes, kernel) and what stayed in TVM, why."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.relax.analysis import get_var2val

from ..arch import arch_name, parse_arch
from ..kinds import CODEGEN, kind_of, kinds
from ..kinds.ir import json_attr
from ..rewrites.canonicalize import fold_float32_accumulation
from ..rewrites.layout import layout_skipped
from .codegen import REGIONS_ATTR, RETURNED_ATTR, RETURNED_PATTERN_ATTR, CodegenOptions, plan_regions, return_to_tvm
from .constants import LiftConstants, call_counts, offloaded_functions
from .launches import launches_or_none
from .partition import ARCH_ATTR, NOT_FUSED_ATTR, check_same_arch, partition_as_offloaded
from .patterns import spec_by_name


@dataclass(frozen=True)
class OffloadReport:
    """offloaded: one row per offloaded function; left_in_tvm: root ops of the region kinds that
    stayed in TVM, with the reasons; not_fused: offloaded roots where a larger fusion (their epilogue) was refused,
    with the pattern refused, the reasons, and the pattern offloaded instead."""

    offloaded: list[dict]
    left_in_tvm: list[dict]
    not_fused: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the report itself (asked for another arch)
    # kernels one call of main launches (launches_per_forward), for a module the pipeline returned
    launches: dict[str, int] | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "offloaded": self.offloaded,
                "left_in_tvm": self.left_in_tvm,
                "not_fused": self.not_fused,
                "notes": self.notes,
                "launches_per_forward": self.launches,
                "offloaded_flop_fraction": self.offloaded_flop_fraction,
            },
            indent=2,
        )

    @property
    def offloaded_flop_fraction(self) -> float | None:
        """The offloaded share of the FLOPs of the module's region roots (call sites counted), or None
        when a symbolic shape makes a count unknown."""
        done = [_row_flops(r) * r.get("calls", 1) for r in self.offloaded if _row_flops(r) is not None]
        left = [r.get("flops") for r in self.left_in_tvm]
        if len(done) != len(self.offloaded) or None in left or not sum(done) + sum(left):
            return None  # unknown, or no FLOPs counted (memory-bound kinds' rows carry 0)
        return sum(done) / (sum(done) + sum(left))

    def __str__(self) -> str:
        sites = sum(r.get("calls", 1) for r in self.offloaded)
        fraction = self.offloaded_flop_fraction
        targets = ", ".join(sorted({r["target"] for r in self.offloaded if "target" in r}))
        title = f"relax_cutlass offload report{' for ' + targets if targets else ''}"
        lines = [
            f"{title}: {sites} call(s) of {len(self.offloaded)} offloaded function(s), "
            f"{len(self.left_in_tvm)} candidate(s) left in TVM"
            + (f"; {100 * fraction:.1f}% of the {_flops_name()} FLOPs offloaded" if fraction is not None else "")
        ]
        if self.launches is not None:
            lines.append(
                f"  [launches]  one call of main: {self.launches['relax_cutlass']} relax_cutlass kernel(s), "
                f"{self.launches['tvm']} TVM kernel(s)"
                + (f", {self.launches['other_externs']} other packed call(s)" if self.launches["other_externs"] else "")
            )
        for r in self.offloaded:
            lines.append(_kind_of_row(r).report_line(r))
        for r in self.left_in_tvm:
            lines.append(f"  [in TVM]    {r['op']} in {r['function']} {r['shapes']}: {'; '.join(r['reasons'])}")
        lines += [f"  [note]      {note}" for note in self.notes]
        for r in self.not_fused:
            largest = r["refused"][0]
            outcome = f"offloaded as {r['fused_as']}" if r["fused_as"] else "stays in TVM"
            lines.append(
                f"  [not fused] {r['root']}: {largest['pattern']} refused ({'; '.join(largest['reasons'])}); {outcome}"
            )
        return "\n".join(lines)


def _row_flops(row: dict) -> int | None:
    """An offloaded row's FLOPs: a row may carry its own, else 2*M*N*K."""
    if "flops" in row:
        return row["flops"]
    return 2 * math.prod(row["mnk"]) if all(isinstance(d, int) for d in row["mnk"]) else None


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


def _left_in_tvm(mod: tvm.IRModule) -> list[dict]:
    rows, skipped = [], layout_skipped(mod)  # functions ConvertToNHWC left in NCHW, and why
    # regions CutlassCodegen gave back to TVM (they could not be planned or compiled), and why
    returned = json_attr(mod, RETURNED_ATTR, {})
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or (func.attrs and "Codegen" in func.attrs):
            continue
        # Ops are judged in the 16-bit form the patterns saw: offload_pipeline ends by spelling what
        # stays in TVM as float32 sums cast back (AccumulateInFloat32), which is not why they stayed.
        func = fold_float32_accumulation(func)
        var2val = get_var2val(func)
        notes = None  # the kinds' notes on this function's calls, found at its first row
        for kind in kinds():
            for op_name, row in kind.left_in_tvm.items():
                for call in _calls(func, op_name):
                    judged = row(call, var2val, skipped.get(gv.name_hint))
                    if judged is None:  # another kind's op (a kind reports only its own)
                        continue
                    op, flops, reasons = judged
                    if gv.name_hint in returned:
                        reasons = [f"offloaded, then returned to TVM at codegen: {returned[gv.name_hint]}"]
                    if notes is None:
                        notes = [k.explain_left_in_tvm(func, var2val) for k in kinds() if k.explain_left_in_tvm]
                    reasons = [found[call] for found in notes if call in found] + list(reasons)
                    rows.append(
                        {
                            "function": gv.name_hint,
                            "op": op,
                            "shapes": _shapes(call),
                            "flops": flops,
                            "reasons": reasons or [NOT_MATCHED],
                        }
                    )
        if gv.name_hint in returned and not any(r["function"] == gv.name_hint for r in rows):
            # a returned region whose ops no kind reports as left in TVM (a normalization, a
            # concatenation): one row for the region, named by its pattern
            attrs = mod[gv].attrs or {}
            pattern = str(attrs[RETURNED_PATTERN_ATTR]) if RETURNED_PATTERN_ATTR in attrs else "region"
            reason = f"offloaded, then returned to TVM at codegen: {returned[gv.name_hint]}"
            rows.append(
                {
                    "function": gv.name_hint,
                    "op": pattern.removeprefix(f"{CODEGEN}."),
                    "shapes": [str(p.ty.shape) for p in func.params if hasattr(p.ty, "shape")],
                    "flops": 0,
                    "reasons": [reason],
                }
            )
    return rows


def _flops_name() -> str:
    """What the FLOP fraction counts, in the report's text: the kinds' root ops."""
    return "/".join(kind.flops_name for kind in kinds() if kind.flops_name)


def _kind_of_row(row: dict):
    return kind_of(spec_by_name()[row["composite"]])


def offload_report(mod: tvm.IRModule, arch: str | int | None = None, **options) -> OffloadReport:
    """Report for a module before offload (partitioned on a copy), after partition, or after codegen."""
    attrs = mod.attrs or {}
    if REGIONS_ATTR in attrs:
        notes = _built_for_another_arch(mod, arch)
        rows, left, not_fused = json_attr(mod, REGIONS_ATTR, []), _left_in_tvm(mod), _not_fused(mod)
        return OffloadReport(rows, left, not_fused, notes, launches_or_none(mod))
    if arch is not None:
        check_same_arch(mod, parse_arch(arch), "report its plan")
    arch = arch if arch is not None else int(attrs.get(ARCH_ATTR, 80))
    if ARCH_ATTR not in attrs:  # not partitioned yet: do what offload_pipeline does, on a copy
        mod = partition_as_offloaded(mod, arch)
    mod = LiftConstants()(mod)  # idempotent: a no-op when constants are already lifted
    # A report previews the plan; it never runs the GPU (the build itself profiles, see CodegenOptions).
    opts = CodegenOptions.create(arch, **({"profile": "never"} | options))
    failed: dict[str, str] = {}
    regions = plan_regions([f for _, f in offloaded_functions(mod)], opts, failed)
    if failed:  # as CutlassCodegen will: those regions go back to TVM, and the report says why
        mod = return_to_tvm(mod, failed)
    calls = call_counts(mod)
    rows = [r.report_row() | {"calls": calls[r.symbol]} for r in regions if r.symbol not in failed]
    return OffloadReport(rows, _left_in_tvm(mod), _not_fused(mod))


def _built_for_another_arch(mod: tvm.IRModule, arch) -> list[str]:
    """A note (and a warning) where the report of an offloaded module is asked for another arch
    than its kernels were built for: the report shows what the module holds."""
    built = (mod.attrs or {}).get(ARCH_ATTR)
    if arch is None or built is None or parse_arch(arch) == int(built):
        return []
    note = (
        f"asked for {arch_name(parse_arch(arch))}, but this module's kernels were built for "
        f"{arch_name(int(built))}: this is the report of what it holds; offload the module as it was before "
        f"relax_cutlass for {arch_name(parse_arch(arch))} to see that plan"
    )
    warnings.warn(note, stacklevel=3)
    return [note]


def _not_fused(mod: tvm.IRModule) -> list[dict]:
    return json_attr(mod, NOT_FUSED_ATTR, [])


__all__ = ["OffloadReport", "offload_report"]
