"""Parse and detect the target GPU architecture."""

from __future__ import annotations

import re
import shutil
import subprocess

# SM count of the flagship part of each family, for the wave-quantization heuristic.
SM_COUNT = {80: 108, 86: 84, 89: 128, 90: 132}


def parse_arch(arch: str | int) -> int:
    """'sm_80' / 'sm_90a' / '90' / 90 / 'auto' -> 80 / 90 ..."""
    if isinstance(arch, int):
        value = arch
    elif arch == "auto":
        value = detect_arch()
    else:
        match = re.fullmatch(r"(?:sm_?)?(\d{2,3})a?", str(arch).strip().lower())
        if not match:
            raise ValueError(f"arch {arch!r} is not understood: use 'sm_80', 'sm_86', 'sm_90a' or 'auto'")
        value = int(match.group(1))
    if value < 80:
        raise ValueError(
            f"arch sm_{value} is not supported: relax_cutlass generates SM80+ tensor-op kernels (Ampere, Ada, Hopper)"
        )
    return value


def detect_arch() -> int:
    """Compute capability of GPU 0, read from nvidia-smi (no CUDA context is created)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise RuntimeError(
            "arch='auto' needs a visible NVIDIA GPU, but nvidia-smi is not on PATH; "
            "pass the target explicitly, e.g. arch='sm_80' or arch='sm_90a', to cross-compile"
        )
    proc = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True)
    caps = proc.stdout.split()
    if proc.returncode != 0 or not caps:
        raise RuntimeError(
            f"arch='auto' found no usable GPU (nvidia-smi: {proc.stderr.strip() or 'no devices'}); "
            "pass the target explicitly, e.g. arch='sm_80'"
        )
    major, minor = caps[0].split(".")
    return int(major) * 10 + int(minor)


def local_gpu_arch() -> int | None:
    """The SM of GPU 0 when one is visible, else None (never raises: used to decide, not to fail)."""
    try:
        return detect_arch()
    except (RuntimeError, ValueError, OSError):
        return None


# Targets compiled arch-specifically (sm_90a: wgmma, setmaxnreg), which run on that SM only.
ARCH_SPECIFIC = (90, 100)


def nvcc_gencode(arch: int) -> list[str]:
    """nvcc flags for one arch: the target's own SASS, plus PTX where the driver can JIT it for
    newer GPUs (arch-specific 'a' targets such as sm_90a have no forward-compatible PTX)."""
    if arch in ARCH_SPECIFIC:
        return [f"-gencode=arch=compute_{arch}a,code=sm_{arch}a"]
    return [f"-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]"]
