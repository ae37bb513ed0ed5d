"""relax_cutlass: offload TVM Relax GEMM (+ fused epilogue) regions to generated CUTLASS kernels."""

__version__ = "0.1.0"

from . import transform  # noqa: E402
from .pipeline import offload_pipeline  # noqa: E402
from .report import offload_report  # noqa: E402

__all__ = ["offload_pipeline", "offload_report", "transform", "__version__"]
