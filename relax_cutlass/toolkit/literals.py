"""C++ literals for the numbers written into generated sources (scales, epsilons, polynomial
coefficients, test inputs).

Python's own spellings are not C++: `format(1.0, "g") + "f"` is `1f`, which g++ and nvcc read as a
user-defined literal and reject; `repr(float("inf"))` is `inf`, an undeclared name; a negative value
pasted after a minus sign (`x - -1.0f`) becomes a decrement. Every number that reaches generated
C++ goes through `cxx_float`, which writes the value exactly as the target type holds it.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["CXX_FLOAT_TYPES", "as_float32", "cxx_float"]

# C++ type -> (numpy type the value is rounded to, literal suffix, builtins for inf and nan)
CXX_FLOAT_TYPES = {
    "float": (np.float32, "f", "__builtin_huge_valf()", '__builtin_nanf("")'),
    "double": (np.float64, "", "__builtin_huge_val()", '__builtin_nan("")'),
}


def cxx_float(value: float, ctype: str = "float") -> str:
    """A C++ expression of type `ctype` ("float" or "double") equal to `value` rounded to that type.

    Finite values are the shortest decimal that round-trips in the type, always with a decimal point
    or an exponent and the type's suffix (`1.0f`, `1e-30f`, `3.4028235e+38f`); negative values and
    -0.0 are parenthesized (`(-0.5f)`), so the text may follow any operator. Infinities and NaN,
    which C++ has no literal for, are the compiler builtins g++, clang and nvcc (host and device)
    all accept. A finite value beyond the type's range becomes its infinity, as a cast would.
    """
    if ctype not in CXX_FLOAT_TYPES:
        raise ValueError(f"cxx_float: ctype {ctype!r} is not one of {sorted(CXX_FLOAT_TYPES)}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real | np.floating | np.integer):
        raise TypeError(f"cxx_float: {value!r} is not a real number")
    numpy_type, suffix, infinity, nan = CXX_FLOAT_TYPES[ctype]
    with np.errstate(over="ignore"):
        rounded = numpy_type(float(value))
    if math.isnan(rounded):
        return nan
    negative = math.copysign(1.0, float(rounded)) < 0
    if math.isinf(rounded):
        text = infinity
    else:
        text = str(abs(rounded))  # numpy's shortest round-trip spelling for the type
        if not any(c in text for c in ".eE"):
            text += ".0"
        text += suffix
    return f"(-{text})" if negative else text


def as_float32(value: float) -> float:
    """`value` as the kernel reads it, a float32 (`constexpr float kEpsilon`), in its shortest
    decimal: an epsilon written as the double 1e-6 (torch.export's attribute) and one widened from
    float32 (9.99999997e-07, an ONNX attribute or a float32 constant) are one kernel."""
    return float(str(np.float32(value)))
