"""The compilers generated sources are built with (nvcc for kernels, the host C++ compiler for glue),
where CUDA, CUTLASS and tvm-ffi headers live, and the error a failed compile raises."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..version import __version__
from .settings import SettingError

__all__ = ["CompileError", "Toolchain", "find_cuda_home", "package_dir", "toolchain", "write_atomically"]


class CompileError(RuntimeError):
    """A generated source failed to compile; carries the compiler log and the kept source path."""

    def __init__(self, source_path: Path, command: list[str], log: str):
        self.source_path, self.command, self.log = source_path, command, log
        super().__init__(
            f"compiling {source_path} failed (source kept there for inspection):\n"
            f"$ {' '.join(command)}\n{log.strip()[-8000:]}"
        )

    @property
    def first_error(self) -> str:
        """The compiler's first error line (else its first line): what a report has room for."""
        lines = [line.strip() for line in self.log.splitlines() if line.strip()]
        return next((line for line in lines if re.search(r"\berror\b", line, re.IGNORECASE)), lines[0] if lines else "")


def package_dir(module: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"python package {module!r} is not installed")
    return Path(spec.origin).parent


@dataclass(frozen=True)
class Toolchain:
    nvcc: str
    cxx: str
    cuda_home: Path
    nvcc_version: str
    cutlass_version: str
    tvm_ffi_version: str  # the glue's headers
    includes_cuda: tuple[str, ...]
    includes_host: tuple[str, ...]

    def fingerprint(self) -> str:
        return (
            f"{self.nvcc_version}|cutlass {self.cutlass_version}|tvm-ffi {self.tvm_ffi_version}"
            f"|relax_cutlass {__version__}"
        )


def find_cuda_home(nvcc: str) -> Path:
    """CUDA_HOME / CUDA_PATH, else the toolkit nvcc lives in (following a wrapper or symlink)."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    candidates += [Path(os.path.realpath(nvcc)).parent.parent, Path(nvcc).parent.parent, "/usr/local/cuda"]
    for c in candidates:
        if c and (Path(c) / "include" / "cuda_runtime.h").exists():
            return Path(c)
    raise RuntimeError(f"cannot locate the CUDA toolkit of {nvcc}; set CUDA_HOME")


@functools.cache
def toolchain() -> Toolchain:
    nvcc = os.environ.get("RELAX_CUTLASS_NVCC") or shutil.which("nvcc")
    if os.environ.get("RELAX_CUTLASS_NVCC") and not os.access(nvcc, os.X_OK):
        raise SettingError(f"RELAX_CUTLASS_NVCC={nvcc!r} is not an executable: give the path of nvcc, or unset it")
    if not nvcc:
        raise RuntimeError(
            "nvcc was not found: install the CUDA toolkit (12.x or 13.x) and put nvcc on PATH, "
            "or set RELAX_CUTLASS_NVCC to its path"
        )
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip()
    version = version.splitlines()[-1] if version else "unknown"
    cuda_home = find_cuda_home(nvcc)
    cutlass_root = package_dir("cutlass_library") / "source"
    # nvidia-cutlass's headers must win over the older copy shipped inside the tvm wheel.
    cutlass_inc = (str(cutlass_root / "include"), str(cutlass_root / "tools" / "util" / "include"))
    import tvm_ffi.libinfo

    ffi_inc = tuple(dict.fromkeys([tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]))
    return Toolchain(
        nvcc=nvcc,
        cxx=os.environ.get("CXX", shutil.which("g++") or "c++"),
        cuda_home=cuda_home,
        nvcc_version=version,
        cutlass_version=importlib.metadata.version("nvidia-cutlass"),
        tvm_ffi_version=tvm_ffi.__version__,
        includes_cuda=cutlass_inc,
        includes_host=(*ffi_inc, str(cuda_home / "include")),  # the profiler's glue times with CUDA events
    )


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` (its folder made if missing) through a temporary file renamed over
    it: concurrent builds sharing the cache never read half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
