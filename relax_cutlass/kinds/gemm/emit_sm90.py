"""CUTLASS 3.x kernels: SM90 (Hopper) TMA + wgmma warp-specialized GEMMs with the epilogue as an
epilogue visitor tree (EVT), emitted from the same `Epilogue` record as the SM80 kernels; the SM100
family (sm100.py) is the same source with its own `CollectiveFamily`.

    D = post(act(acc + bias) + C)        (each step present only if the epilogue has it; the
                                          C step is a multiply for Epilogue.residual_op "multiply")

The EVT type and its nested argument initializer are generated from one node list, so they
cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

from ...toolkit.dtypes import CUTLASS_ELEMENT, DTYPE_BITS
from ...toolkit.templates import pdl_switch
from .records import SPLIT_K_MAX_SLICES, SPLIT_K_MIN_ITERATIONS, GemmKernel


@dataclass(frozen=True)
class _Node:
    """One EVT node: its C++ type and the C++ initializer of its arguments."""

    type: str
    args: str


def _compute(op: str, out: str, child_nodes: list[_Node]) -> _Node:
    compute = f"cutlass::epilogue::fusion::Sm90Compute<{op}, {out}, float, cutlass::FloatRoundStyle::round_to_nearest>"
    return _Node(
        type=f"cutlass::epilogue::fusion::Sm90EVT<{compute}, {', '.join(n.type for n in child_nodes)}>",
        args="{" + ", ".join(n.args for n in child_nodes) + ", {}}",
    )


def epilogue_tree(kernel: GemmKernel) -> _Node:
    """The EVT computing `kernel.epilogue` with fp32 compute and the output element type last."""
    p, epi = kernel.problem, kernel.epilogue
    out = CUTLASS_ELEMENT[p.element_out]
    activation, post_activation = epi.functors(p.element_out)
    node = _Node("cutlass::epilogue::fusion::Sm90AccFetch", "{}")
    if epi.bias:
        bias = (
            f"cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, {out}, float, "
            f"cute::Stride<cute::_0, cute::_1, int64_t>, {128 // DTYPE_BITS[p.element_out]}>"
        )
        node = _compute(
            "cutlass::plus", "float", [node, _Node(bias, f"{{static_cast<{out} const*>(p->bias), {out}(0), {{}}}}")]
        )
    if epi.activation != "identity":
        node = _compute(activation.functor, "float", [node])
    if epi.residual:
        node = _compute(
            epi.combine.functor, "float", [node, _Node(f"cutlass::epilogue::fusion::Sm90SrcFetch<{out}>", "{}")]
        )
    # The root converts to the output type (and applies the post-residual activation, if any).
    return _compute(post_activation.functor, out, [node])


# The instance of a CUTLASS 3.x kernel (SM90 wgmma, SM100 tcgen05: `CollectiveFamily`).
SM90_INSTANCE = Template("""\
${tile_shapes}using ClusterShape = cute::Shape<cute::_${cm}, cute::_${cn}, cute::_1>;
using ElementC = ${element_c};
using EpilogueTree = ${tree_type};

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::${arch}, cutlass::arch::OpClassTensorOp, ${mma_tile}, ClusterShape,
    ${epilogue_tile}, ${element_acc}, float,
    ElementC, cutlass::layout::RowMajor, ${align_c},
    ${element_d}, cutlass::layout::RowMajor, ${align_d},
    ${epilogue_schedule}, EpilogueTree>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::${arch}, cutlass::arch::OpClassTensorOp,
    ${element_a}, cutlass::layout::RowMajor, ${align},
    ${element_b}, ${layout_b}, ${align},
    ${element_acc}, ${mma_tile}, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    ${kernel_schedule}>::CollectiveOp;

// A struct local to this translation unit (see emit.py: CUTLASS keeps per-kernel state in
// template statics).
struct ${name}_kernel : cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, ${tile_scheduler}> {};
""")

SM90_ARGUMENTS = Template("""\
using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  int m = static_cast<int>(p->m), n = static_cast<int>(p->n), k = static_cast<int>(p->k);
  typename Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {static_cast<${element_a} const*>(p->a), cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(m, k, 1)),
       static_cast<${element_b} const*>(p->b), cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(n, k, 1))},
      {${tree_args},
       static_cast<ElementC const*>(${c_ptr}), cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(m, n, 1)),
       static_cast<${element_d}*>(p->d), cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(m, n, 1))}};""")

# Programmatic dependent launch (PDL): CUTLASS's SM90 kernels then hold every global memory access
# behind `griddepcontrol.wait` (which waits for the preceding kernel to finish and its writes to be
# visible) and signal `griddepcontrol.launch_dependents` once their last main loop is done, so a
# kernel launched with the PDL attribute is scheduled, and runs its prologue, while the kernel before
# it drains its epilogue. Without the attribute both instructions are no-ops. RELAX_CUTLASS_PDL=0
# launches without it (e.g. to compare, or for tools that do not support PDL).
SM90_DEFINES = "#define CUTLASS_ENABLE_GDC_FOR_SM90 1  // before any CUTLASS header: see emit_sm90.py\n"
SM90_INCLUDES = """\
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/util/packed_stride.hpp"
""" + pdl_switch("gemm")
SM90_RUN_CHECKS = "\n  if (const char* error = PdlSettingError()) return error;"
SM90_RUN = "op.run(stream, /*cuda_adapter=*/nullptr, /*launch_with_pdl=*/LaunchWithPdl(stream, 2.0 * m * n * k))"
# The switch (CollectiveFamily.pdl_define) and the launch go together: a kernel without the waits
# must never be launched early.
# CUTLASS 4.2's stream-K scheduler does not compile with the switch (its const `is_last_tile`
# passes a member to a non-const reference; fixed upstream after 4.2 by NVIDIA/cutlass PR 2686), so
# stream-K and split-K kernels launch plainly.
PDL_SCHEDULERS = ("default",)

# schedule -> (kernel schedule, epilogue schedule)
SCHEDULES = {
    "cooperative": (
        "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
        "cutlass::epilogue::TmaWarpSpecializedCooperative",
    ),
    "pingpong": ("cutlass::gemm::KernelTmaWarpSpecializedPingpong", "cutlass::epilogue::TmaWarpSpecialized"),
}
TILE_SCHEDULERS = {
    "default": "cutlass::gemm::PersistentScheduler",
    "streamk": "cutlass::gemm::StreamKScheduler",
    "splitk": "cutlass::gemm::StreamKScheduler",  # in split-K mode: SPLIT_K_ARGUMENTS
}

# Split-K slices, chosen per call from the problem and the GPU's SM count (so one kernel object
# serves any M, a symbolic one included): only when the output tiles fill less than half of the
# SMs; each slice keeps >= SPLIT_K_MIN_ITERATIONS main-loop iterations. The stream-K scheduler
# reduces the slices' partial sums (deterministically) before the epilogue, which thus runs once
# per tile: every epilogue, residual included, is exact under split-K.
SPLIT_K_ARGUMENTS = Template("""
  {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return Fail("SM count query", cutlass::Status::kErrorInternal);
    }
    const int tiles = ((m + ${tm} - 1) / ${tm}) * ((n + ${tn} - 1) / ${tn});
    const int iterations = (k + ${tk} - 1) / ${tk};
    int splits = 1;
    if (2 * tiles <= sms) {
      splits = sms / tiles < ${max_slices} ? sms / tiles : ${max_slices};
      splits = iterations / ${min_iterations} < splits ? iterations / ${min_iterations} : splits;
      splits = splits < 1 ? 1 : splits;
    }
    arguments.hw_info.sm_count = sms;
    arguments.scheduler.splits = splits;
    arguments.scheduler.decomposition_mode =
        Gemm::GemmKernel::TileScheduler::DecompositionMode::SplitK;
  }""")


@dataclass(frozen=True)
class CollectiveFamily:
    """What sets one CUTLASS 3.x kernel family's source apart: its arch tag, its schedules
    (name -> kernel schedule, epilogue schedule), its programmatic-dependent-launch switch, and the
    tile-shape declarations (the shape the collective builders take and, as `TileShape`, the one
    CTA's tile the EVT's broadcasts are tiled by)."""

    arch: str
    schedules: dict[str, tuple[str, str]]
    pdl_define: str
    tile_shapes: object  # TileConfig -> (declarations, name of the builders' tile shape)


def _sm90_tile_shapes(tile) -> tuple[str, str]:
    return "using TileShape = cute::Shape<cute::_{}, cute::_{}, cute::_{}>;\n".format(*tile.threadblock), "TileShape"


SM90 = CollectiveFamily("Sm90", SCHEDULES, SM90_DEFINES, _sm90_tile_shapes)


def sm90_kernel_parts(kernel: GemmKernel, family: CollectiveFamily = SM90) -> dict[str, str]:
    """includes / instance / operation_type / arguments for templates.KERNEL_TU."""
    p, t, epi = kernel.problem, kernel.tile, kernel.epilogue
    tree = epilogue_tree(kernel)
    out = CUTLASS_ELEMENT[p.element_out]
    kernel_schedule, epilogue_schedule = family.schedules[t.schedule]
    out_alignment = 128 // DTYPE_BITS[p.element_out]
    tile_shapes, mma_tile = family.tile_shapes(t)
    instance = SM90_INSTANCE.substitute(
        tile_shapes=tile_shapes, arch=family.arch, mma_tile=mma_tile,
        cm=t.cluster[0], cn=t.cluster[1],
        element_c=out if epi.residual else "void",
        tree_type=tree.type,
        element_acc=CUTLASS_ELEMENT[p.element_accumulator],
        align_c=out_alignment, element_d=out, align_d=out_alignment,
        epilogue_schedule=epilogue_schedule,
        element_a=CUTLASS_ELEMENT[p.element_a], element_b=CUTLASS_ELEMENT[p.element_b],
        layout_b="cutlass::layout::ColumnMajor" if p.b_transposed else "cutlass::layout::RowMajor",
        align=p.alignment, kernel_schedule=kernel_schedule, name=kernel.name,
        tile_scheduler=TILE_SCHEDULERS[t.scheduler],
        epilogue_tile=(
            "cutlass::epilogue::collective::EpilogueTileAuto" if t.epilogue_tile is None
            else "cute::Shape<cute::_{}, cute::_{}>".format(*t.epilogue_tile)
        ),
    )  # fmt: skip
    arguments = SM90_ARGUMENTS.substitute(
        element_a=CUTLASS_ELEMENT[p.element_a],
        element_b=CUTLASS_ELEMENT[p.element_b],
        element_d=out,
        tree_args=tree.args,
        c_ptr="p->residual" if epi.residual else "nullptr",
    )
    if t.scheduler == "splitk":
        arguments += SPLIT_K_ARGUMENTS.substitute(
            tm=t.threadblock[0], tn=t.threadblock[1], tk=t.threadblock[2],
            max_slices=SPLIT_K_MAX_SLICES, min_iterations=SPLIT_K_MIN_ITERATIONS,
        )  # fmt: skip
    return {
        "includes": SM90_INCLUDES,
        "instance": instance,
        "operation_type": f"cutlass::gemm::device::GemmUniversalAdapter<{kernel.name}_kernel>",
        "arguments": arguments,
        **(
            {"defines": family.pdl_define, "run": SM90_RUN, "run_checks": SM90_RUN_CHECKS}
            if t.scheduler in PDL_SCHEDULERS
            else {}
        ),
    }
