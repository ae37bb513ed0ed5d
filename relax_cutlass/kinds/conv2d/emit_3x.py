"""C++ of the conv2d kind's CUTLASS 3.x kernels: `ConvUniversal` with a TMA im2col mainloop (SM90:
wgmma; SM100: tcgen05 UMMA, 1-SM or 2-SM), built by the conv and epilogue collective builders as
cutlass_library's `EmitConv3xInstance` builds them, with the epilogue as the same epilogue visitor
tree the CUTLASS 3.x GEMMs use (gemm/emit_sm90.py):

    D = post(act(acc + bias) + residual)        (each step present only if the epilogue has it)

The implicit GEMM's N is the output channel, so the bias is the EVT's row broadcast and the
residual its source tensor C, both in the output's NHWC layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

from ...toolkit.dtypes import CUTLASS_ELEMENT, DTYPE_BITS
from ..gemm.emit_sm90 import epilogue_tree
from ..gemm.sm100 import SMS_PER_MMA
from .records import Conv2dKernel

CONV_3X_INCLUDES = """\
#include "cutlass/numeric_types.h"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"
"""

# The mainloop's K tile is a one-mode shape (the conv builders' reduction mode is (C, R, S)).
# `MmaTileShape` is what the builders take (SM100: one UMMA's tile), `TileShape` one CTA's share
# of it, which the EVT's broadcasts tile by.
CONV_3X_INSTANCE = Template("""\
using MmaTileShape = cute::Shape<cute::_${mm}, cute::_${tn}, cute::Shape<cute::_${tk}>>;
using TileShape = cute::Shape<cute::_${tm}, cute::_${tn}, cute::Shape<cute::_${tk}>>;
using ClusterShape = cute::Shape<cute::_${cm}, cute::_${cn}, cute::_1>;
using ElementC = ${element_c};
using EpilogueTree = ${tree_type};

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::${arch}, cutlass::arch::OpClassTensorOp, MmaTileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ${element_acc}, float,
    ElementC, cutlass::layout::TensorNHWC, ${align},
    ${element}, cutlass::layout::TensorNHWC, ${align},
    ${epilogue_schedule}, EpilogueTree>::CollectiveOp;

using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::${arch}, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
    ${element}, cutlass::layout::TensorNHWC, ${align},
    ${element}, cutlass::layout::TensorNHWC, ${align},
    ${element_acc}, MmaTileShape, ClusterShape,
    cutlass::conv::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    ${kernel_schedule}>::CollectiveOp;

using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;

// A struct local to this translation unit (see ../gemm/emit.py: CUTLASS keeps per-kernel state in
// template statics).
struct ${name}_kernel : cutlass::conv::kernel::ConvUniversal<
    ProblemShape, CollectiveMainloop, CollectiveEpilogue, void> {};
""")

# The lower padding is the top/left padding; the upper one is what makes CUTLASS's output size
# (computed from both) the region's P x Q (select.upper_padding, checked here again at run time).
# C's and D's strides follow CUTLASS's conv testbed (tools/library/src/conv_operation_3x.hpp): the
# output's ((Q, P, N), K) modes take the problem's packed NPQK strides.
CONV_3X_ARGUMENTS = Template("""\
const int pad_bottom = (p->p - 1) * p->stride_h + (p->r - 1) * p->dilation_h + 1 - p->h - p->pad_h;
  const int pad_right = (p->q - 1) * p->stride_w + (p->s - 1) * p->dilation_w + 1 - p->w - p->pad_w;
  ProblemShape problem(cutlass::conv::Mode::kCrossCorrelation,
                       ProblemShape::TensorExtent{p->n, p->h, p->w, p->c},
                       ProblemShape::TensorExtent{p->k, p->r, p->s, p->c},
                       {p->pad_h, p->pad_w}, {pad_bottom > 0 ? pad_bottom : 0, pad_right > 0 ? pad_right : 0},
                       {p->stride_h, p->stride_w}, {p->dilation_h, p->dilation_w}, /*groups=*/1);
  if (p->groups != 1 || p->split_k != 1 || problem.shape_C[0] != p->n || problem.shape_C[1] != p->p ||
      problem.shape_C[2] != p->q || problem.shape_C[3] != p->k) {
    return Fail("problem shape (groups, split-K or output size)", cutlass::Status::kErrorInvalidProblem);
  }
  using StrideC = typename Gemm::ConvKernel::StrideC;
  using StrideD = typename Gemm::ConvKernel::StrideD;
  StrideC stride_c{};
  StrideD stride_d{};
  cute::for_each(cute::make_seq<cute::rank<0>(StrideC{})>{}, [&](auto i) {
    cute::get<0, i>(stride_c) = problem.stride_C[ProblemShape::RankT - 2 - i];
  });
  cute::for_each(cute::make_seq<cute::rank<0>(StrideD{})>{}, [&](auto i) {
    cute::get<0, i>(stride_d) = problem.stride_C[ProblemShape::RankT - 2 - i];
  });
  typename Gemm::Arguments arguments{
      problem,
      {static_cast<${element} const*>(p->data), static_cast<${element} const*>(p->weight)},
      {${tree_args},
       static_cast<ElementC const*>(${c_ptr}), stride_c,
       static_cast<${element}*>(p->out), stride_d}};""")


@dataclass(frozen=True)
class ConvFamily:
    """What sets one CUTLASS 3.x conv family's source apart: its arch tag and, per tile schedule,
    its kernel and epilogue schedules."""

    arch: str
    schedules: dict[str, tuple[str, str]]


CONV_FAMILIES = {
    90: ConvFamily(
        "Sm90",
        {
            "warpspecialized": (
                "cutlass::conv::KernelImplicitTmaWarpSpecializedSm90",
                "cutlass::epilogue::TmaWarpSpecialized",
            )
        },
    ),
    100: ConvFamily(
        "Sm100",
        {
            "1sm": (
                "cutlass::conv::KernelImplicitTmaWarpSpecialized1SmSm100",
                "cutlass::epilogue::TmaWarpSpecialized1Sm",
            ),
            "2sm": (
                "cutlass::conv::KernelImplicitTmaWarpSpecialized2SmSm100",
                "cutlass::epilogue::TmaWarpSpecialized2Sm",
            ),
        },
    ),
}


def conv2d_3x_kernel_parts(kernel: Conv2dKernel) -> dict[str, str]:
    """includes / instance / operation_type / arguments for cutlass_device.KERNEL_TU."""
    p, t, epi = kernel.problem, kernel.tile, kernel.epilogue
    family = CONV_FAMILIES[kernel.arch]
    kernel_schedule, epilogue_schedule = family.schedules[t.schedule]
    tree = epilogue_tree(kernel)
    element = CUTLASS_ELEMENT[p.element]
    mm, tn, tk = t.threadblock
    instance = CONV_3X_INSTANCE.substitute(
        mm=mm, tm=mm // SMS_PER_MMA.get(t.schedule, 1), tn=tn, tk=tk, cm=t.cluster[0], cn=t.cluster[1],
        arch=family.arch, kernel_schedule=kernel_schedule, epilogue_schedule=epilogue_schedule,
        element_c=element if epi.residual else "void",
        tree_type=tree.type,
        element_acc=CUTLASS_ELEMENT[p.element_accumulator],
        element=element,
        align=128 // DTYPE_BITS[p.element],
        name=kernel.name,
    )  # fmt: skip
    arguments = CONV_3X_ARGUMENTS.substitute(
        element=element, tree_args=tree.args, c_ptr="p->residual" if epi.residual else "nullptr"
    )
    return {
        "includes": CONV_3X_INCLUDES,
        "instance": instance,
        "operation_type": f"cutlass::conv::device::ConvUniversalAdapter<{kernel.name}_kernel>",
        "arguments": arguments,
    }
