"""Refuse stub kernels: every compiled kernel object must hold its family's tensor-core instructions.

nvcc compiles a CUTLASS kernel for any target without complaint, but CUTLASS guards each family's
main loop with its architecture's feature macros: an SM90 wgmma kernel compiled for sm_100a is a
stub whose body is `EXIT`. It passes every run-time check, launches, and leaves the output
untouched. So after nvcc (and for cached objects) the object's SASS is disassembled with
`cuobjdump -sass` and its MMA instructions are counted:

  * SM90 (CUTLASS 3.x TMA + wgmma) kernels must contain HGMMA;
  * SM100 (CUTLASS 3.x TMA + tcgen05) kernels must contain UTCHMMA (tcgen05.mma, 16-bit inputs);
  * SM80 (CUTLASS 2.x mma.sync) kernels and CUTLASS examples/41's ("fmha") must contain HMMA, on
    every target they are built for.

An object without them is a `StubKernelError` and never reaches a library. The result is recorded
next to the object (`<object>.sass.json`), so a cached object is disassembled once, not per build.

cuobjdump is taken from RELAX_CUTLASS_CUOBJDUMP, else the CUDA toolkit nvcc belongs to, else the
`nvidia-cuda-cuobjdump` wheel, else PATH; the nvdisasm it runs from NVDISASM_PATH, else beside it,
else the same places (wheel: `nvidia-cuda-nvdisasm`). Without them the build fails;
RELAX_CUTLASS_SASS_CHECK=0 skips the check altogether (at the risk this module exists to remove).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

from ..arch import arch_name
from .settings import env_flag
from .toolchain import CompileError, toolchain, write_atomically

__all__ = ["FAMILIES", "StubKernelError", "cuobjdump", "mma_counts", "verify_object"]

# family -> (what it is, the SASS opcodes at least one of which it must contain)
FAMILIES = {
    "sm80": ("CUTLASS 2.x SM80 tensor-op (mma.sync)", ("HMMA",)),
    "sm90": ("CUTLASS 3.x SM90 TMA + wgmma", ("HGMMA",)),
    # tcgen05.mma kind::f16 (16-bit inputs, fp16 and bf16 alike) into tensor memory
    "sm100": ("CUTLASS 3.x SM100 TMA + tcgen05 (UMMA)", ("UTCHMMA",)),
    "fmha": ("CUTLASS examples/41 fused multi-head kernel, SM80 (mma.sync)", ("HMMA",)),
    # depthwise convolutions have no tensor-core form: CUTLASS examples/46's direct convolution
    # runs on the CUDA cores, and a stub of it would hold no floating-point FMA at all
    "simt": ("CUTLASS 2.x SIMT direct convolution (CUDA cores)", ("FFMA", "HFMA2")),
}

CHECK_ENV = "RELAX_CUTLASS_SASS_CHECK"
CUOBJDUMP_ENV = "RELAX_CUTLASS_CUOBJDUMP"
MARKER_SUFFIX = ".sass.json"
_VERSION = 1  # of the marker's contents: a change re-checks every cached object


class StubKernelError(CompileError):
    """A kernel compiled, but its machine code lacks the tensor-core instructions of its family
    for this arch: CUTLASS compiled its main loop out (the kernel would launch and do nothing)."""

    def __init__(self, kernel: str, arch: int, family: str, record: dict, obj: Path):
        self.kernel, self.arch, self.family, self.counts, self.object = kernel, arch, family, record["counts"], obj
        what, wanted = FAMILIES[family]
        found = ", ".join(f"{op} x{n}" for op, n in self.counts.items())
        sass = ", ".join(record.get("sass") or []) or "no SASS"
        log = (
            f"stub kernel: {kernel} is a {what} kernel, which must contain {' or '.join(wanted)} "
            f"instructions, but built for {arch_name(arch)} its machine code ({sass}) has {found}. CUTLASS "
            "compiled its main loop out for this target: the kernel would launch and compute nothing. Build "
            "the target's own family instead (family='auto'; family='sm90' is for sm_90a only, 'sm100' for "
            "sm_100a / sm_103a / sm_110a), and report "
            "it if family='auto' chose this."
        )
        super().__init__(obj, record["command"], log)


@functools.cache
def cuobjdump() -> str:
    """Path of cuobjdump: RELAX_CUTLASS_CUOBJDUMP, else the CUDA toolkit's bin (next to nvcc), else
    the `nvidia-cuda-cuobjdump` wheel's binary, else PATH. Raises RuntimeError naming what to install."""
    explicit = os.environ.get(CUOBJDUMP_ENV)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"{CUOBJDUMP_ENV}={explicit!r} is not an executable")
        return explicit
    return _find("cuobjdump", "nvidia-cuda-cuobjdump")


@functools.cache
def _disassembler_env() -> dict[str, str]:
    """cuobjdump's environment: it runs nvdisasm, found through NVDISASM_PATH or PATH; without
    one set, nvdisasm is looked for next to cuobjdump, then as cuobjdump itself is."""
    env = dict(os.environ)
    if not env.get("NVDISASM_PATH"):
        beside = Path(cuobjdump()).parent / "nvdisasm"
        env["NVDISASM_PATH"] = str(
            beside.parent if _executable(beside) else Path(_find("nvdisasm", "nvidia-cuda-nvdisasm")).parent
        )
    return env


def _find(tool: str, wheel: str) -> str:
    candidates = []
    try:
        tc = toolchain()
        nvcc = Path(tc.nvcc)
        candidates += [Path(os.path.realpath(nvcc)).parent / tool, nvcc.parent / tool, tc.cuda_home / "bin" / tool]
    except RuntimeError:
        pass  # no nvcc: nothing compiled either, but a cached object may still be checked
    candidates += _wheel_binaries(wheel, tool)
    found = next((str(p) for p in candidates if _executable(p)), None) or shutil.which(tool)
    if found:
        return found
    raise RuntimeError(
        f"{tool} was not found. relax_cutlass checks every kernel's machine code with cuobjdump (which runs "
        "nvdisasm), so that a kernel CUTLASS compiled into a stub never ships: install the CUDA toolkit's "
        f"{tool} next to nvcc, or `pip install {wheel}`"
        + (f", or set {CUOBJDUMP_ENV} to its path" if tool == "cuobjdump" else ", or set NVDISASM_PATH to its folder")
        + f"; {CHECK_ENV}=0 skips the check (unsafe: a stub kernel launches and computes nothing)"
    )


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _wheel_binaries(wheel: str, tool: str) -> list[Path]:
    try:
        dist = importlib.metadata.distribution(wheel)
    except importlib.metadata.PackageNotFoundError:
        return []
    return [Path(dist.locate_file(f)) for f in dist.files or () if Path(str(f)).name == tool]


def enabled() -> bool:
    return env_flag(CHECK_ENV, default=True)


# An instruction line of `cuobjdump -sass`: "/*0150*/  @!P0 HMMA.16816.F32 R24, R4, R16, R24 ;"
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def mma_counts(obj: Path, opcodes: tuple[str, ...]) -> tuple[dict[str, int], list[str], list[str]]:
    """-> ({opcode: count} for `opcodes` (by mnemonic, before its first '.'), the SASS arches found,
    the command run). One cuobjdump run over the whole object."""
    command = [cuobjdump(), "-sass", str(obj)]
    proc = subprocess.run(command, capture_output=True, text=True, env=_disassembler_env())
    if proc.returncode != 0:
        raise CompileError(obj, command, proc.stdout + proc.stderr)
    mnemonics = Counter(m.group(1) for m in _INSTRUCTION.finditer(proc.stdout))
    arches = sorted(set(re.findall(r"arch = (sm_\w+)", proc.stdout)))
    return {op: mnemonics.get(op, 0) for op in opcodes}, arches, command


def verify_object(obj: Path, name: str, family: str, arch: int) -> dict | None:
    """Check one kernel object (once: the result is kept in `<object>.sass.json`); raise
    StubKernelError where its SASS lacks the family's MMA instructions. -> the record, or None when
    there is nothing to check (not a tensor-core kernel, or the check is switched off)."""
    if not family or not enabled():
        return None
    if family not in FAMILIES:
        raise ValueError(f"kernel {name}: unknown kernel family {family!r} (known: {sorted(FAMILIES)})")
    opcodes = FAMILIES[family][1]
    stat = obj.stat()
    want = {
        "version": _VERSION,
        "family": family,
        "arch": arch,
        "opcodes": list(opcodes),
        "object": [stat.st_size, stat.st_mtime_ns],  # a rebuilt object is checked again
    }
    marker = obj.with_name(obj.name + MARKER_SUFFIX)
    record = _read(marker)
    if record is None or {k: record.get(k) for k in want} != want:
        counts, arches, command = mma_counts(obj, opcodes)
        record = want | {"counts": counts, "sass": arches, "command": command, "ok": any(counts.values())}
        _write(marker, record)
    if not record["ok"]:
        raise StubKernelError(name, arch, family, record, obj)
    return record


def _read(marker: Path) -> dict | None:
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None


def _write(marker: Path, record: dict) -> None:
    write_atomically(marker, json.dumps(record))  # atomic, as the objects themselves
