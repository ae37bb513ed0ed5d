"""Residual add + LayerNorm / RMSNorm (+ cast) over the last axis as one row-wise CUDA kernel."""
