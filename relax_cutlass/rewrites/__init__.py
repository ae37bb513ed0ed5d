"""Graph rewrites around the offload, outside the region kinds: torch.export and mixed-precision forms
brought to what the patterns match (canonicalize, fold), NCHW convolutions to NHWC (layout), and
what stays in TVM made buildable (broadcasts, AccumulateInFloat32)."""
