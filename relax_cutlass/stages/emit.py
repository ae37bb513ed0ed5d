"""Emit C++: one translation unit per kernel configuration (by its kind), one glue unit per module
exporting a TVM FFI function per region; and the pieces every kind's glue function shares (argument
unpacking, tensor checks, the run-time device guard)."""

from __future__ import annotations

from string import Template

from ..arch import ARCH_SPECIFIC, arch_name
from ..kinds import kind_of, kinds
from ..kinds.epilogue import DTYPE_BITS
from .compile import Source
from .templates import CHECK_DEVICE, GLUE_TU


def check_device(kernel) -> str:
    """The run-time guard: an arch-specific object (sm_90a) runs on exactly that SM; plain SASS +
    PTX (sm_80, sm_100, sm_120, ...) on it and on every newer GPU, whose driver JITs the PTX (or, in
    the same major, runs the SASS: sm_100 on sm_103, sm_120 on sm_121)."""
    exact = kernel.target in ARCH_SPECIFIC
    return Template(CHECK_DEVICE).substitute(
        name=kernel.name,
        arch=kernel.target,
        arch_exact=str(exact).lower(),
        arch_name=arch_name(kernel.target).removeprefix("sm_"),
    )


def emit_kernel(kernel) -> Source:
    """The translation unit for one kernel configuration, exporting `<kernel.name>_run`.

    The object runs on exactly `kernel.target` for arch-specific targets (sm_90a), else on it and
    newer GPUs (SASS + PTX); `_run` checks that (`check_device`) before launching.
    """
    return kind_of(kernel).emit_kernel(kernel)


_DLPACK_CODE = {"float16": "kDLFloat", "float32": "kDLFloat", "bfloat16": "kDLBfloat"}


def unpack_args(region) -> str:
    """The exported function's arguments, read as `const DLTensor*` pointers named by role: one per
    composite parameter (R.Shape ones, passed by fused views with symbolic shapes, are taken and
    ignored), then the output(s) (`Region.output_list`)."""
    roles = [*region.arg_roles, *(role for role, _, _ in region.output_list)]
    dtypes = [*region.arg_dtypes, *(dtype for _, _, dtype in region.output_list)]
    tensors = [(i, role) for i, (role, dtype) in enumerate(zip(roles, dtypes, strict=True)) if dtype != "shape"]
    lines = [
        f'  TRY(CheckArgCount(fn, num_args, {len(roles)}, "{", ".join(roles)}"));',
        "  const DLTensor " + ", ".join(f"*{role}" for _, role in tensors) + ";",
    ]
    lines += [f'  TRY(TensorArg(fn, ffi_args, {i}, "{role}", &{role}));' for i, role in tensors]
    return "\n".join(lines)


def operand_arrays(region) -> str:
    """The region's tensors by role, as the arrays a kernel failure's message describes."""
    pairs = zip(
        [*region.arg_roles, *(r for r, _, _ in region.output_list)],
        [*region.arg_dtypes, *(d for _, _, d in region.output_list)],
        strict=True,
    )
    roles = [role for role, dtype in pairs if dtype != "shape"]
    return (
        f"    const int kOperandCount = {len(roles)};\n"
        f"    const char* const kOperandNames[] = {{{', '.join(f'{chr(34)}{r}{chr(34)}' for r in roles)}}};\n"
        f"    const DLTensor* const kOperandTensors[] = {{{', '.join(roles)}}};"
    )


def role_aliases(region) -> str:
    """A name for each second role of a parameter (the residual that is also the lhs)."""
    return "".join(f"  const DLTensor* {alias} = {role};\n" for alias, role in region.role_aliases)


def tensor_checks(region, vector_roles: tuple[str, ...], align: dict | None = None) -> str:
    """One CheckTensor line per argument: dtype, device, contiguity, and the kernel's alignment
    (`align`: bytes for roles the kernel reads with its own vector width)."""
    alignment = region.kernel.problem.alignment
    checks = []
    outputs = [(role, dtype) for role, _, dtype in region.output_list]
    for role, dtype in [*zip(region.arg_roles, region.arg_dtypes, strict=True), *outputs]:
        if dtype == "shape":
            continue
        code, bits = _DLPACK_CODE[dtype], DTYPE_BITS[dtype]
        align_bytes = max(1, alignment * bits // 8) if role in vector_roles else bits // 8
        align_bytes = (align or {}).get(role, align_bytes)
        checks.append(f'  TRY(CheckTensor(fn, "{role}", {role}, {code}, {bits}, {align_bytes}, device_id));')
    return "\n".join(checks)


def residual_checks(roles) -> list[str]:
    if "residual" not in roles:
        return []
    return [
        '  TRY(CheckDim(fn, "residual rank", residual->ndim, out->ndim, residual));',
        "  for (int i = 0; i < out->ndim; ++i)\n"
        '    TRY(CheckDim(fn, "residual dim", residual->shape[i], out->shape[i], residual));',
    ]


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


def launch_call(kernel) -> str:
    """The glue's call of `kernel` with the `args` it filled in (GLUE_FUNCTION_TAIL's `launch`)."""
    return f"{kernel.name}_run(&args, stream)"
