"""The operations cutlass_library's generators emit (the candidate kernels every CUTLASS kind
draws from), collected once per process, and a process-independent order for them."""

from __future__ import annotations

import functools

from ...cutlass_lib import data_type
from ...cutlass_lib import load as load_cutlass_library
from .records import TileConfig

__all__ = ["generated_gemms", "generated_operations", "stable_order"]


class _Collector:
    """Stands in for cutlass_library's Manifest: keeps every operation the generator appends."""

    kernel_filter = "all"  # non-empty: the generator emits every tile, not only the first
    compute_capabilities_baseline = [90]
    compute_capabilities_feature_set = ["90a"]
    selected_kernels: list = []

    def __init__(self, instantiation_level: int | None = None):
        self.operations = []
        self.instantiation_level = instantiation_level

    def append(self, operation):
        self.operations.append(operation)

    def get_instantiation_level(self, pruned_level=0, default_level=111, exhaustive_level=9992):
        # None: the generator's default set of cluster shapes and schedules
        return default_level if self.instantiation_level is None else self.instantiation_level


@functools.cache
def generated_operations(generator_name: str, instantiation_level: int | None = None) -> tuple:
    """Every operation one cutlass_library generator function emits (run once per process), at
    its default instantiation level unless one is given (SM90 generators read it; see
    SM90_SMALL_TILES_LEVEL)."""
    load_cutlass_library()
    from cutlass_library import generator

    collector = _Collector(instantiation_level)
    getattr(generator, generator_name)(collector, "13.0")
    return tuple(collector.operations)


def generated_gemms(
    generator_name: str, kind: str, element: str, accumulator: str, instantiation_level: int | None = None
):
    """The GEMM operations of `kind` ("Universal" / "Universal3x") for these input/accumulator types."""
    from cutlass_library.library import GemmKind

    for op in generated_operations(generator_name, instantiation_level):
        if (
            getattr(op, "gemm_kind", None) == getattr(GemmKind, kind)
            and op.A.element == data_type(element)
            and op.accumulator_type() == data_type(accumulator)
        ):
            yield op


def stable_order(tiles) -> tuple[TileConfig, ...]:
    """Candidates in an order that is the same in every process: cutlass_library's generators
    iterate hash-ordered sets, so their own order changes with PYTHONHASHSEED."""
    return tuple(sorted(tiles, key=lambda t: (t.threadblock, t.warps, t.stages, t.cluster, t.schedule, t.scheduler)))
