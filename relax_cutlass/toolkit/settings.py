"""The RELAX_CUTLASS_* environment variables, each parsed and checked where it is first read.

A value that is not understood is an error that names the variable, the value and what is accepted:
read as a default without a word, a mistyped setting changes nothing and looks like it worked.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "DEFAULT_M_HINT",
    "PDL_ENV",
    "PDL_KINDS",
    "SettingError",
    "check_pdl_setting",
    "compile_log_path",
    "env_flag",
    "env_jobs",
    "jobs_setting",
    "NCCL_HOME_ENV",
    "nccl_home_setting",
    "positive_int",
]

# M assumed by the kernel heuristics when M is symbolic (CodegenOptions.m_hint).
DEFAULT_M_HINT = 1024
JOBS_ENV = "RELAX_CUTLASS_JOBS"
PDL_ENV = "RELAX_CUTLASS_PDL"
# The kinds whose kernels launch with programmatic dependent launch (toolkit.templates.pdl_switch),
# and "none": the names RELAX_CUTLASS_PDL=always:<kind>[+<kind>...] takes.
PDL_KINDS = ("gemm", "norm", "attention", "none")
PDL_ACCEPTED = "unset, 1 (the default), 0 (never), always, or always:<kinds> with kinds from {} joined by '+'"
_TRUE, _FALSE = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


class SettingError(ValueError):
    """An option or environment variable whose value relax_cutlass does not accept."""


def positive_int(name: str, value, what: str) -> int:
    """`value` as a whole number >= 1, else a SettingError naming `name` and `what` it counts."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
            value = int(value)
        else:
            raise SettingError(f"{name}={value!r}: use a whole number >= 1 ({what})")
    if value < 1:
        raise SettingError(f"{name}={value!r}: use a whole number >= 1 ({what})")
    return value


_JOBS = "parallel compiler processes; unset: one per core"


def env_jobs() -> int | None:
    """RELAX_CUTLASS_JOBS, checked; None where unset or empty."""
    value = os.environ.get(JOBS_ENV, "").strip()
    return positive_int(JOBS_ENV, value, _JOBS) if value else None


def jobs_setting(jobs) -> int | None:
    """The `jobs` option, checked (None: RELAX_CUTLASS_JOBS, else one per core)."""
    return env_jobs() if jobs is None else positive_int("jobs", jobs, _JOBS)


def check_pdl_setting() -> str | None:
    """RELAX_CUTLASS_PDL, checked at build time as the kernels read it at run time (the C++ reader,
    toolkit.templates.pdl_switch, refuses to launch on a value this refuses)."""
    value = os.environ.get(PDL_ENV)
    if value is None or value in ("0", "1", "always"):
        return value
    kinds = value.removeprefix("always:").split("+") if value.startswith("always:") else None
    if kinds is None or not all(k in PDL_KINDS for k in kinds):
        raise SettingError(f"{PDL_ENV}={value!r} is not a setting: use {PDL_ACCEPTED.format(set(PDL_KINDS))}")
    return value


COMPILE_LOG_ENV = "RELAX_CUTLASS_COMPILE_LOG"


def compile_log_path() -> str | None:
    """RELAX_CUTLASS_COMPILE_LOG: a file that every compile appends a JSON line to (what, how long,
    cached or not), for measuring where a build's time goes; None where unset or empty. Its folder
    must exist and be writable."""
    value = os.environ.get(COMPILE_LOG_ENV, "").strip()
    if not value:
        return None
    folder = os.path.dirname(os.path.abspath(value))
    if os.path.isdir(value) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SettingError(
            f"{COMPILE_LOG_ENV}={value!r}: use the path of a file in an existing writable folder (each compile "
            "appends a line to it), or unset it"
        )
    return value


def env_flag(name: str, default: bool) -> bool:
    """A yes/no variable: 1/on/true/yes or 0/off/false/no (any case); `default` where unset."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise SettingError(f"{name}={value!r}: use one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}")


NCCL_HOME_ENV = "RELAX_CUTLASS_NCCL_HOME"


def nccl_home_setting() -> str | None:
    """RELAX_CUTLASS_NCCL_HOME, checked: a directory with include/nccl.h and lib/libnccl.so.2 (an
    NCCL install, or the `nvidia/nccl` folder of the nvidia-nccl-cu12/-cu13 wheels); None where unset."""
    value = os.environ.get(NCCL_HOME_ENV, "").strip()
    if not value:
        return None
    missing = [p for p in ("include/nccl.h", "lib/libnccl.so.2") if not os.path.exists(os.path.join(value, p))]
    if missing:
        raise SettingError(
            f"{NCCL_HOME_ENV}={value!r} has no {' and no '.join(missing)}: point it at an NCCL install (a folder "
            "with include/nccl.h and lib/libnccl.so.2), or unset it to use the nvidia-nccl-cu13 wheel"
        )
    return value
