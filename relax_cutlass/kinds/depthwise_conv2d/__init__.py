"""Depthwise conv2d (groups == C == K) on CUTLASS 2.x's SIMT direct convolution (examples/46)."""
