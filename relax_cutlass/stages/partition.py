"""PartitionForCutlass: group the regions every registered kind offloads into composite functions."""

from __future__ import annotations

import json
import warnings

import tvm
from tvm import relax

from ..arch import arch_name, parse_arch
from ..kinds import kind_of, kinds
from ..kinds.ir import json_attr
from ..rewrites.canonicalize import (
    FixTvmCudaForms,
    FoldLinearReshapes,
    drop_identity_broadcasts,
    fold_float32_accumulation,
    fold_scalar_casts,
)
from ..rewrites.conv1d import Conv1dAsConv2d
from ..rewrites.gated import SplitPackedGatedProjections
from ..rewrites.layout import ConvertToNHWC
from ..rewrites.narrowing import NarrowFloat32Islands
from ..rewrites.patchify import PatchifyConvs
from ..rewrites.projections import FuseParallelProjections
from ..rewrites.token_order import SinkTokenPermutes
from .constants import LiftConstants, composite_of
from .patterns import fusion_patterns, spec_by_name
from .regions import covers_body

NOT_FUSED_ATTR = "relax_cutlass.not_fused"


class FusionLog:
    """The larger fusions refused at each root that a smaller pattern then offloaded, and why.

    FuseOpsByPattern tries the patterns largest first and checks every structural match; a root's
    decisions therefore arrive as refusals, then the one pattern that was applied.
    """

    def __init__(self) -> None:
        self._roots: dict[relax.Var, dict] = {}

    def record(self, spec, ctx: relax.transform.PatternCheckContext, problems: list[str]) -> None:
        root = ctx.annotated_expr["root"]
        var = ctx.value_to_bound_var.get(root)
        if var is None:
            return
        entry = self._roots.setdefault(var, {"root": _describe(var, root), "refused": [], "fused_as": None})
        if entry["fused_as"] is not None:
            return
        # A pattern whose tail is optional (a chain of output views) is checked at each binding it
        # reaches: only its latest decision, about the longest match, stands.
        entry["refused"] = [r for r in entry["refused"] if r["pattern"] != spec.name]
        if not problems:
            entry["fused_as"] = spec.name
        else:
            entry["refused"].append({"pattern": spec.name, "reasons": problems})

    def rows(self) -> list[dict]:
        """Roots offloaded by a smaller pattern after refusals, and roots whose refused fusion is of
        a kind that reports it (`RegionKind.report_refused`: its ops stay in TVM, and the reason
        would otherwise be lost)."""
        specs = spec_by_name()
        rows = []
        for e in self._roots.values():
            if e["fused_as"]:
                # only larger fusions: an equal-size pattern of another kind (conv2d's at a depthwise
                # conv's root) is no fusion lost
                size = specs[e["fused_as"]].size
                refused = [r for r in e["refused"] if specs[r["pattern"]].size > size]
                if refused:
                    rows.append({**e, "refused": refused})
            elif any(kind_of(specs[r["pattern"]]).report_refused for r in e["refused"]):
                rows.append(e)
        return rows


def _describe(var: relax.Var, call: relax.Call) -> str:
    shapes = " x ".join(
        "(" + ", ".join(str(d.value) if hasattr(d, "value") else str(d) for d in a.ty.shape) + ")"
        for a in call.args
        if isinstance(a.ty, relax.TensorType) and a.ty.shape is not None
    )
    return f"{var.name} = {call.op.name}({shapes})"


ARCH_ATTR = "relax_cutlass.arch"


def check_same_arch(mod: tvm.IRModule, arch: int, doing: str) -> None:
    """Refuse to `doing` for `arch` a module relax_cutlass already partitioned or offloaded for
    another arch: its regions were checked, and its kernels built, for that one (an sm_90a kernel
    call kept in a module re-labelled sm_80 cannot run on an A100)."""
    before = (mod.attrs or {}).get(ARCH_ATTR)
    if before is not None and int(before) != arch:
        raise ValueError(
            f"this module was already partitioned for {arch_name(int(before))} by relax_cutlass, so it cannot "
            f"{doing} for {arch_name(arch)}: its regions were checked and its kernels built for "
            f"{arch_name(int(before))}. Run offload_pipeline({arch_name(arch)!r}) on the module as it was before "
            "relax_cutlass (e.g. from_torch's result), or keep the first arch"
        )


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.PartitionForCutlass")
class PartitionForCutlass:
    """Mark each legal region of a registered kind as a composite function for the relax_cutlass codegen.

    Constants stay bound inside the regions (LiftConstants then turns tensor constants into
    parameters and keeps scalar ones as kernel literals). Regions that fail a legality rule stay in
    TVM, and a larger fusion refused in favour of a smaller one is logged under the module attribute
    `relax_cutlass.not_fused`; `relax_cutlass.offload_report` shows both, with the reasons.

    Parameters
    ----------
    arch: target SM as "sm_80", "sm_90a", 80, ... ("auto" detects the local GPU). Kept on the
        module so later stages and the report agree on what the partition was checked against.
    """

    def __init__(self, arch: str | int = "sm_80"):
        self.arch = parse_arch(arch)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        check_same_arch(mod, self.arch, "offload it")
        mod = relax.transform.ConvertToDataflow()(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and not (func.attrs and "Codegen" in func.attrs):
                for rewrite in [r for kind in kinds() for r in kind.prepare]:
                    func = guarded_rewrite(rewrite, func, gv.name_hint)
                func = fold_scalar_casts(drop_identity_broadcasts(fold_float32_accumulation(func)))
                for rewrite in [r for kind in kinds() for r in kind.finish]:
                    func = guarded_rewrite(rewrite, func, gv.name_hint)
                mod[gv] = func
        log = FusionLog()
        mod = relax.transform.FuseOpsByPattern(fusion_patterns(log), bind_constants=True, annotate_codegen=True)(mod)
        mod = relabel_partial_regions(mod)
        previous = json_attr(mod, NOT_FUSED_ATTR, [])
        return mod.with_attr(ARCH_ATTR, self.arch).with_attr(NOT_FUSED_ATTR, json.dumps(previous + log.rows()))


def _with_composite(func: relax.Function, old: relax.Function, new: relax.Function) -> relax.Function:
    """The offloaded function `func` wrapping composite `new` where it wrapped `old`."""
    blocks = []
    for block in func.body.blocks:
        bindings = [relax.VarBinding(b.var, new) if b.value.same_as(old) else b for b in block.bindings]
        dataflow = isinstance(block, relax.DataflowBlock)
        blocks.append(relax.DataflowBlock(bindings) if dataflow else relax.BindingBlock(bindings))
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)


def relabel_partial_regions(mod: tvm.IRModule) -> tvm.IRModule:
    """Regions whose body is no longer their pattern, renamed after the largest pattern of their kind
    that is all of it. Where two matches of one pattern overlap (GPT-NeoX's parallel residual: the
    attention's and the MLP's layer norms both read one residual sum), FuseOpsByPattern gives the
    second region what the first left of it, the norm without the add, under the first's name; its
    kernel then failed at codegen and went back to TVM. Renamed, it is offloaded as what it is."""
    specs = spec_by_name()
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or "Codegen" not in (func.attrs or {}):
            continue
        composite = composite_of(func)
        spec = specs.get(str(composite.attrs["Composite"]))
        if spec is None or covers_body(composite, spec):
            continue
        kind = kind_of(spec)
        fits = [s for s in specs.values() if kind_of(s) is kind and covers_body(composite, s)]
        if fits:
            best = max(fits, key=lambda s: s.size)
            mod[gv] = _with_composite(func, composite, composite.with_attr("Composite", best.name))
    return mod


class RewriteSkippedWarning(UserWarning):
    """A kind's function rewrite raised on a user's graph: the function went on without it (the
    regions it would have formed stay in TVM). The test suite turns this warning into an error."""


def guarded_rewrite(rewrite, func: relax.Function, name: str) -> relax.Function:
    """`rewrite(func)`, or `func` unchanged, with a RewriteSkippedWarning saying which rewrite failed
    on which function and why, where it raises: a graph no rewrite foresaw never fails the pipeline."""
    try:
        return rewrite(func)
    except Exception as err:  # noqa: BLE001 - any failure of a rewrite leaves the function as it was
        label = getattr(rewrite, "__name__", type(rewrite).__name__)
        warnings.warn(
            f"relax_cutlass: the {label} rewrite failed on function {name} ({type(err).__name__}: {err}); "
            "the function continues without it. Please report the model.",
            RewriteSkippedWarning,
            stacklevel=2,
        )
        return func


def pre_partition_passes(convert_layout: bool = True) -> list[tvm.transform.Pass]:
    """The rewrites offload_pipeline runs before PartitionForCutlass, in its order: whatever previews
    the partition (the offload report, tuning, kernel dumps, the tests' CPU harness) runs exactly
    these, so it plans the regions the build gets."""
    layout = [ConvertToNHWC()] if convert_layout else []
    return [
        FixTvmCudaForms(),
        FoldLinearReshapes(),
        NarrowFloat32Islands(),
        PatchifyConvs(),
        SinkTokenPermutes(),
        SplitPackedGatedProjections(),
        FuseParallelProjections(),
        Conv1dAsConv2d(),
        *layout,
    ]


def partition_as_offloaded(mod: tvm.IRModule, arch: str | int = "sm_80", convert_layout: bool = True) -> tvm.IRModule:
    """`mod` partitioned (constants lifted) as offload_pipeline partitions it before codegen."""
    for rewrite in pre_partition_passes(convert_layout):
        mod = rewrite(mod)
    return LiftConstants()(PartitionForCutlass(parse_arch(arch))(mod))
