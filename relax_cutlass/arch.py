"""Parse and detect the target GPU architecture, and say which kernel family serves it."""

from __future__ import annotations

import re
import shutil
import subprocess

# SMs nvcc 13 can target that relax_cutlass builds for (its kernels need SM80's mma.sync).
KNOWN_ARCHES = (80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121)
BLACKWELL = (100, 103, 110, 120, 121)

# SM count of the flagship part of each SM, for the wave-quantization heuristic.
SM_COUNT = {
    80: 108,  # A100
    86: 84,  # RTX 3090 / A40
    89: 128,  # RTX 4090 (L40S: 142)
    90: 132,  # H100 SXM
    100: 148,  # B200
    # B300 (Blackwell Ultra): the die has 160 SMs; shipped parts are assumed to enable 148 as the
    # B200 does (not verified on hardware: only the wave model's SM count depends on it).
    103: 148,
    110: 20,  # Jetson AGX Thor (2560 CUDA cores)
    120: 170,  # RTX 5090 (RTX PRO 6000 Blackwell: 188)
    121: 48,  # DGX Spark, GB10 (6144 CUDA cores)
}


# Shared memory a CTA may use, per SM (bytes): the CUDA programming guide's table of compute
# capabilities. SMs not listed get the smallest (`smem_limit`), so no tile fails to launch.
SMEM_LIMIT = {
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    103: 227 * 1024,
    110: 227 * 1024,
    120: 99 * 1024,
    121: 99 * 1024,
}


def smem_limit(arch: int) -> int:
    """The shared memory a CTA of `arch` may opt in to (bytes)."""
    return SMEM_LIMIT.get(arch, min(SMEM_LIMIT.values()))


def parse_arch(arch: str | int) -> int:
    """'sm_80' / 'sm_90a' / 'sm_100f' / '120' / 121 / '10.0' / 'auto' -> 80 / 90 / 100 / 120 / 121 / 100 ...

    The 'a' (arch-specific) and 'f' (family) suffixes are accepted and name the same SM: relax_cutlass
    decides per kernel family how to compile for it (`nvcc_gencode`)."""
    if isinstance(arch, int) and not isinstance(arch, bool):
        value = arch
    elif arch == "auto":
        value = detect_arch()
    else:
        text = str(arch).strip().lower()
        match = re.fullmatch(r"(?:sm_?|compute_?)?(\d{2,3})[af]?", text)
        dotted = re.fullmatch(r"(\d{1,2})\.(\d)", text)  # a compute capability, as nvidia-smi prints it
        if match:
            value = int(match.group(1))
        elif dotted:
            value = int(dotted.group(1)) * 10 + int(dotted.group(2))
        else:
            raise ValueError(
                f"arch {arch!r} is not understood: use e.g. 'sm_80', 'sm_86', 'sm_90a', 'sm_100a', 'sm_120' or 'auto'"
            )
    if value < 80:
        raise ValueError(
            f"arch sm_{value} is not supported: relax_cutlass generates SM80+ tensor-op kernels "
            "(Ampere, Ada, Hopper, Blackwell)"
        )
    if value not in KNOWN_ARCHES:
        raise ValueError(
            f"arch sm_{value} is not one relax_cutlass knows how to build for; known: "
            + ", ".join(f"sm_{a}" for a in KNOWN_ARCHES)
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
    return compute_capability(caps[0])


def compute_capability(text: str) -> int:
    """nvidia-smi's compute_cap ("8.0", "9.0", "10.0", "12.1") -> 80, 90, 100, 121."""
    major, minor = text.strip().split(".")
    return int(major) * 10 + int(minor)


def local_gpu_arch() -> int | None:
    """The SM of GPU 0 when one is visible, else None (never raises: used to decide, not to fail)."""
    try:
        return detect_arch()
    except (RuntimeError, ValueError, OSError):
        return None


def native_family(arch: int) -> int:
    """The GEMM kernel family a target runs natively: 90 (CUTLASS 3.x TMA + wgmma) on sm_90a only;
    100 (CUTLASS 3.x TMA + tcgen05 UMMA, tensor memory, 1-SM / 2-SM MMAs) on the datacenter
    Blackwell SMs that have tcgen05 (sm_100a, sm_103a, sm_110a); 80 (CUTLASS 2.x mma.sync, also the
    fused attention kernel) everywhere else, GeForce / DGX Spark Blackwell (sm_120, sm_121) included.
    wgmma exists on SM90 alone and tcgen05 on those SM10x: CUTLASS compiles either family for any
    other target into stubs that do nothing (see relax_cutlass.toolkit.sass_check)."""
    if arch == 90:
        return 90
    return 100 if arch in TCGEN05_ARCHES else 80


# SMs with tcgen05 (UMMA + tensor memory), where CUTLASS's SM100 kernels run (arch/config.h enables
# them for sm_100a, sm_103a and sm_110a). Compile-verified only: no Blackwell GPU has run them here.
TCGEN05_ARCHES = (100, 103, 110)


def family_note(arch: int, kind_family: int | None = None) -> str:
    """Why `arch` gets the kernels it gets, for the offload report ("" where that needs no word).
    `kind_family`: the family a kind without native kernels for `arch` uses instead (80)."""
    if arch in TCGEN05_ARCHES:
        if kind_family == 80:
            return (
                f"SM80 family (CUTLASS 2.x mma.sync) for sm_{arch}: this kind has no native tcgen05 kernel yet; "
                "Blackwell runs mma.sync"
            )
        return f"SM100 family (CUTLASS 3.x tcgen05) for sm_{arch}a: compile-verified, not yet run on Blackwell hardware"
    if arch in BLACKWELL:
        return (
            f"SM80 family (CUTLASS 2.x mma.sync) for sm_{arch}: Blackwell runs it; sm_{arch} has no tcgen05 "
            "(CUTLASS's SM100 kernels) and SM90 wgmma kernels do not run on Blackwell"
        )
    return ""


# Targets compiled arch-specifically (sm_90a: wgmma, setmaxnreg; sm_100a / sm_103a / sm_110a:
# tcgen05), which run on that SM only. The SM80 family uses no arch-specific feature, so the other
# targets (sm_80 ... sm_89, sm_120, sm_121) get plain SASS + PTX.
ARCH_SPECIFIC = (90, *TCGEN05_ARCHES)


def arch_name(arch: int) -> str:
    """The target as nvcc names its SASS: 'sm_90a', 'sm_100', 'sm_120'."""
    return f"sm_{arch}{'a' if arch in ARCH_SPECIFIC else ''}"


def nvcc_gencode(arch: int) -> list[str]:
    """nvcc flags for one arch: the target's own SASS, plus PTX where the driver can JIT it for
    newer GPUs (arch-specific 'a' targets such as sm_90a have no forward-compatible PTX). Plain
    sm_100 SASS also runs on sm_103, and sm_120 SASS on sm_121 (same major, newer minor)."""
    if arch in ARCH_SPECIFIC:
        return [f"-gencode=arch=compute_{arch}a,code=sm_{arch}a"]
    return [f"-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]"]


FAMILIES = ("auto", "sm80", "sm90", "sm100")


def resolve_family(family: str, arch: int) -> str:
    """Check a `family=` option against the target: "auto" (the target's native family), "sm80"
    (CUTLASS 2.x kernels on any target), "sm90" (sm_90a only) or "sm100" (sm_100a / sm_103a /
    sm_110a), each of the last two what "auto" picks on its targets. -> "auto" or "sm80"."""
    if family not in FAMILIES:
        raise ValueError(
            f"family={family!r}: use 'auto' (the target's native kernels), 'sm80', 'sm90' (sm_90a) or "
            "'sm100' (sm_100a, sm_103a, sm_110a)"
        )
    native = {"sm90": 90, "sm100": 100}.get(family)
    if native is not None:
        if native_family(arch) != native:
            targets = "arch='sm_90a'" if native == 90 else "arch='sm_100a', 'sm_103a' or 'sm_110a'"
            what = "wgmma kernels run on Hopper only" if native == 90 else "tcgen05 kernels run on SM10x only"
            raise ValueError(
                f"family={family!r} needs {targets}: CUTLASS's SM{native} {what}, and compiled for sm_{arch} "
                "they are stubs that do nothing; use family='auto' or 'sm80'"
            )
        return "auto"
    return family
