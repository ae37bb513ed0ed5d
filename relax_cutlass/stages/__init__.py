"""The shared stages of relax_cutlass, in pipeline order (docs/architecture.md); none of them knows a
region kind by name: each iterates over `relax_cutlass.kinds.KINDS`."""
