"""What a kind's profiling hook plans (RegionKind.profiling): a problem and the candidate kernels to
time on it, and how stage 1's timings rank a kind's tiles."""

from __future__ import annotations

from dataclasses import dataclass

from ..toolkit.tuning import TuningKey, parse_label
from .epilogue import Epilogue

__all__ = ["ProfileJob", "by_label"]


@dataclass(frozen=True)
class ProfileJob:
    """One problem (shapes fixed) and the candidates to time on it: (kernel, split-K slices), all
    with `epilogue` (stage 1: none)."""

    key: TuningKey
    problem: object  # the kind's problem record
    candidates: tuple[tuple[object, int], ...]
    epilogue: Epilogue = Epilogue()

    @property
    def kernels(self) -> tuple:
        return tuple(dict.fromkeys(k for k, _ in self.candidates))


def by_label(pool, record) -> list[tuple]:
    """Stage 1's correct candidates, fastest first, as (tile, split-K) from `pool`'s tiles."""
    tiles = {t.describe(): t for t in pool}
    timed = sorted((ms, label) for label, ms in record.candidates.items() if ms is not None)
    ranked = []
    for _, label in timed:
        name, split = parse_label(label)
        if name in tiles:
            ranked.append((tiles[name], split))
    return ranked
