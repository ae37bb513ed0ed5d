"""The conv2d region kind (NHWC fprop + epilogue as an implicit GEMM): see kind.py for its RegionKind
record."""
