"""The NCCL backend of TVM's disco that the stock apache-tvm wheel lacks, built on this machine.

The wheel ships disco (sessions, `runtime.disco.allreduce` and the other collectives, shard loaders)
and the source of its NCCL backend (`tvm/src/runtime/extra/disco/nccl/nccl.cc`), but not the backend
compiled: no `runtime.disco.nccl.*` function exists, so `Session.init_ccl("nccl", ...)` fails. This
module compiles that shipped source with the host compiler against NCCL (the nvidia-nccl-cu13 wheel,
or RELAX_CUTLASS_NCCL_HOME) into a shared library in the object cache, once per machine, and loads
it. Loaded in a process, it registers `runtime.disco.nccl.*` there (see `parallel.group` for the
workers).

Three headers that source includes are not in the wheel; the stand-ins written here hold what it
uses of them: `support/process_id.h` (a log prefix), and `tvm/support/io.h` / `serializer.h`, which
`tvm/runtime/tensor.h` includes for tensor (de)serialization that the backend never calls (so the
stream class is declared, not defined).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.util
import os
import re
import subprocess
import tempfile
from pathlib import Path

from ..toolkit.compile import cache_dir
from ..toolkit.settings import NCCL_HOME_ENV, nccl_home_setting
from ..toolkit.toolchain import CompileError, package_dir, toolchain, write_atomically

__all__ = ["NcclInstall", "find_nccl", "load_nccl_backend", "nccl_backend", "nccl_backend_source"]

# What the shipped source includes that the wheel lacks: our stand-ins, by include path.
_PROCESS_ID_H = """#pragma once
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
namespace tvm {
namespace support {
inline std::string GetProcessIdAndThreadIdHeader() {
  std::ostringstream os;
  os << "[PID " << getpid() << " TID " << std::this_thread::get_id() << "]";
  return os.str();
}
}  // namespace support
}  // namespace tvm
"""
_IO_H = """#pragma once
#include <cstddef>
namespace tvm {
namespace support {
// Declared for tvm/runtime/tensor.h's inline (de)serializers, which the disco backend never calls.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual size_t Read(void* ptr, size_t size) = 0;
  virtual size_t Write(const void* ptr, size_t size) = 0;
  template <typename T> void Write(const T& data);
  template <typename T> bool Read(T* out);
  template <typename T> void WriteArray(const T* data, size_t n);
  template <typename T> bool ReadArray(T* data, size_t n);
};
}  // namespace support
}  // namespace tvm
"""
_SHIMS = {
    "support/process_id.h": _PROCESS_ID_H,
    "tvm/support/io.h": _IO_H,
    "tvm/support/serializer.h": "#pragma once\n",
}
# nccl.cc includes "../../../../support/process_id.h": found under <shims>/support through an include
# directory four levels below the shims' root.
_RELATIVE_ROOT = ("d", "d", "d", "d")


@dataclasses.dataclass(frozen=True)
class NcclInstall:
    """Where nccl.h and libnccl.so.2 are."""

    include: Path
    lib: Path


def find_nccl() -> NcclInstall:
    """RELAX_CUTLASS_NCCL_HOME, else the nvidia-nccl-cu13 / -cu12 wheel (torch's CUDA builds install
    one), else the system's NCCL; an error that says what to install where none is found."""
    given = nccl_home_setting()
    if given:
        return NcclInstall(Path(given) / "include", Path(given) / "lib" / "libnccl.so.2")
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    roots += [Path("/usr/local/cuda"), Path("/usr"), Path("/usr/local")]
    system_lib = Path("/usr/lib/x86_64-linux-gnu/libnccl.so.2")  # Debian's and Ubuntu's packages
    for root in roots:
        libs = [root / "lib" / "libnccl.so.2", root / "lib64" / "libnccl.so.2", system_lib]
        lib = next((p for p in libs if p.exists()), None)
        if (root / "include" / "nccl.h").exists() and lib:
            return NcclInstall(root / "include", lib)
    raise RuntimeError(
        "NCCL was not found: pip install 'relax_cutlass[parallel]' (the nvidia-nccl-cu13 wheel; -cu12 for a "
        f"CUDA 12 toolkit), or set {NCCL_HOME_ENV} to a folder with include/nccl.h and lib/libnccl.so.2"
    )


def nccl_backend_source() -> Path:
    """The NCCL backend's source as the installed apache-tvm wheel ships it."""
    source = package_dir("tvm") / "src" / "runtime" / "extra" / "disco" / "nccl" / "nccl.cc"
    if not source.exists():
        raise RuntimeError(
            f"{source} is missing: relax_cutlass builds disco's NCCL backend from the source the apache-tvm "
            "0.27 wheel ships; reinstall apache-tvm==0.27.0.post1"
        )
    return source


def _write_shims(root: Path) -> Path:
    """The stand-in headers under `root` (content-addressed, so concurrent builds agree)."""
    for name, text in _SHIMS.items():
        path = root / name
        if not path.exists() or path.read_text() != text:
            write_atomically(path, text)
    relative = root.joinpath(*_RELATIVE_ROOT)
    relative.mkdir(parents=True, exist_ok=True)
    return relative


def _loaded_libstdcxx() -> str | None:
    """The libstdc++.so.6 this process has loaded (TVM's), linked by path: a host compiler whose
    own libstdc++ is static only (as on some GPU hosts) cannot link a shared object against it."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = re.search(r"(/\S*/libstdc\+\+\.so\.6[.\d]*)$", maps, re.MULTILINE)
    return found.group(1) if found else None


def backend_command(install: NcclInstall, out: Path) -> list[str]:
    """The host compiler command that builds the backend into the shared library `out`."""
    import tvm_ffi.libinfo

    tc = toolchain()
    tvm_root = package_dir("tvm")
    shims = cache_dir() / f"disco-shims-{hashlib.sha256(repr(sorted(_SHIMS.items())).encode()).hexdigest()[:16]}"
    relative = _write_shims(shims)
    source = nccl_backend_source()
    tvm_lib, ffi_lib = tvm_root / "lib", Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
    cuda_lib = next((tc.cuda_home / d for d in ("lib64", "lib") if (tc.cuda_home / d / "libcudart.so").exists()), None)
    if cuda_lib is None:
        raise RuntimeError(f"libcudart.so not found under {tc.cuda_home}; is the CUDA toolkit complete?")
    libstdcxx = _loaded_libstdcxx()
    # the C++ runtime by path, the rest of the default libraries named (-nodefaultlibs drops them all)
    runtime = ["-nodefaultlibs", libstdcxx, "-lm", "-lc", "-lgcc_s", "-lgcc"] if libstdcxx else []
    rpaths = [f"-Wl,-rpath,{d}" for d in (tvm_lib, ffi_lib, install.lib.parent, cuda_lib)]
    return [
        tc.cxx, "-shared", "-std=c++17", "-O2", "-fPIC", "-w",
        f"-I{shims}", f"-I{relative}", f"-I{source.parent}", f"-I{tvm_root / 'include'}",
        *(f"-I{p}" for p in tc.includes_host), f"-I{install.include}",
        str(source), "-o", str(out),
        f"-L{tvm_lib}", "-ltvm_runtime_extra", "-ltvm_runtime", f"-L{ffi_lib}", "-ltvm_ffi",
        f"-L{cuda_lib}", "-lcudart", str(install.lib), *runtime, *rpaths, "-Wl,--no-undefined",
    ]  # fmt: skip


@functools.cache
def nccl_backend() -> Path:
    """The backend's shared library, built on first use (a few seconds) and cached by content."""
    install = find_nccl()
    cmd = backend_command(install, Path("OUT"))
    text = nccl_backend_source().read_text() + (install.include / "nccl.h").read_text()
    key = hashlib.sha256("\0".join([text, *cmd, toolchain().fingerprint()]).encode()).hexdigest()[:32]
    out = cache_dir() / f"disco_nccl-{key}.so"
    if out.exists():
        return out
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".so.tmp")
    os.close(fd)
    cmd[cmd.index("OUT")] = tmp  # the same command, writing beside the cache entry
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise CompileError(nccl_backend_source(), cmd, proc.stdout + proc.stderr)
    os.replace(tmp, out)
    return out


@functools.cache
def load_nccl_backend() -> Path:
    """Build (if needed) and load the backend into this process; its path, for the workers."""
    path = nccl_backend()
    ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    return path
