"""Compile generated sources to objects: nvcc for kernels, the host compiler for glue.

Every object is cached on disk under a content hash of everything that can change its bytes (source,
flags, arch, compiler and CUTLASS versions, our version), so a rebuild recompiles nothing and a
build on a machine without a GPU produces the same objects as one with.

A module's merged object needs nothing from the C++ runtime (libstdc++, libsupc++, libgcc_eh): TVM
links it into shared libraries with `$CXX`, whose libstdc++ may exist only as a static, non-PIC
archive that no shared library can contain. The glue uses tvm-ffi's C ABI and is compiled without
exceptions or RTTI; kernels are compiled without exceptions and never include <iostream>
(templates.KERNEL_PRELUDE), and the static-initialization guards nvcc's launch stubs call come from
templates.CXX_ABI_SUPPORT. `link_relocatable` checks the result.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..arch import nvcc_gencode
from .sass_check import verify_object
from .settings import SettingError, compile_log_path, env_jobs
from .templates import CXX_ABI_SUPPORT
from .toolchain import CompileError, Toolchain, package_dir, toolchain, write_atomically

__all__ = [
    "CompileError",
    "Source",
    "Toolchain",
    "cache_dir",
    "compile_all",
    "compile_command",
    "cxx_runtime_symbols",
    "failure_summary",
    "link_relocatable",
    "portable_command",
]


def failure_summary(err: Exception) -> str:
    """One line on why a source did not build: a CompileError's first error line and where its source
    was kept; any other error's type and first line."""
    if isinstance(err, CompileError):
        return f"{err.first_error or type(err).__name__} (source kept at {err.source_path})"
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


@dataclass(frozen=True)
class Source:
    """One translation unit: `cuda` ones go through nvcc, `host` ones through the C++ compiler."""

    name: str
    text: str
    kind: str  # "cuda" | "host"
    extra_flags: tuple[str, ...] = ()  # e.g. the include dirs of a CUTLASS example's headers
    # Kernel family ("sm80", "sm90", "fmha"): relax_cutlass.toolkit.sass_check requires its MMA instructions
    # in the object's SASS. "" for sources that are not tensor-core kernels.
    family: str = ""


def cache_dir() -> Path:
    """RELAX_CUTLASS_CACHE_DIR, else ~/.cache/relax_cutlass; it must be a writable directory."""
    given = os.environ.get("RELAX_CUTLASS_CACHE_DIR")
    path = Path(given or Path.home() / ".cache" / "relax_cutlass")
    name = f"RELAX_CUTLASS_CACHE_DIR={given!r}" if given else f"the object cache {str(path)!r}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SettingError(
            f"{name} cannot be created ({err.strerror}): point RELAX_CUTLASS_CACHE_DIR at a writable directory"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SettingError(f"{name} is not writable: point RELAX_CUTLASS_CACHE_DIR at a writable directory")
    return path


# The one CUTLASS header that `throw`s in code every kernel compiles: cute's TMA descriptor helpers,
# for swizzle, fill and L2 modes relax_cutlass never builds. Kernels are compiled without exceptions
# (see the module docstring), which rejects a throw, so kernels see a copy of it in which each
# `throw std::runtime_error(message)` reports the message and aborts instead.
_THROWING_HEADER = "cute/arch/copy_sm90_desc.hpp"
_THROW = "throw std::runtime_error("
_NO_THROW_PREAMBLE = """\
// relax_cutlass: a copy of CUTLASS's header in which `throw std::runtime_error(message)` became
// relax_cutlass_unsupported(message): kernels are compiled without exceptions (compile.py).
#include <cstdio>
#include <cstdlib>
[[noreturn]] inline void relax_cutlass_unsupported(const char* message) {
  std::fprintf(stderr, "CUTLASS: %s\\n", message);
  std::abort();
}
"""


def _no_throw_overlay() -> tuple[str, ...]:
    """nvcc flags putting the copy of _THROWING_HEADER without throws ahead of CUTLASS's own (a
    directory named by the copy's hash under the cache dir); none if the header has no throw."""
    original = package_dir("cutlass_library") / "source" / "include" / _THROWING_HEADER
    text = original.read_text()
    if "throw" not in text:
        return ()
    pragma = "#pragma once\n"
    patched = text.replace(pragma, pragma + _NO_THROW_PREAMBLE, 1).replace(_THROW, "relax_cutlass_unsupported(")
    if pragma not in text or "throw" in patched.replace(_NO_THROW_PREAMBLE, ""):
        raise RuntimeError(f"{original} throws in a way relax_cutlass does not know; is nvidia-cutlass 4.2 installed?")
    root = cache_dir() / f"include-nothrow-{hashlib.sha256(patched.encode()).hexdigest()[:16]}"
    header = root / _THROWING_HEADER
    if not header.exists():
        write_atomically(header, patched)
    return (f"-I{root}",)


def compile_command(tc: Toolchain, src: Source, arch: int, src_path: Path, obj_path: Path) -> list[str]:
    """The compiler command that builds `src` (written at `src_path`) for `arch` into `obj_path`."""
    if src.kind == "cuda":
        return [
            tc.nvcc, "-c", "-std=c++17", "-O3", "-Xcompiler=-fPIC", "-Xcompiler=-fno-exceptions", "-w",
            "--expt-relaxed-constexpr", "-DNDEBUG", *nvcc_gencode(arch), *_no_throw_overlay(),
            *(f"-I{p}" for p in tc.includes_cuda), *src.extra_flags,
            str(src_path), "-o", str(obj_path),
        ]  # fmt: skip
    return [
        tc.cxx, "-c", "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-fno-exceptions", "-fno-rtti",
        *(f"-I{p}" for p in tc.includes_host), str(src_path), "-o", str(obj_path),
    ]  # fmt: skip


def portable_command(cmd: list[str]) -> list[str]:
    """`cmd` with the folders that differ from install to install of the same versions (the object
    cache, the nvidia-cutlass and tvm-ffi packages: a virtual environment inside each clone) named
    by role: the cache key of an object. Their versions are in the toolchain's fingerprint and the
    no-throw overlay's folder is named by its content's hash, so a cache moved, carried to another
    machine or shared by a fresh clone still hits."""
    roots = {
        str(cache_dir()): "<cache>",
        str(package_dir("cutlass_library")): "<nvidia-cutlass>",
        str(package_dir("tvm_ffi")): "<tvm-ffi>",
    }
    out = []
    for arg in cmd:
        for root, role in roots.items():
            arg = arg.replace(root, role)
        out.append(arg)
    return out


def _compile_one(tc: Toolchain, src: Source, arch: int) -> tuple[Path, bool]:
    """-> (object path, whether it came from the cache)."""
    probe = portable_command(compile_command(tc, src, arch, Path("SRC"), Path("OBJ")))
    key = hashlib.sha256("\0".join([src.text, *probe, tc.fingerprint()]).encode()).hexdigest()[:32]
    root = cache_dir()
    obj = root / f"{src.name}-{key}.o"
    if obj.exists():
        return obj, True
    suffix = ".cu" if src.kind == "cuda" else ".cc"
    src_path = root / f"{src.name}-{key}{suffix}"
    src_path.write_text(src.text)
    fd, tmp = tempfile.mkstemp(dir=root, suffix=".o.tmp")
    os.close(fd)
    cmd = compile_command(tc, src, arch, src_path, Path(tmp))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise CompileError(src_path, cmd, proc.stdout + proc.stderr)
    os.replace(tmp, obj)  # atomic: concurrent builds of the same kernel never see half an object
    return obj, False


def _compile_checked(tc: Toolchain, src: Source, arch: int, log: str | None = None) -> tuple[Path, bool]:
    """_compile_one, then (kernels, cached or not) the SASS check: a stub never reaches a library.
    With a `log` file (RELAX_CUTLASS_COMPILE_LOG), the source's times are appended to it as a JSON
    line."""
    start = time.perf_counter()
    obj, cached = _compile_one(tc, src, arch)
    compiled = time.perf_counter()
    verify_object(obj, src.name, src.family, arch)
    if log:
        line = {
            "name": src.name,
            "kind": src.kind,
            "family": src.family,
            "arch": arch,
            "cached": cached,
            "compile_s": round(compiled - start, 3),
            "check_s": round(time.perf_counter() - compiled, 3),
            "at": round(time.time(), 3),
        }
        with _LOG_LOCK, open(log, "a") as out:
            out.write(json.dumps(line) + "\n")
    return obj, cached


_LOG_LOCK = threading.Lock()


def compile_all(
    sources: list[Source], arch: int, jobs: int | None = None, failures: dict[str, Exception] | None = None
) -> dict[str, tuple[Path, bool]]:
    """Compile distinct sources in parallel (RELAX_CUTLASS_JOBS, default: all cores); every kernel
    object is checked for its family's tensor-core instructions (relax_cutlass.toolkit.sass_check).

    `failures`: when given, a source that does not compile (or fails its check) is left out of the
    result and its error recorded there by name; else the first error is raised."""
    tc = toolchain()
    unique = {s.name: s for s in sources}
    jobs = jobs or env_jobs() or os.cpu_count() or 1
    log = compile_log_path()
    results = {}
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(unique)))) as pool:
        futures = {name: pool.submit(_compile_checked, tc, s, arch, log) for name, s in unique.items()}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except Exception as err:
                if failures is None:
                    raise
                failures[name] = err
    return results


@functools.cache
def cxx_runtime_symbols(cxx: str) -> frozenset[str]:
    """Every global symbol that the C++ runtime archives of the compiler `cxx` define (libstdc++.a,
    libsupc++.a, libgcc_eh.a; those it does not have are skipped)."""
    names: set[str] = set()
    for archive in ("libstdc++.a", "libsupc++.a", "libgcc_eh.a"):
        found = subprocess.run([cxx, f"-print-file-name={archive}"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(found) or not os.path.exists(found):
            continue
        listing = subprocess.run(["nm", "-g", "--defined-only", found], capture_output=True, text=True).stdout
        names.update(fields[2] for fields in map(str.split, listing.splitlines()) if len(fields) == 3)
    return frozenset(names)


def _check_no_cxx_runtime(obj: Path, cxx: str) -> None:
    """Raise if the linked module `obj` still needs a symbol from the C++ runtime (a relax_cutlass
    bug: see the module docstring)."""
    undefined = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True, check=True).stdout.split()
    leaked = sorted(set(undefined) & cxx_runtime_symbols(cxx))
    if not leaked:
        return
    demangled = subprocess.run(["c++filt"], input="\n".join(leaked), capture_output=True, text=True).stdout
    names = demangled.split("\n")[: len(leaked)] if demangled else leaked
    raise RuntimeError(
        f"relax_cutlass bug: the linked module {obj.name} needs {len(leaked)} symbol(s) from the C++ runtime "
        f"(libstdc++ / libsupc++ / libgcc_eh), so exporting it fails with a toolchain whose libstdc++ is "
        f"static and non-PIC: {'; '.join(names[:20])}{' ...' if len(leaked) > 20 else ''}. Please report it."
    )


def link_relocatable(objects: list[Path], name: str) -> Path:
    """Merge objects (plus the static CUDA runtime and templates.CXX_ABI_SUPPORT) into one
    relocatable object, checked to need nothing from the C++ runtime.

    One object per module keeps `load_static_library` and `export_library` simple, and linking
    cudart statically makes the exported library independent of how the host process loaded CUDA.
    """
    tc = toolchain()
    cudart = next(
        (
            p
            for p in (tc.cuda_home / "lib64" / "libcudart_static.a", tc.cuda_home / "lib" / "libcudart_static.a")
            if p.exists()
        ),
        None,
    )
    if cudart is None:
        raise RuntimeError(f"libcudart_static.a not found under {tc.cuda_home}; is the CUDA toolkit complete?")
    support, _ = _compile_one(tc, Source("relax_cutlass_cxxabi", CXX_ABI_SUPPORT, "host"), 0)
    objects = [*objects, support]
    key = hashlib.sha256("\0".join(sorted(str(o) for o in objects) + [str(cudart)]).encode()).hexdigest()[:32]
    out = cache_dir() / f"{name}-{key}.o"
    if out.exists():
        return out
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".o.tmp")
    os.close(fd)
    # Only the TVM FFI entry points stay global: kernels and cudart become local symbols, so two
    # exported models loaded in one process can never bind to each other's copies.
    for cmd in (
        ["ld", "-r", "-o", tmp, *map(str, objects), str(cudart)],
        ["objcopy", "--wildcard", "--keep-global-symbol=__tvm_ffi_*", tmp],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise CompileError(objects[0], cmd, proc.stdout + proc.stderr)
    try:
        _check_no_cxx_runtime(Path(tmp), tc.cxx)
    except BaseException:
        os.unlink(tmp)
        raise
    os.replace(tmp, out)
    return out
