"""C++ of the norm kind: the kernel's translation unit and the glue function of a region."""

from __future__ import annotations

from ...toolkit.compile import Source
from ...toolkit.glue import check_device, launch_call, operand_arrays, role_aliases, tensor_checks, unpack_args
from ...toolkit.literals import cxx_float
from ...toolkit.templates import PDL_DEVICE, pdl_switch
from .records import BYTES, NormKernel, NormRegion
from .templates import ARGS, ARGS_TYPE, CTYPES, GLUE_FUNCTION, KERNEL_TU


def emit_kernel(kernel: NormKernel) -> Source:
    p, layout = kernel.problem, kernel.layout
    text = KERNEL_TU.substitute(
        name=kernel.name,
        args=ARGS,
        args_type=ARGS_TYPE,
        check_device=check_device(kernel),
        pdl_switch=pdl_switch("norm"),
        pdl_device=PDL_DEVICE,
        pdl=str(kernel.target >= 90).lower(),
        data_t=CTYPES[p.data_dtype],
        residual_t=CTYPES[p.residual_dtype or p.data_dtype],
        sum_t=CTYPES[p.sum_dtype],
        gamma_t=CTYPES[p.gamma_dtype or "float32"],
        beta_t=CTYPES[p.beta_dtype or "float32"],
        norm_t=CTYPES[p.norm_dtype],
        out_t=CTYPES[p.out_dtype],
        residual=str(p.residual).lower(),
        rms=str(p.norm == "rms_norm").lower(),
        scale=str(p.gamma_dtype is not None).lower(),
        center=str(p.beta_dtype is not None).lower(),
        epsilon=cxx_float(p.epsilon),
        n=p.n,
        vec=layout.vec,
        row_threads=layout.row_threads,
        block=layout.block,
        vectors=layout.vectors,
    )
    return Source(kernel.name, text, "cuda")  # no tensor-core family: no SASS check


def _alignment(region: NormRegion) -> dict[str, int]:
    """Bytes each tensor's vector accesses need: kVec elements, at most 16 bytes."""
    vec = region.kernel.problem.alignment
    roles = [*zip(region.arg_roles, region.arg_dtypes, strict=True)]
    roles += [(role, dtype) for role, _, dtype in region.output_list]
    return {role: min(16, vec * BYTES[dtype]) for role, dtype in roles if dtype in BYTES}


def glue_function(region: NormRegion) -> str:
    p = region.kernel.problem
    roles = region.roles
    outputs = {role for role, _, _ in region.output_list}
    checks = [
        f'  TRY(CheckDim(fn, "{role} size", Numel({role}), Numel(data), {role}));'
        for role in ("residual", *sorted(outputs))
        if role in roles | outputs
    ]
    checks += [
        f'  TRY(CheckDim(fn, "{role} size", Numel({role}), {p.n}, {role}));'
        for role, used in (("gamma", p.gamma_dtype), ("beta", p.beta_dtype))
        if used
    ]

    def pointer(role: str, const: bool) -> str:
        if role not in roles | outputs:
            return "nullptr"
        return f"Data({role})" if const else f"const_cast<void*>(Data({role}))"

    return GLUE_FUNCTION.substitute(
        symbol=region.symbol,
        unpack=unpack_args(region),
        checks=role_aliases(region) + tensor_checks(region, (), _alignment(region)),
        shape_checks="\n".join(checks),
        n=p.n,
        args_type=ARGS_TYPE,
        residual=pointer("residual", True) if p.residual else "nullptr",
        gamma=pointer("gamma", True) if p.gamma_dtype else "nullptr",
        beta=pointer("beta", True) if p.beta_dtype else "nullptr",
        sum=pointer("sum", False) if "sum" in outputs else "nullptr",
        norm=pointer("norm", False) if "norm" in outputs else "nullptr",
        launch=launch_call(region.kernel),
        operand_arrays=operand_arrays(region),
    )
