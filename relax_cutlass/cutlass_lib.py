"""Import cutlass_library safely.

`cutlass_library.generator` parses `sys.argv` when imported (and exits on `-h`), so a user's own
command-line flags could reach it. Every relax_cutlass use goes through `load()`, which imports it
once with a neutral argv.
"""

from __future__ import annotations

import functools
import sys


@functools.cache
def load():
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        import cutlass_library.gemm_operation
        import cutlass_library.generator
        import cutlass_library.library
    finally:
        sys.argv = saved
    return cutlass_library


def data_type(dtype: str):
    """The cutlass_library DataType of a Relax dtype string ("float16" -> DataType.f16)."""
    library = load().library
    return {"float16": library.DataType.f16, "bfloat16": library.DataType.bf16, "float32": library.DataType.f32}[dtype]
