"""The pieces every kind's host glue function and kernel unit share: argument unpacking, tensor
checks, the run-time device guard and the kernel launch call."""

from __future__ import annotations

from string import Template

from ..arch import ARCH_SPECIFIC, arch_name
from .dtypes import DTYPE_BITS
from .templates import CHECK_DEVICE

__all__ = [
    "check_device",
    "launch_call",
    "operand_arrays",
    "residual_checks",
    "role_aliases",
    "tensor_checks",
    "unpack_args",
]


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


def launch_call(kernel) -> str:
    """The glue's call of `kernel` with the `args` it filled in (GLUE_FUNCTION_TAIL's `launch`)."""
    return f"{kernel.name}_run(&args, stream)"
