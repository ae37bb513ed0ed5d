"""C++ of fused attention: the kernel's translation unit (CUTLASS examples/41) and a region's glue
function (sizes, shape checks, strides of q/k/v and the bias)."""

from __future__ import annotations

from ...toolkit.compile import Source, cache_dir
from ...toolkit.dtypes import CUTLASS_ELEMENT, DTYPE_BITS
from ...toolkit.glue import check_device, launch_call, operand_arrays, role_aliases, tensor_checks, unpack_args
from ...toolkit.literals import cxx_float
from ...toolkit.toolchain import package_dir, write_atomically
from .emit_sm90 import emit_sm90_attention_kernel
from .layout import OPERAND_AXES
from .records import BIAS_AXES, CAUSAL_CODE, MASKED_ROWS, AttentionKernel, AttentionRegion
from .templates import ATTENTION_ARGS, ATTENTION_GLUE_FUNCTION, ATTENTION_KERNEL_TU


def emit_attention_kernel(kernel: AttentionKernel) -> Source:
    if kernel.arch == 90:
        return emit_sm90_attention_kernel(kernel)
    text = ATTENTION_KERNEL_TU.substitute(
        name=kernel.name,
        attention_args=ATTENTION_ARGS,
        element=CUTLASS_ELEMENT[kernel.problem.element],
        aligned=str(kernel.aligned).lower(),
        queries=kernel.queries_per_block,
        keys=kernel.keys_per_block,
        max_k=kernel.max_head_dim,
        supports_bias=str(kernel.bias).lower(),
        check_device=check_device(kernel),
    )
    return Source(kernel.name, text, "cuda", fmha_flags(), family="fmha")


def attention_glue_function(region: AttentionRegion) -> str:
    """The ranks of q/k/v, then sizes (static ones as literals, symbolic ones read from the one
    dimension that holds them), a check of every dimension of q/k/v against the axes it holds, and
    the strides."""
    p = region.kernel.problem
    static = {"B": p.batch, "S": p.seq_q, "T": p.seq_kv, "N": p.heads, "H": p.head_dim, "V": p.head_dim_value}
    names = {"B": "batch", "S": "seq_q", "T": "seq_kv"}
    expr = {axis: str(v) if v is not None else names[axis] for axis, v in static.items()}
    reads = {"query": p.query_reads, "key": p.key_reads, "value": p.value_reads}
    ranks = {role: len(shape) for role, shape in zip(region.arg_roles, region.arg_shapes, strict=True)}
    # q, k and v sliced out of one packed projection: one parameter in several roles
    ranks |= {alias: ranks[role] for alias, role in region.role_aliases}
    sliced = {(role, dim): (first, whole) for role, dim, first, whole in p.slices}
    sizes, rank_checks, checks, strides, defined = [], [], [], {}, set()
    for role, axes in OPERAND_AXES:
        # grouped-query keys/values hold heads / kv_group heads
        held_expr = expr | {"N": str(p.heads if role == "query" else p.kv_heads)}
        rank_checks.append(f'  TRY(CheckDim(fn, "{role} rank", {role}->ndim, {ranks[role]}, {role}));')
        held: dict[int, list[str]] = {}
        for axis, (dim, factor) in zip(axes, reads[role], strict=True):
            held.setdefault(dim, []).append(axis)
            strides[(role, axis)] = f"PackedStride({role}, {dim})" + (f" * {factor}" if factor != 1 else "")
        for dim in range(ranks[role]):
            inside = held.get(dim, [])
            for axis in inside:  # a symbolic axis is defined by the first dimension holding it
                if static[axis] is None and axis not in defined:
                    others = "".join(f" / {held_expr[a]}" for a in inside if a != axis)
                    sizes.append(f"  const int64_t {names[axis]} = {role}->shape[{dim}]{others};")
                    defined.add(axis)
            want = " * ".join(held_expr[a] for a in inside) or "1"
            if (role, dim) in sliced:  # the operand is a part of this dim
                want = str(sliced[(role, dim)][1])
            checks.append(f'  TRY(CheckDim(fn, "{role} dim {dim}", {role}->shape[{dim}], {want}, {role}));')
    for axis in ("B", "S", "T"):
        if static[axis] is not None:
            sizes.append(f"  const int64_t {names[axis]} = {static[axis]};")
    operands = []
    element_bytes = DTYPE_BITS[p.element] // 8
    for role, axes in OPERAND_AXES:
        b, rows, n = (strides[(role, a)] for a in axes[:3])
        data = f"Data({role})"
        for (sliced_role, dim), (first, _) in sliced.items():
            if sliced_role == role:  # its part starts `first` elements into the dim
                data = f"static_cast<const char*>({data}) + {first} * PackedStride({role}, {dim}) * {element_bytes}"
        operands.append(f"{data}, {b}, {rows}, {n}")
    bias = ""
    if p.bias_reads is not None:
        bias_checks, bias_strides = _attention_bias(p, ranks["bias"], expr)
        checks += bias_checks
        bias = f",\n      Data(bias), {', '.join(bias_strides)}, {MASKED_ROWS.index(p.masked_rows)}"
    return ATTENTION_GLUE_FUNCTION.substitute(
        operand_arrays=operand_arrays(region),
        symbol=region.symbol,
        unpack=unpack_args(region),
        checks=role_aliases(region) + tensor_checks(region, ("query", "key", "value", "out"), {"bias": 16}),
        rank_checks="\n".join(rank_checks),
        sizes="\n".join(sizes),
        shape_checks="\n".join(checks),
        heads=p.heads,
        head_dim=p.head_dim,
        head_dim_value=p.head_dim_value,
        operands=",\n      ".join(operands),
        scale=cxx_float(p.scale),
        bias=bias,
        causal=CAUSAL_CODE[p.causal],
        kv_group=p.kv_group,
        launch=launch_call(region.kernel),
    )


def _attention_bias(p, rank: int, expr: dict) -> tuple[list[str], list[str]]:
    """The additive bias: checks of its dimensions (each 1, broadcast, or the sizes of the axes it
    holds) and of the keys' 16-byte rows, and its batch, head and query-row strides (0 where
    broadcast)."""
    held: dict[int, list[str]] = {}
    strides = []
    for axis, read in zip(BIAS_AXES, p.bias_reads, strict=True):
        if read is not None:
            held.setdefault(read[0], []).append(axis)
        if axis != "T":
            factor = "" if read is None or read[1] == 1 else f" * {read[1]}"
            strides.append("0" if read is None else f"PackedStride(bias, {read[0]}){factor}")
    checks = [f'  TRY(CheckDim(fn, "bias rank", bias->ndim, {rank}, bias));']
    for dim in range(rank):
        want = " * ".join(expr[a] for a in held.get(dim, [])) or "1"
        checks.append(f'  TRY(CheckDim(fn, "bias dim {dim}", bias->shape[{dim}], {want}, bias));')
    # a key count off a multiple of BIAS_VECTOR: the kernel's run function pads the rows (PadBiasRows)
    return checks, strides


def fmha_flags() -> tuple[str, ...]:
    """nvcc flags for CUTLASS's fused multi-head attention headers (examples/41, shipped in the
    nvidia-cutlass wheel). They include <curand_kernel.h> for dropout, which relax_cutlass never
    compiles in (every use is behind HAS_PYTORCH) and which minimal CUDA installs lack: an empty
    stand-in is searched after the system headers, so a real one still wins."""
    example = package_dir("cutlass_library") / "source" / "examples" / "41_fused_multi_head_attention"
    shim = cache_dir() / "include-fallback"
    header = shim / "curand_kernel.h"
    if not header.exists():
        write_atomically(header, "// relax_cutlass: stand-in for curand_kernel.h (dropout is never compiled in)\n")
    return (f"-I{example}", f"-Xcompiler=-idirafter,{shim}")
