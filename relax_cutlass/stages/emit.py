"""Emit C++: one translation unit per kernel configuration (by its kind), one glue unit per module
exporting a TVM FFI function per region (the pieces every kind's glue function shares are in
relax_cutlass.toolkit.glue)."""

from __future__ import annotations

from ..kinds import kind_of, kinds
from ..toolkit.compile import Source
from ..toolkit.templates import GLUE_TU


def emit_kernel(kernel) -> Source:
    """The translation unit for one kernel configuration, exporting `<kernel.name>_run`.

    The object runs on exactly `kernel.target` for arch-specific targets (sm_90a), else on it and
    newer GPUs (SASS + PTX); `_run` checks that (`check_device`) before launching.
    """
    return kind_of(kernel).emit_kernel(kernel)


def emit_glue(regions: list, module_name: str) -> Source:
    """Host glue exporting one TVM FFI function per region: checks, stream, launch."""
    kernels = sorted({(k.name, kind_of(r).args_type) for r in regions for k in r.kernels})
    decls = "\n".join(f'extern "C" const char* {k}_run(const {t}* args, void* stream);' for k, t in kernels)
    text = GLUE_TU.substitute(
        args="".join(kind.args for kind in kinds()),
        kernel_decls=decls,
        functions="\n".join(kind_of(r).glue_function(r) for r in regions),
    )
    return Source(f"{module_name}_glue", text, "host")
