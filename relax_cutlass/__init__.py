"""relax_cutlass: offload TVM Relax GEMM / conv2d (+ fused epilogue) regions to generated CUTLASS kernels."""

from __future__ import annotations

from .version import __version__

__all__ = [
    "from_onnx",
    "from_torch",
    "launches_per_forward",
    "offload_pipeline",
    "offload_report",
    "transform",
    "__version__",
]


def __getattr__(name: str):
    """The passes import TVM's compiler (tvm.relax); load them on first use so that the modules a
    GPU host with only the TVM runtime needs (tuning, profile_runner) import without it."""
    if name == "transform":
        import importlib

        # import_module, not `from . import`: the latter looks the name up on this module first,
        # which would call back into this __getattr__.
        return importlib.import_module(f"{__name__}.transform")
    if name == "offload_pipeline":
        from .pipeline import offload_pipeline

        return offload_pipeline
    if name == "from_torch":
        from .frontend import from_torch

        return from_torch
    if name == "from_onnx":
        from .onnx_frontend import from_onnx

        return from_onnx
    if name == "offload_report":
        from .stages.report import offload_report

        return offload_report
    if name == "launches_per_forward":
        from .stages.launches import launches_per_forward

        return launches_per_forward
    raise AttributeError(f"module 'relax_cutlass' has no attribute {name!r}")
