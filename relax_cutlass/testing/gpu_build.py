"""Building GPU-suite cases (TVM compiler + nvcc; no GPU needed): relax_cutlass's build of a model
beside TVM's own default CUDA build of it, exported as libraries with a manifest entry saying what
was offloaded. Shared by the GPU tests (tests/test_gpu_suite.py, built in-process on the GPU host)
and the suite benchmarks (bench/gpu_suite.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tvm
from tvm import relax

import relax_cutlass
import relax_cutlass.arch
from relax_cutlass.kinds.ir import ConstantsToParams
from relax_cutlass.prepare import bind_float16

from .gpu_common import random_array
from .models import conv2d_epilogue_model


def target(arch: str) -> tvm.target.Target:
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")


def local_arch() -> str:
    """This machine's GPU as a target arch string (sm_90a on a Hopper: its native kernels need the a)."""
    sm = relax_cutlass.arch.local_gpu_arch()
    if sm is None:
        raise RuntimeError("no local GPU to build for")
    return f"sm_{sm}{'a' if sm == 90 else ''}"


def params_of(mod: tvm.IRModule) -> list[dict]:
    out = []
    for p in mod["main"].params:
        dims = [int(d) if hasattr(d, "value") else str(d) for d in p.ty.shape.values]
        out.append({"name": p.name, "shape": dims, "dtype": str(p.ty.dtype)})
    return out


def weight_names(mod: tvm.IRModule) -> set[str]:
    """Every parameter but the model inputs (x, residual): what a bound build folds in."""
    return {p["name"] for p in params_of(mod) if p["name"] not in ("x", "residual")}


def bind(mod: tvm.IRModule, names: set[str], seed: int = 0) -> tvm.IRModule:
    values = {
        p["name"]: random_array(p["name"], p["shape"], p["dtype"], seed) for p in params_of(mod) if p["name"] in names
    }
    return relax.transform.FoldConstant()(relax.transform.BindParams("main", values)(mod))


def bert_flops(batch: int, seq: int, layers: int, hidden: int = 1024, ffn: int = 4096) -> int:
    """Multiply-add FLOPs of a BERT encoder: the six dense layers plus attention's two matmuls."""
    tokens = batch * seq
    return layers * (2 * tokens * (4 * hidden * hidden + 2 * hidden * ffn) + 2 * 2 * tokens * seq * hidden)


def stage_model(batch: int, hw: int, channels: int) -> tvm.IRModule:
    """One ResNet-50 3x3 conv + bias + relu, NHWC (as inside an offloaded ResNet)."""
    return conv2d_epilogue_model(batch, hw, hw, channels, channels, activation="relu", layout="NHWC")


def shippable(mod: tvm.IRModule, weights: dict) -> tvm.IRModule:
    """The model with its weights bound, folded and in float16 (bind_float16: the
    bind_params_by_name + FoldConstant scenario), then every folded weight turned back into a
    named parameter.

    A real model's float16 weights (50 MB for ResNet-50, 670 MB for BERT-large) cannot be carried
    to the GPU host, so both builds (relax_cutlass and TVM's) take the folded weights as parameters
    and the GPU side regenerates them by name (relax_cutlass/testing/gpu_common.random_array); the graph, and what
    relax_cutlass offloads and fuses, is the bound model's.
    """
    func = bind_float16(mod, weights)["main"]

    def name(index: int, const) -> str:
        shape = [int(d) for d in const.ty.shape.values]
        return f"p{index}_{'b' if sum(d > 1 for d in shape) == 1 else 'w'}"  # a vector, or a weight

    lifter = ConstantsToParams(name=name)
    body = lifter.visit_expr(func.body)
    params = [*func.params, *(var for var, _ in lifter.lifted)]
    return tvm.IRModule({"main": relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs)})


def shippable_resnet50(batch: int) -> tvm.IRModule:
    """ResNet-50 from PyTorch (torch.export + from_exported_program), batch norm folded, NHWC."""
    from .models.torch_models import resnet50_module

    return shippable(*resnet50_module(batch=batch, image=224))


def shippable_bert_large(batch: int, seq: int, layers: int) -> tvm.IRModule:
    """The Hugging Face transformers BERT-large encoder (random init) through torch.export."""
    from .models.torch_transformers import bert_module

    return shippable(*bert_module(batch=batch, seq=seq, layers=layers))


def build_pair(
    name: str,
    mod: tvm.IRModule,
    out: Path,
    arch: str,
    bind_weights: bool,
    options: dict,
    families=("auto",),
    with_reference: bool = True,
    cuda_graph: bool = False,
    tuning_db: str = "",
) -> dict:
    """relax_cutlass builds (one per kernel family: `<name>.cutlass.so`, `<name>.cutlass_sm80.so`;
    "tuned": the kernels `tuning_db` names, `<name>.cutlass_tuned.so`) and TVM's default build
    (`<name>.tvm.so`); with `cuda_graph`, both again compiled with TVM's CUDA-graph rewrite on
    (`<name>.cutlass_graph.so`, `<name>.tvm_graph.so`): the VM then replays each static stretch of
    kernel launches as one graph instead of calling them one by one. -> the case's manifest entry."""
    offload_in = bind(mod, weight_names(mod)) if bind_weights else mod
    sm80_kernels, tuned = [], []
    for family in families:
        t0 = time.time()
        offloaded = relax_cutlass.offload_pipeline(arch, **family_options(family, tuning_db), **options)(offload_in)
        t_offload = time.time() - t0
        suffix = "cutlass" if family == "auto" else f"cutlass_{family}"
        tvm.compile(offloaded, target(arch)).export_library(str(out / f"{name}.{suffix}.so"))
        family_report = relax_cutlass.offload_report(offloaded)
        if family == "auto":
            native = (offloaded, t_offload, family_report)
        elif family == "sm80":
            sm80_kernels = [r["kernel"] for r in family_report.offloaded]
        else:
            tuned = [(r["kernel"], r["selected_by"]) for r in family_report.offloaded]
    offloaded, t_offload, report = native
    t0 = time.time()
    if with_reference:
        tvm.compile(mod, target(arch)).export_library(str(out / f"{name}.tvm.so"))
    t_ref = time.time() - t0
    if cuda_graph:
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
            tvm.compile(offloaded, target(arch)).export_library(str(out / f"{name}.cutlass_graph.so"))
            tvm.compile(mod, target(arch)).export_library(str(out / f"{name}.tvm_graph.so"))
    print(
        f"  {name}: offload+nvcc {t_offload:.1f}s, tvm default build {t_ref:.1f}s, "
        f"{len(report.offloaded)} offloaded / {len(report.left_in_tvm)} left",
        flush=True,
    )
    return {
        "name": name,
        "cutlass_params": params_of(offloaded),
        "tvm_params": params_of(mod),
        "offloaded": report.offloaded,
        "left_in_tvm": report.left_in_tvm,
        "offloaded_flop_fraction": report.offloaded_flop_fraction,
        "build_seconds": {"offload": t_offload, "tvm": t_ref},
        "families": list(families),
        "sm80_kernels": sm80_kernels,
        "tuned_kernels": tuned,
        "cuda_graph": cuda_graph,
    }


def family_options(family: str, tuning_db: str) -> dict:
    """A kernel family's codegen options: "tuned" takes the database's kernels instead of the
    heuristic's, the others name a family ("auto": the target's native kernels, "sm80")."""
    return {"tuning_db": tuning_db} if family == "tuned" else {"family": family}


@dataclass(frozen=True)
class SuiteCase:
    """One case of the GPU suite: its section (the manifest key: tests, conv, graphs, frontends,
    attention for the checks; bench, conv_bench, sweep, model, resnet, bert for the benchmarks), how
    to build its module, and what its entry tells the checks and timers: the runs' symbolic sizes,
    the float64 reference's `spec`, and any other `fields` (a benchmark's shape and FLOPs)."""

    section: str
    name: str
    model: Callable[[], tuple[tvm.IRModule, bool]]  # -> (module, bind its weights)
    options: dict = field(default_factory=dict)
    families: tuple[str, ...] = ("auto",)
    runs: tuple[dict, ...] = ({},)
    spec: dict | None = None
    fields: dict = field(default_factory=dict)
    with_reference: bool = True
    cuda_graph: bool = False


def build_case(case: SuiteCase, out: Path, arch: str, tuning_db: str = "") -> dict:
    """Build `case` for `arch` into `out` (build_pair): its manifest entry, with the runs, the
    reference spec and the fields the checks and timers read."""
    mod, bind_weights = case.model()
    entry = build_pair(
        case.name, mod, out, arch, bind_weights, case.options, families=case.families,
        with_reference=case.with_reference, cuda_graph=case.cuda_graph, tuning_db=tuning_db,
    )  # fmt: skip
    entry["runs"] = list(case.runs)
    if case.spec is not None:
        entry["spec"] = case.spec
    return entry | case.fields


def prewarm(cases: list[SuiteCase], arch: str, tuning_db: str = "") -> None:
    """Compile every distinct kernel of every case and family up front, all cores busy: nvcc is
    the bottleneck, and the cases then build one by one from the object cache
    (RELAX_CUTLASS_CACHE_DIR)."""
    from relax_cutlass.pipeline import partition_as_offloaded
    from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
    from relax_cutlass.stages.constants import offloaded_functions
    from relax_cutlass.stages.emit import emit_kernel
    from relax_cutlass.toolkit.compile import compile_all

    sources = {}
    for case in cases:
        mod, bind_weights = case.model()
        part = partition_as_offloaded(bind(mod, weight_names(mod)) if bind_weights else mod, arch)
        funcs = [f for _, f in offloaded_functions(part)]
        for family in case.families:
            options = CodegenOptions.create(arch, **family_options(family, tuning_db), **case.options)
            for region in plan_regions(funcs, options):
                sources[region.kernel.name] = emit_kernel(region.kernel)
    t0 = time.time()
    results = compile_all(list(sources.values()), relax_cutlass.arch.parse_arch(arch))
    fresh = sum(not cached for _, cached in results.values())
    print(f"prewarm: {len(sources)} distinct kernels, {fresh} compiled, {time.time() - t0:.0f}s", flush=True)
