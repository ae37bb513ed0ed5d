"""What GEMM and conv2d share in C++: the CUTLASS 2.x epilogue functors and tile descriptions
cutlass_library's emitters take, the residual-block template values, and the translation unit of
a CUTLASS device-level operator."""

from __future__ import annotations

import enum
import functools
from string import Template

from ..cutlass_lib import data_type
from ..cutlass_lib import load as load_cutlass_library
from ..toolkit.compile import Source
from ..toolkit.glue import check_device
from ..toolkit.templates import KERNEL_PRELUDE
from .epilogue import Activation

# One kernel configuration -> one object exporting `<kernel>_run`. (`Gemm` names the device-level
# operator: a GEMM, or the implicit GEMM of a convolution.)
KERNEL_TU = Template(
    """\
// relax_cutlass generated kernel: $name
${defines}"""
    + KERNEL_PRELUDE
    + """\
#include <cstdint>
#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
$includes

$args
// Everything kernel-specific has internal linkage: CUTLASS keeps per-kernel state in template
// statics, which must never be shared with another library holding the same kernel.
namespace {
$instance

$check_device
// Formats "<kernel>: <step> failed: <CUTLASS status> (<CUDA error>)" into a per-thread buffer.
const char* Fail(const char* step, cutlass::Status status) {
  static thread_local char message[512];
  cudaError_t cuda = cudaGetLastError();
  std::snprintf(message, sizeof(message), "$name: %s failed: %s (CUDA: %s)", step,
                cutlass::cutlassGetStatusString(status), cudaGetErrorString(cuda));
  return message;
}
}  // namespace

// Returns nullptr on success, else a message that names the failing step.
extern "C" __attribute__((visibility("default"))) const char* ${name}_run(
    const ${args_type}* p, void* stream_handle) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (const char* error = CheckDevice()) return error;${run_checks}
  using Gemm = $operation_type;
  $arguments
  Gemm op;
  cutlass::Status status = op.can_implement(arguments);
  if (status != cutlass::Status::kSuccess) return Fail("can_implement (problem shape/alignment)", status);
  size_t workspace_size = Gemm::get_workspace_size(arguments);
  void* workspace = nullptr;
  if (workspace_size > 0 && cudaMallocAsync(&workspace, workspace_size, stream) != cudaSuccess) {
    return Fail("workspace allocation", cutlass::Status::kErrorWorkspaceNull);
  }
  status = op.initialize(arguments, workspace, stream);
  const char* step = "initialize";
  if (status == cutlass::Status::kSuccess) {
    status = ${run};
    step = "run";
  }
  if (workspace != nullptr) cudaFreeAsync(workspace, stream);
  if (status != cutlass::Status::kSuccess) return Fail(step, status);
  if (cudaPeekAtLastError() != cudaSuccess) return Fail("kernel launch", cutlass::Status::kErrorInternal);
  return nullptr;
}
"""
)


@functools.cache
def _epilogue_functor(act: Activation) -> enum.Enum:
    """The `EpilogueFunctor`-like member for `act`, registered with cutlass_library's 2.x
    emitters (they read `EpilogueFunctorTag[member]`: the extension point for epilogues beyond its
    LinearCombination/Clamp). Names a template with LinearCombination's <ElementOutput, Count,
    ElementAccumulator, ElementCompute> signature, defined by `_epilogue_alias`."""
    load_cutlass_library()
    from cutlass_library.library import EpilogueFunctorTag

    member = enum.Enum(f"RelaxCutlassEpilogue_{act.name}", {act.name: act.name})[act.name]
    EpilogueFunctorTag[member] = f"RelaxCutlassEpilogue_{act.name}"
    return member


def _epilogue_alias(act: Activation) -> str:
    return (
        f"template <typename O, int N, typename A, typename C>\n"
        f"using RelaxCutlassEpilogue_{act.name} = cutlass::epilogue::thread::LinearCombinationGeneric<\n"
        f"    {act.functor}, O, N, A, C, cutlass::epilogue::thread::ScaleType::Default,\n"
        f"    cutlass::FloatRoundStyle::round_to_nearest, /*IsHeavy=*/{str(act.is_heavy).lower()}>;\n"
    )


def activation_prefix(kernel) -> str:
    """The alias `_epilogue_functor` names, for kernels with an activation (else nothing)."""
    if kernel.epilogue.activation == "identity":
        return ""
    return _epilogue_alias(kernel.epilogue.functors(kernel.problem.element_out)[0])


def sm80_description(kernel, element_a: str, element_b: str):
    """-> (TileDescription, epilogue functor, swizzle) of a CUTLASS 2.x tensor-op kernel, as
    cutlass_library's GEMM and conv2d operations both take them."""
    load_cutlass_library()
    from cutlass_library.library import (
        EpilogueFunctor,
        MathInstruction,
        MathOperation,
        OpcodeClass,
        SwizzlingFunctor,
        TileDescription,
    )  # fmt: skip

    t = kernel.tile
    activation = kernel.epilogue.functors(kernel.problem.element_out)[0]
    mi = MathInstruction(
        list(t.instruction),
        data_type(element_a),
        data_type(element_b),
        data_type(kernel.problem.element_accumulator),
        OpcodeClass.TensorOp,
        MathOperation.multiply_add,
    )
    tile = TileDescription(list(t.threadblock), t.stages, list(t.warps), mi, 80, 1024)
    identity = kernel.epilogue.activation == "identity"
    functor = EpilogueFunctor.LinearCombination if identity else _epilogue_functor(activation)
    return tile, functor, getattr(SwizzlingFunctor, f"Identity{t.swizzle}")


def residual_block_values(kernel, element_c) -> dict:
    """Template values every residual-block kernel shares: tile shapes, epilogue vector and functors."""
    from cutlass_library.library import DataTypeSize

    t, p, epi = kernel.tile, kernel.problem, kernel.epilogue
    bits = DataTypeSize[element_c]
    activation, post_activation = epi.functors(p.element_out)
    return dict(
        name=kernel.name,
        tb_m=t.threadblock[0], tb_n=t.threadblock[1], tb_k=t.threadblock[2],
        w_m=t.threadblock[0] // t.warps[0], w_n=t.threadblock[1] // t.warps[1], w_k=t.threadblock[2] // t.warps[2],
        i_m=t.instruction[0], i_n=t.instruction[1], i_k=t.instruction[2],
        vector=min(p.alignment * bits, 128) // bits,
        activation=activation.functor,
        post_activation=post_activation.functor,
        residual_op=epi.combine.functor,
        swizzle=t.swizzle, stages=t.stages, alignment=p.alignment,
    )  # fmt: skip


def device_kernel_source(kernel, parts: dict[str, str], args: str, args_type: str, family: str | None = None) -> Source:
    """The translation unit of a CUTLASS device-level operator (a GEMM, or a convolution's implicit
    GEMM) from its `parts` (includes, instance, operation_type, arguments[, defines, run]);
    `family` (sass_check's) defaults to the kernel's arch ("sm80", "sm90")."""
    # Custom activation functors (relax_cutlass.extend) are defined before the types that use them.
    parts["instance"] = kernel.epilogue.definitions(kernel.problem.element_out) + parts["instance"]
    parts.setdefault("defines", "")
    parts.setdefault("run", "op.run(stream)")
    parts.setdefault("run_checks", "")  # C++ after the device check (e.g. the PDL setting's)
    text = KERNEL_TU.substitute(
        name=kernel.name, args=args, args_type=args_type, check_device=check_device(kernel), **parts
    )
    return Source(kernel.name, text, "cuda", family=family or f"sm{kernel.arch}")
