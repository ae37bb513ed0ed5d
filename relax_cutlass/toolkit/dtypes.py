"""The floating-point dtypes of offloaded tensors: their CUTLASS element types and widths."""

__all__ = ["CUTLASS_ELEMENT", "DTYPE_BITS"]

# Relax dtype -> CUTLASS element type.
CUTLASS_ELEMENT = {
    "float16": "cutlass::half_t",
    "bfloat16": "cutlass::bfloat16_t",
    "float32": "float",
}
DTYPE_BITS = {"float16": 16, "bfloat16": 16, "float32": 32}
