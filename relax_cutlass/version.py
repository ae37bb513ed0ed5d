"""relax_cutlass's version (in tuning keys and kernel-cache fingerprints)."""

__version__ = "0.1.0"
