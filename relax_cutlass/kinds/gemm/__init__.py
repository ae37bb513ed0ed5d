"""The GEMM region kind (dense / matmul + epilogue): see kind.py for its RegionKind record."""
