"""The example region kind of docs/architecture.md ("adding a region kind"): act(x + bias), a bias
add and an activation over the last axis, as one plain CUDA elementwise kernel.

It is not in `relax_cutlass.kinds.REGISTERED` (it would take bias + activation chains that TVM
fuses as well): `relax_cutlass.kinds.register(KIND)` turns it on, as the tests do.
"""
