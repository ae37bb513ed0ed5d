"""CutlassCodegen: turn each offloaded function into an external kernel call.

TVM's `RunCodegen` calls the function registered as `relax.ext.relax_cutlass` with the offloaded
functions; it returns runtime modules (here: one relocatable object, loaded as a static library) and
RunCodegen rewrites every call into `R.call_dps_packed(R.extern(symbol), ...)` and records the modules
under the IRModule attribute `external_mods`, so `tvm.compile` links them and `export_library` ships
them.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import os
import re
import warnings
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax

from ..arch import local_gpu_arch, parse_arch, resolve_family
from ..kinds import CODEGEN, PlanError, kind_of, kinds
from ..kinds.epilogue_patterns import ACCUMULATOR_DTYPES
from ..kinds.ir import json_attr
from ..toolkit.compile import cache_dir, compile_all, failure_summary, link_relocatable
from ..toolkit.profile_runner import device_name, run_profiler
from ..toolkit.sass_check import StubKernelError
from ..toolkit.sass_check import enabled as sass_check_enabled
from ..toolkit.settings import (
    DEFAULT_M_HINT,
    SettingError,
    check_pdl_setting,
    compile_log_path,
    jobs_setting,
    positive_int,
)
from ..toolkit.tuning import TuningDatabase, TuningDatabaseWarning
from .constants import call_counts, composite_of, offloaded_functions
from .emit import emit_glue, emit_kernel
from .partition import check_same_arch
from .profile import build_profiler, plan_epilogue_jobs, plan_jobs, retime_reason
from .regions import RegionError, analyze, make_region

REGIONS_ATTR = "relax_cutlass.regions"


@dataclass(frozen=True)
class CodegenOptions:
    """Knobs of CutlassCodegen (also accepted by `offload_pipeline`)."""

    arch: int = 80
    accumulator: str = "float32"  # "float16" trades accuracy for register pressure
    m_hint: int = DEFAULT_M_HINT  # M assumed by the heuristic when M is symbolic
    jobs: int | None = None  # parallel compiler processes (default: all cores)
    compile: bool = True  # False: plan and rewrite, but build nothing (dry run)
    family: str = "auto"  # "auto": the target's native kernels (SM90 on sm_90a, else SM80); "sm80": CUTLASS 2.x
    tile: str = ""  # pin every region to this configuration (TileConfig.describe()), for sweeps
    # Tuning database (JSON lines) whose measured choices win over the heuristic.
    tuning_db: str = field(default_factory=lambda: os.environ.get("RELAX_CUTLASS_TUNING_DB", ""))
    # Problems the database misses, when this machine's GPU is the target: "uncertain" profiles
    # those whose heuristic choice is unsure (PROFILE_MODES), "auto" all of them (recording into
    # tuning_db, else <cache dir>/tuning.jsonl); "never": the heuristic.
    profile: str = field(default_factory=lambda: os.environ.get("RELAX_CUTLASS_PROFILE", "uncertain"))

    @staticmethod
    def create(arch="sm_80", **options) -> CodegenOptions:
        known = {"accumulator", "m_hint", "jobs", "compile", "family", "tile", "tuning_db", "profile"}
        unknown = set(options) - known
        if unknown:
            raise TypeError(f"unknown relax_cutlass option(s) {sorted(unknown)}; known: {sorted(known)}")
        acc = options.get("accumulator", "float32")
        if acc not in ACCUMULATOR_DTYPES:
            raise ValueError(f"accumulator={acc!r}: use one of {ACCUMULATOR_DTYPES}")
        sm = parse_arch(arch)
        # "sm90" is "auto" on sm_90a and an error elsewhere (its kernels would be stubs there).
        options["family"] = resolve_family(options.get("family", "auto"), sm)
        if not isinstance(options.get("compile", True), bool):
            raise SettingError(
                f"compile={options['compile']!r}: use True (build the kernels) or False (plan and rewrite only)"
            )
        options["jobs"] = jobs_setting(options.get("jobs"))  # also checks RELAX_CUTLASS_JOBS
        if "m_hint" in options:
            options["m_hint"] = positive_int("m_hint", options["m_hint"], "the M assumed where M is symbolic")
        options["tile"] = _checked_tile(options.get("tile", ""))
        created = CodegenOptions(arch=sm, **options)
        if created.profile not in PROFILE_MODES:
            name = "profile" if "profile" in options else "RELAX_CUTLASS_PROFILE"
            raise SettingError(
                f"{name}={created.profile!r}: use 'uncertain' (profile, on a matching GPU, only where the heuristic "
                "is unsure), 'auto' (profile every problem there) or 'never'"
            )
        created = dataclasses.replace(created, tuning_db=_checked_tuning_db(created.tuning_db, "tuning_db" in options))
        check_pdl_setting()  # read by the kernels at run time; refused here as there
        if created.compile:
            cache_dir()  # RELAX_CUTLASS_CACHE_DIR must be writable: every object is written there
            sass_check_enabled()  # RELAX_CUTLASS_SASS_CHECK
            compile_log_path()  # RELAX_CUTLASS_COMPILE_LOG
        return created

    def to_map(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @staticmethod
    def from_map(options) -> CodegenOptions:
        values = {str(k): v for k, v in dict(options).items()}
        return CodegenOptions(
            arch=int(values.get("arch", 80)),
            accumulator=str(values.get("accumulator", "float32")),
            m_hint=int(values.get("m_hint", DEFAULT_M_HINT)),
            jobs=int(values["jobs"]) if "jobs" in values else None,
            compile=bool(values.get("compile", True)),
            family=str(values.get("family", "auto")),
            tile=str(values.get("tile", "")),
            tuning_db=str(values.get("tuning_db", "")),
            profile=str(values.get("profile", "uncertain")),
        )


def _checked_tile(tile) -> str:
    """The `tile` option: "" or a configuration in the spelling of a kind that takes one."""
    spellings = {kind.name: kind.tile_spelling for kind in kinds() if kind.tile_spelling}
    if not isinstance(tile, str) or (tile and not any(re.fullmatch(s, tile) for s, _ in spellings.values())):
        examples = "; ".join(f"{name}: e.g. {example}" for name, (_, example) in spellings.items())
        raise SettingError(
            f"tile={tile!r} is no kernel configuration of any kind ({examples}); tile='' (the default) leaves "
            "the choice to tuning records and the heuristic"
        )
    return tile


@functools.cache
def _warned_missing_directory(path: str) -> None:
    warnings.warn(
        f"tuning database {path}: its directory does not exist, so it holds no records (a mistyped path?); "
        "profiling creates it",
        TuningDatabaseWarning,
        stacklevel=4,
    )


def _checked_tuning_db(path, given: bool) -> str:
    """The tuning database option (or RELAX_CUTLASS_TUNING_DB): a file path, not a directory; a
    path in a directory that does not exist warns once (it reads as an empty database)."""
    name = "tuning_db" if given else "RELAX_CUTLASS_TUNING_DB"
    if not isinstance(path, str | os.PathLike):
        raise SettingError(f"{name}={path!r}: give the path of a JSON-lines tuning database file, or ''")
    path = os.fspath(path)
    if not path:
        return path
    if os.path.isdir(path):
        raise SettingError(
            f"{name}={path!r} is a directory: give the path of a JSON-lines file in it, e.g. "
            f"{os.path.join(path, 'tuning.jsonl')!r}"
        )
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        _warned_missing_directory(os.path.abspath(path))
    return path


def _database(path: str):
    """The tuning database at `path`, read once per version of the file: a build, its profiling
    stages and the offload report read the same database and should neither re-read nor re-warn."""
    try:
        stat = os.stat(path)
        version = (stat.st_mtime_ns, stat.st_size)
    except FileNotFoundError:
        version = None
    return _read_database(os.path.abspath(path), version)


@functools.lru_cache(maxsize=8)
def _read_database(path: str, _version) -> TuningDatabase:
    return TuningDatabase(path)


def plan_regions(functions, options: CodegenOptions, failed: dict[str, str] | None = None) -> list:
    """Offloaded functions -> region records (kernel chosen for each: tuned, else heuristic).

    `failed`: when given, a function that cannot be read back or planned is left out and
    `failed[symbol]` says why (CutlassCodegen returns it to TVM); else the error propagates."""
    symbols = [str(func.attrs["global_symbol"]) for func in functions]
    # (func, symbol, (spec, roles, problem, composite, aliases)) per function
    analyzed = []
    for func, symbol in zip(functions, symbols, strict=True):
        with _recorded(symbol, failed):
            analyzed.append((func, symbol, analyze(func, symbol, options.accumulator)))
    if _profiles_here(options):
        options = dataclasses.replace(options, tuning_db=options.tuning_db or str(cache_dir() / "tuning.jsonl"))
        _profile_misses([(problem, spec.epilogue) for _, _, (spec, _, problem, _, _) in analyzed], options)
    db = _database(options.tuning_db) if options.tuning_db else None
    regions = []
    for func, symbol, (spec, roles, problem, composite, aliases) in analyzed:
        with _recorded(symbol, failed):
            kernel, extra = kind_of(problem).plan(problem, spec, options, db)
            regions.append(make_region(func, symbol, kernel, roles, composite, aliases, **extra))
    return regions


@contextlib.contextmanager
def _recorded(symbol: str, failed: dict[str, str] | None):
    """Record an error of one region's planning under its symbol (re-raise when not recording)."""
    try:
        yield
    except Exception as err:
        if failed is None:
            raise
        failed[symbol] = f"{type(err).__name__}: {err}"
        if not isinstance(err, RegionError | PlanError):  # these explain themselves; anything else is ours
            failed[symbol] += " (a relax_cutlass bug: please report it with the offload report)"


def _profiles_here(options: CodegenOptions) -> bool:
    """Profile database misses during this build? Only when it compiles, picks kernels freely, and
    this machine's GPU is the target: an sm_80 library measured on an H100 would be tuned wrongly."""
    if options.profile == "never" or not options.compile or options.tile:
        return False
    return local_gpu_arch() == options.arch


# profile: "uncertain" times only the problems whose kind says the heuristic is unsure of them
# (RegionKind.profiling.uncertain), "auto" every problem the database lacks, "never" none.
PROFILE_MODES = ("uncertain", "auto", "never")


def profiling_reason(problem, arch: int, family: str = "auto") -> str | None:
    """Why profile="uncertain" times `problem`, or None where its kind trusts the heuristic."""
    profiling = kind_of(problem).profiling
    uncertain = profiling.uncertain if profiling else None
    return uncertain(problem, arch, family) if uncertain else None


def _profile_misses(regions: list, options: CodegenOptions) -> None:
    """Profile on the local GPU what the database lacks for these (problem, epilogue) regions (with
    profile="uncertain", for those whose heuristic choice is unsure: `profiling_reason`): main loops
    of problems without a record (stage 1), then the fastest of them with each region's epilogue
    (stage 2); records are appended, progress goes to stderr."""
    import sys
    import tempfile
    from pathlib import Path

    def progress(line: str) -> None:
        print(f"relax_cutlass: {line}", file=sys.stderr, flush=True)

    scope = ""  # which problems are profiled, for the progress line
    if options.profile == "uncertain":
        unsure = [(p, e, profiling_reason(p, options.arch, options.family)) for p, e in regions]
        regions = [(p, e) for p, e, reason in unsure if reason]
        if not regions:
            return
        scope = f" (profile='uncertain': where the heuristic is unsure, e.g. {next(r for *_, r in unsure if r)})"
    device = device_name()
    for stage in (1, 2):
        db = _database(options.tuning_db)
        if stage == 1:
            jobs = plan_jobs([problem for problem, _ in regions], options.arch, options.family)
        else:
            jobs = plan_epilogue_jobs(regions, options.arch, db, options.family)
        reasons = {job.key: retime_reason(job, db.lookup(job.key), device) for job in jobs}
        jobs = [job for job in jobs if reasons[job.key]]
        if not jobs:
            continue
        what = "main loops of" if stage == 1 else "epilogues of"
        stale = [why for why in reasons.values() if why and why != "no record"]
        again = f" ({len(stale)} re-timed: {stale[0]})" if stale else ""
        progress(f"profiling the {what} {len(jobs)} problem(s) on the local GPU{again}{scope} -> {options.tuning_db}")
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            build_profiler(jobs, options.arch, Path(tmp), options.jobs)
            run_profiler(Path(tmp), Path(options.tuning_db), log=progress)


MODULE_NAME = f"{CODEGEN}_module"


def build_regions(regions: list, options: CodegenOptions, module_name: str = MODULE_NAME):
    """Emit, compile (cached, parallel) and link one static-library module for these regions."""
    kernels = {k.name: k for r in regions for k in r.kernels}
    sources = [emit_kernel(k) for k in kernels.values()]
    sources.append(emit_glue(regions, module_name))
    objects = compile_all(sources, options.arch, options.jobs)
    merged = link_relocatable([objects[s.name][0] for s in sources], module_name)
    return tvm.runtime.load_static_library(str(merged), [r.symbol for r in regions])


def module_failures(regions: list, options: CodegenOptions) -> tuple[dict[str, str], object]:
    """Build the module of these regions (kernels compiled already) as RunCodegen would: host glue,
    link, load. Where that fails, find the regions that break it, so that only they return to TVM:
    each region's glue compiled alone (in parallel), then linked and loaded alone.
    -> ({symbol: why}, the module of the regions that build; None where none is left)."""
    if not regions:
        return {}, None
    try:
        return {}, build_regions(regions, options)
    except Exception as err:
        whole = failure_summary(err)
    if len(regions) == 1:
        return {regions[0].symbol: f"its host glue or link failed: {whole}"}, None
    glue = {r.symbol: emit_glue([r], f"{MODULE_NAME}_{r.symbol}") for r in regions}
    errors: dict[str, Exception] = {}
    compile_all(list(glue.values()), options.arch, options.jobs, errors)
    failed = {
        r.symbol: f"its host glue did not compile: {failure_summary(errors[glue[r.symbol].name])}"
        for r in regions
        if glue[r.symbol].name in errors
    }
    for region in regions:
        if region.symbol not in failed:
            try:
                build_regions([region], options, f"{MODULE_NAME}_{region.symbol}")
            except Exception as err:
                failed[region.symbol] = f"its link or load failed: {failure_summary(err)}"
    if not failed:  # each region builds alone, only not together: none can be blamed alone
        return {r.symbol: f"the module of all regions did not build: {whole}" for r in regions}, None
    more, module = module_failures([r for r in regions if r.symbol not in failed], options)
    return failed | more, module


@dataclass(frozen=True)
class _Plan:
    """What CutlassCodegen planned for the RunCodegen call it is making: its regions by symbol, and
    the module it built of them (None in a dry run)."""

    regions: dict
    module: object = None


# The callback takes the plan instead of planning and building the same functions again.
_PLANNED: contextvars.ContextVar[_Plan | None] = contextvars.ContextVar("relax_cutlass_planned", default=None)


@tvm_ffi.register_global_func(f"relax.ext.{CODEGEN}", override=True)
def _relax_ext_codegen(functions, options, _constant_names):
    """Entry point RunCodegen calls with all functions annotated Codegen="relax_cutlass"."""
    opts = CodegenOptions.from_map(options)
    plan = _PLANNED.get()
    symbols = [str(func.attrs["global_symbol"]) for func in functions]
    if plan is not None and set(symbols) == set(plan.regions):
        regions, module = [plan.regions[symbol] for symbol in symbols], plan.module
    else:  # RunCodegen run by hand on a partitioned module: plan and build here
        regions, module = plan_regions(list(functions), opts), None
    if not regions or not opts.compile:
        return []
    return [module if module is not None else build_regions(regions, opts)]


@tvm.transform.module_pass(opt_level=0, name="relax_cutlass.CutlassCodegen")
class CutlassCodegen:
    """Generate, compile and attach CUTLASS kernels for every relax_cutlass region.

    Options: accumulator ("float32" | "float16"), m_hint (int), jobs (int), compile (bool; False
    rewrites the module and records the plan without running a compiler). Each region (op,
    epilogue, shapes, kernel) is recorded in the module attribute "relax_cutlass.regions" for
    `offload_report`.
    """

    def __init__(self, arch: str | int = "sm_80", **options):
        self.options = CodegenOptions.create(arch, **options)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        check_same_arch(mod, self.options.arch, "build its kernels")

        # Planning is deterministic and cheap, so the report rows are computed here rather than
        # smuggled out of the RunCodegen callback. A region that cannot be planned, or whose kernel
        # does not compile, goes back to TVM (never a crash of the user's pipeline): the report
        # says why, and a warning asks for a bug report.
        failed: dict[str, str] = {}
        regions = plan_regions([f for _, f in offloaded_functions(mod)], self.options, failed)
        module = None
        if self.options.compile:
            failed |= compile_kernels(regions, self.options)
            # the module of what is left, built here (glue, link, load) and handed to RunCodegen
            unbuilt, module = module_failures([r for r in regions if r.symbol not in failed], self.options)
            failed |= unbuilt
        if failed:
            mod = return_to_tvm(mod, failed)
            regions = [r for r in regions if r.symbol not in failed]
        calls = call_counts(mod)
        rows = [r.report_row() | {"calls": calls[r.symbol]} for r in regions]
        token = _PLANNED.set(_Plan({r.symbol: r for r in regions}, module))
        try:
            out = relax.transform.RunCodegen({CODEGEN: self.options.to_map()})(mod)
        finally:
            _PLANNED.reset(token)
        previous = json_attr(mod, REGIONS_ATTR, [])
        return out.with_attr(REGIONS_ATTR, json.dumps(previous + rows))


def compile_kernels(regions: list, options: CodegenOptions) -> dict[str, str]:
    """Compile every region's kernels ahead of RunCodegen, in parallel (objects are cached, so its
    build reuses them): {symbol: why} for the regions with a kernel that does not compile."""
    failures: dict[str, Exception] = {}
    kernels = {k.name: k for r in regions for k in r.kernels}
    compile_all([emit_kernel(k) for k in kernels.values()], options.arch, options.jobs, failures)
    return {
        region.symbol: f"kernel {name} {_failed(err)}: {failure_summary(err)}"
        for region in regions
        for name, err in failures.items()
        if any(k.name == name for k in region.kernels)
    }


def _failed(err: Exception) -> str:
    return "failed its SASS check" if isinstance(err, StubKernelError) else "did not compile"


RETURNED_ATTR = "relax_cutlass.returned_to_tvm"
RETURNED_PATTERN_ATTR = "relax_cutlass.returned_pattern"


def return_to_tvm(mod: tvm.IRModule, failed: dict[str, str]) -> tvm.IRModule:
    """Turn the offloaded functions named in `failed` back into ordinary private Relax functions
    (the composite's body, called as before), so TVM builds them; the reasons go under the module
    attribute RETURNED_ATTR for `offload_report`, and a warning names them."""
    returned = json_attr(mod, RETURNED_ATTR, {})
    now_returned = []
    for gv, func in list(offloaded_functions(mod)):
        symbol = str(func.attrs["global_symbol"])
        if symbol not in failed:
            continue
        composite = composite_of(func)
        # the outer function calls its composite once, with its own parameters
        call = next(
            v.value
            for b in func.body.blocks
            for v in b.bindings
            if isinstance(v.value, relax.Call) and isinstance(v.value.op, relax.Var)
        )
        inlined = composite.bind_params(dict(zip(composite.params, call.args, strict=True)))
        # (the pattern's name too: a region whose ops no kind reports on its own still gets a row)
        mod[gv] = (
            relax.Function(func.params, inlined.body, func.ret_ty, func.is_pure)
            .with_attr("relax_cutlass.returned", symbol)
            .with_attr(RETURNED_PATTERN_ATTR, str(composite.attrs["Composite"]))
        )
        returned[gv.name_hint] = failed[symbol]
        now_returned.append(f"{symbol}: {failed[symbol]}")
    if now_returned:  # one warning per build, however many regions went back
        many = len(now_returned) > 1
        count = f"{len(now_returned)} regions, which run in TVM" if many else "a region, so it runs in TVM"
        warnings.warn(f"relax_cutlass could not offload {count}: " + "; ".join(now_returned), stacklevel=3)
    return mod.with_attr(RETURNED_ATTR, json.dumps(returned))
