"""The fused attention region kind (CUTLASS examples/41): see kind.py for its RegionKind record."""
