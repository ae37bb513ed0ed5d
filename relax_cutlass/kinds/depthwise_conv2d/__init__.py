"""Depthwise conv2d (groups == C == K): relax_cutlass's blocked direct kernel (direct_templates.py)
where it applies, else CUTLASS 2.x's SIMT direct convolution (examples/46)."""
