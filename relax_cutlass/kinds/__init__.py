"""Region kinds: what relax_cutlass offloads, one package per kind.

A kind (GEMM, conv2d, fused attention, ...) is everything the shared stages need to know about one
sort of offloaded region, as one frozen `RegionKind` record: its pattern specs and legality rules,
how an offloaded function reads back into its problem record, how a kernel is chosen, the C++ it
emits, how it is profiled and checked. The shared stages (`relax_cutlass.stages`) hold no
kind-specific code: they iterate over `kinds()` and ask the kind of a spec, problem, kernel or
region (`kind_of`).

Adding a kind is a new package `relax_cutlass/kinds/<name>/` whose `kind` module defines `KIND`, plus
its name in `REGISTERED` (or `register(KIND)` at run time, for a kind that lives elsewhere). The
package's `reference` module (numpy only: it runs on GPU hosts with just the TVM runtime) gives the
profiler's float32 reference. docs/architecture.md walks through an example.

This module imports nothing from TVM's compiler: the GPU host's profile runner imports it.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from string import Template

CODEGEN = "relax_cutlass"

# The built-in kinds, one line each: the package name under relax_cutlass.kinds (its `kind`
# module defines KIND). The order is that of each kernel ABI's struct in the glue and profiler
# sources, and of patterns of equal size.
REGISTERED = [
    "gemm",
    "conv2d",
    "attention",
    "depthwise_conv2d",
    "norm",
    "channel_affine",
]
# Built-in kinds registered only on request (`enable(name)`, or their names, comma-separated, in
# RELAX_CUTLASS_ENABLE_KINDS): bias_act is the docs' example kind. A kind is opt-in while it is
# unverified on a GPU (depthwise_conv2d and channel_affine were); its name stays accepted there once
# it is registered by default.
OPT_IN = ("bias_act",)
ENABLE_ENV = "RELAX_CUTLASS_ENABLE_KINDS"


@dataclass(frozen=True)
class Profiling:
    """How the profiler tunes a kind (relax_cutlass.stages.profile)."""

    # (problem, arch, family, limit) -> stage-1 ProfileJobs (no epilogue), [] when not profiled
    jobs: Callable
    # (kernel, split_k) -> the candidate's label in manifests and tuning records
    label: Callable
    # per candidate kernel: a TVM FFI timing function; a Template over index, kernel, bias, residual
    timing_function: Template
    # ProfileJob -> the problem's fields of its manifest entry, for the runner and its reference
    job_fields: Callable
    # (problem, arch, family) -> [(stage-1 TuningKey, concrete problem)]: stage 2 times these with
    # the region's epilogue. None: the kind has no epilogue stage.
    stage2_keys: Callable | None = None
    # (problem, epilogue, arch, key, record) -> (heuristic kernel, [(tile, split_k)] ranked by the
    # record, heuristic's split_k)
    stage2_candidates: Callable | None = None
    # (problem, arch, family) -> why the heuristic's choice for it is worth timing, or None where it
    # is trusted: profile="uncertain" (the default) profiles only the problems that have a reason
    uncertain: Callable | None = None


@dataclass(frozen=True)
class RegionKind:
    """One kind of offloaded region (see the module docstring)."""

    name: str  # the package name; also the tuning key's and the profiler manifest's `op`
    # --- partitioning
    specs: Callable  # () -> every pattern spec (frozen records with .name, .size, .epilogue)
    spec_type: type
    pattern: Callable  # spec -> (DFPattern, {annotation name: DFPattern})
    # (spec, annotations, matched output, var2val) -> legality problems (empty: offloadable)
    rules: Callable
    # parameter roles in the order they are assigned to a region's parameters
    roles: tuple[str, ...]
    # (spec, annotations) -> [(annotation, reason)]: region inputs that must not be computed from
    # the region's root (they would be read before written)
    independent_inputs: Callable
    # --- reading an offloaded function back (relax_cutlass.stages.regions)
    read_problem: Callable  # (spec, annotations, output, var2val, accumulator) -> problem record
    problem_type: type
    kernel_type: type
    region_type: type
    # (problem, spec, CodegenOptions, tuning database or None) -> (kernel, extra region fields)
    plan: Callable
    # --- C++
    emit_kernel: Callable  # kernel -> Source exporting `<kernel.name>_run(const <args_type>*, stream)`
    glue_function: Callable  # region -> the TVM FFI function of the region (C++ text)
    args_type: str  # the C struct a kernel's `_run` takes
    args: str  # its definition (in every glue and profiler source)
    # --- tuning and the report
    profiling: Profiling | None = None
    report_line: Callable | None = None  # offloaded report row -> its line in OffloadReport's text
    flops_name: str = ""  # the kind's root ops in the report's "% of the ... FLOPs offloaded"
    # root op name -> (call, var2val, layout_skipped) -> (op, flops, reasons): a root left in TVM
    left_in_tvm: dict = field(default_factory=dict)
    # (function, var2val) -> {call: note}: what this kind knows of ops another kind left in TVM (the
    # attention kind names the attention a batched matmul belongs to); put before their reasons
    explain_left_in_tvm: Callable | None = None
    # Relax function rewrites run by PartitionForCutlass before (`prepare`) and after
    # (`finish`) the shared canonicalizations, in registration order
    prepare: tuple[Callable, ...] = ()
    finish: tuple[Callable, ...] = ()
    # a refused fusion of this kind is reported even when no smaller pattern took the root
    report_refused: bool = False
    # annotations whose value may also be used outside the region: the region then returns it too
    # (FuseOpsByPattern makes the composite return a tuple; its outputs follow the parameters in
    # DPS order, each named by its annotation in the glue). Any other intermediate used outside
    # refuses the match (a fused kernel does not produce it).
    extra_outputs: tuple[str, ...] = ()
    # the `tile=` option's spellings of this kind's configurations: (a regular expression the option
    # is checked against where it is given, an example); (): the kind takes no tile
    tile_spelling: tuple[str, str] = ()

    @property
    def reference_module(self) -> str:
        """The module of the kind's float32 numpy reference (its package's `reference`), which the GPU
        host's profile runner imports by this name from the profiler's manifest."""
        return f"{self.problem_type.__module__.rsplit('.', 1)[0]}.reference"


class PlanError(ValueError):
    """A region that cannot be planned as asked (a pinned `tile=` that is no candidate for its
    problem): the message explains it; it is no relax_cutlass bug. The region stays in TVM."""


_EXTRA: list[RegionKind] = []


def register(kind: RegionKind) -> None:
    """Add a kind defined outside the built-in packages (after the registered ones)."""
    if any(k.name == kind.name for k in kinds()):
        raise ValueError(f"a region kind named {kind.name!r} is already registered")
    _EXTRA.append(kind)
    _clear()


def unregister(name: str) -> None:
    """Remove a kind added with `register`."""
    _EXTRA[:] = [k for k in _EXTRA if k.name != name]
    _clear()


@contextmanager
def registered(kind: RegionKind) -> Iterator[RegionKind]:
    """`kind` registered within the block only (an opt-in kind in a test, or one defined elsewhere);
    where that very kind is registered already (an opt-in kind RELAX_CUTLASS_ENABLE_KINDS names), the
    block runs with it and leaves it registered."""
    if any(k is kind for k in kinds()):
        yield kind
        return
    register(kind)
    try:
        yield kind
    finally:
        unregister(kind.name)


_GENERATION = [0]


def generation() -> int:
    """How many times the set of kinds changed: what caches of the registered kinds' patterns
    (relax_cutlass.stages.patterns) are keyed by."""
    return _GENERATION[0]


def _clear() -> None:
    _GENERATION[0] += 1


def enable(name: str) -> RegionKind:
    """Register the built-in opt-in kind `name` (see OPT_IN); a no-op when it is registered."""
    if name not in OPT_IN and name not in REGISTERED:
        raise ValueError(f"{name!r} is not an opt-in kind; those are {OPT_IN}")
    kind = importlib.import_module(f"{__name__}.{name}.kind").KIND
    if not is_registered(name):
        register(kind)
    return kind


def is_registered(name: str) -> bool:
    return any(k.name == name for k in kinds())


def kinds() -> tuple[RegionKind, ...]:
    """Every registered kind, in registration order (opt-in kinds named in RELAX_CUTLASS_ENABLE_KINDS
    after the built-in ones)."""
    requested = tuple(n.strip() for n in os.environ.get(ENABLE_ENV, "").split(",") if n.strip())
    unknown = [n for n in requested if n not in OPT_IN and n not in REGISTERED]
    if unknown:
        raise ValueError(f"{ENABLE_ENV}={os.environ[ENABLE_ENV]!r}: {unknown} are not opt-in kinds ({OPT_IN})")
    from_env = tuple(n for n in requested if n in OPT_IN and all(k.name != n for k in _EXTRA))
    return _builtin(tuple(REGISTERED)) + _builtin(from_env) + tuple(_EXTRA)


@functools.cache
def _builtin(names: tuple[str, ...]) -> tuple[RegionKind, ...]:
    return tuple(importlib.import_module(f"{__name__}.{name}.kind").KIND for name in names)


def kind_of(record) -> RegionKind:
    """The kind whose spec, problem, kernel or region `record` is."""
    for kind in kinds():
        if isinstance(record, (kind.spec_type, kind.problem_type, kind.kernel_type, kind.region_type)):
            return kind
    raise TypeError(f"{type(record).__name__} belongs to no registered region kind")


def kind_named(name: str) -> RegionKind:
    return next(k for k in kinds() if k.name == name)
