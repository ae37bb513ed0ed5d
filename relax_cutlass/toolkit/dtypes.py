"""The floating-point dtypes of offloaded tensors: their CUTLASS element types and widths."""

__all__ = ["CUTLASS_ELEMENT", "DTYPE_BITS", "DTYPE_SHORT", "SIXTEEN_BIT_FLOATS"]

# Relax dtype -> CUTLASS element type.
CUTLASS_ELEMENT = {
    "float16": "cutlass::half_t",
    "bfloat16": "cutlass::bfloat16_t",
    "float32": "float",
}
DTYPE_BITS = {"float16": 16, "bfloat16": 16, "float32": 32}
# Relax dtype -> its spelling in kernel names.
DTYPE_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
# The 16-bit float dtypes a mixed-precision graph computes in (float32 is their wide form).
SIXTEEN_BIT_FLOATS = tuple(d for d, bits in DTYPE_BITS.items() if bits == 16)
