"""The tuning database: measured kernel choices, persisted so that builds need no GPU.

A record says "for this problem class on this GPU architecture, configuration T ran fastest
among these candidates". Tuning runs in two stages (see relax_cutlass.stages.profile): main loops alone
(key.epilogue == ""), then the fastest few of them again with a region's epilogue (key.epilogue
names it, e.g. "bias+gelu"); a build takes the epilogue record when it has one. Records live in
a JSON-lines file a user can read, diff, commit and share. Writes append one line under an
exclusive `flock` (safe under concurrent builds and tuners) and compaction rewrites the file
atomically (temp file + rename).
Lines that are not valid records, and records from another relax_cutlass / CUTLASS version, are
reported once (warning) and ignored: a bad file never breaks a build and is never trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..version import __version__

CUTLASS_VERSION = "4.2.0.0"  # nvidia-cutlass, pinned in pyproject.toml
SCHEMA = 1


class TuningDatabaseWarning(UserWarning):
    """A tuning database line was ignored (corrupt, foreign or from another version)."""


@dataclass(frozen=True)
class TuningKey:
    """Everything a measured choice depends on. Two problems with equal keys get the same kernel."""

    arch: int  # the SM the kernels are built for
    op: str  # the region kind's name (RegionKind.name)
    # The rest as the kind's key function defines them (relax_cutlass/kinds/<kind>/records.py):
    shape: tuple[int, ...]  # the problem's sizes
    geometry: tuple[int, ...]  # anything else that shapes the problem (padding, strides, ...), or ()
    layout: str  # how the operands are laid out
    element: str  # input dtype
    element_out: str
    accumulator: str
    alignment: int
    family: int  # 80: CUTLASS 2.x kernels, 90: CUTLASS 3.x
    epilogue: str = ""  # "": the main loop alone (stage 1); else Epilogue.describe() (stage 2)
    relax_cutlass_version: str = __version__
    cutlass_version: str = CUTLASS_VERSION

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @staticmethod
    def from_json(data: dict) -> TuningKey:
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return TuningKey(**values)


M_BUCKETS = (64, 256, 1024, 4096, 16384)  # a symbolic M is tuned at these values


def m_bucket(m: int) -> int:
    """The tuned M that stands for `m`: the smallest bucket >= m (the largest past the end)."""
    return next((b for b in M_BUCKETS if m <= b), M_BUCKETS[-1])


def parse_label(label: str) -> tuple[str, int]:
    """A candidate label (profile.candidate_label) -> (TileConfig.describe() name, split-K slices).
    Only a numbered suffix is a serial split-K count: SM90's split-K *scheduler* is part of the
    tile's own name ("..._cooperative_splitk")."""
    match = re.fullmatch(r"(.*)_splitk(\d+)", label)
    return (match.group(1), int(match.group(2))) if match else (label, 1)


@dataclass(frozen=True)
class TuningRecord:
    key: TuningKey
    tile: str  # TileConfig.describe() of the fastest correct candidate
    ms: float  # its median time
    split_k: int = 1
    # Every candidate measured: {tile name: median ms, or None if it failed the correctness check}.
    candidates: dict = field(default_factory=dict, compare=False)
    device: str = ""
    measured_at: float = field(default_factory=time.time, compare=False)
    heuristic: str = field(default="", compare=False)  # the label of the heuristic's candidate

    def to_line(self) -> str:
        data = asdict(self) | {"key": self.key.to_json(), "schema": SCHEMA}
        return json.dumps(data, sort_keys=True)

    @staticmethod
    def from_line(line: str) -> TuningRecord:
        data = json.loads(line)
        if data.pop("schema", None) != SCHEMA:
            raise ValueError(f"schema is not {SCHEMA}")
        data["key"] = TuningKey.from_json(data["key"])
        return TuningRecord(**data)


@contextlib.contextmanager
def _locked(path: Path, exclusive: bool):
    lock = path.with_name(path.name + ".lock")
    if not exclusive and not lock.exists() and not os.access(path.parent, os.W_OK):
        # a database on a read-only mount: nothing can write it, so nothing to wait for
        yield
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    # a reader of a lock file it cannot write (a read-only mount) shares it read-only
    readable_only = not exclusive and lock.exists() and not os.access(lock, os.W_OK)
    with open(lock, "r" if readable_only else "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class TuningDatabase:
    """Records by key, loaded from a JSON-lines file (a missing file is an empty database)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(
                f"tuning database {self.path} is a directory: give the path of a JSON-lines file (e.g. "
                f"{self.path / 'tuning.jsonl'})"
            )
        self.problems: list[str] = []  # why lines were ignored, for the report
        self.records: dict[TuningKey, TuningRecord] = {}
        self.reload()

    def reload(self) -> None:
        self.records, self.problems = {}, []
        if not self.path.exists():
            return
        with _locked(self.path, exclusive=False):
            lines = self.path.read_text(errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = TuningRecord.from_line(line)
            except (ValueError, TypeError, KeyError) as err:
                self.problems.append(f"{self.path}:{number}: not a relax_cutlass tuning record ({err})")
                continue
            key = record.key
            if (key.relax_cutlass_version, key.cutlass_version) != (__version__, CUTLASS_VERSION):
                self.problems.append(
                    f"{self.path}:{number}: measured with relax_cutlass {key.relax_cutlass_version} / CUTLASS "
                    f"{key.cutlass_version}, this is {__version__} / {CUTLASS_VERSION}; re-tune to use it"
                )
                continue
            self.records[key] = record  # a later line for the same key wins (re-tuning appends)
        if self.problems:
            warnings.warn(
                f"tuning database {self.path}: ignored {len(self.problems)} line(s); first: {self.problems[0]}",
                TuningDatabaseWarning,
                stacklevel=2,
            )

    def lookup(self, key: TuningKey) -> TuningRecord | None:
        return self.records.get(key)

    def add(self, records: list[TuningRecord]) -> None:
        """Append records (one write per record line, under an exclusive lock)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path, exclusive=True), open(self.path, "a") as out:
            for record in records:
                out.write(record.to_line() + "\n")
                self.records[record.key] = record
            out.flush()
            os.fsync(out.fileno())

    def compact(self) -> None:
        """Rewrite the file with one line per key (the newest), atomically."""
        with _locked(self.path, exclusive=True):
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                for record in sorted(self.records.values(), key=lambda r: json.dumps(r.key.to_json())):
                    out.write(record.to_line() + "\n")
            os.replace(tmp, self.path)

    def __len__(self) -> int:
        return len(self.records)
