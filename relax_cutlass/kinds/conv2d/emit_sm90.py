"""C++ of the conv2d kind's SM90 kernels: CUTLASS 3.x `ConvUniversal` (TMA im2col + wgmma, built by
the conv and epilogue collective builders as cutlass_library's `EmitConv3xInstance` builds them) with
the epilogue as the same epilogue visitor tree the SM90 GEMMs use (gemm/emit_sm90.py):

    D = post(act(acc + bias) + residual)        (each step present only if the epilogue has it)

The implicit GEMM's N is the output channel, so the bias is the EVT's row broadcast and the
residual its source tensor C, both in the output's NHWC layout.
"""

from __future__ import annotations

from string import Template

from ..epilogue import CUTLASS_ELEMENT, DTYPE_BITS
from ..gemm.emit_sm90 import epilogue_tree
from .records import Conv2dKernel

SM90_CONV_INCLUDES = """\
#include "cutlass/numeric_types.h"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"
"""

# The mainloop's K tile is a one-mode shape (the conv builders' reduction mode is (C, R, S)).
SM90_CONV_INSTANCE = Template("""\
using TileShape = cute::Shape<cute::_${tm}, cute::_${tn}, cute::Shape<cute::_${tk}>>;
using ClusterShape = cute::Shape<cute::_${cm}, cute::_${cn}, cute::_1>;
using ElementC = ${element_c};
using EpilogueTree = ${tree_type};

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ${element_acc}, float,
    ElementC, cutlass::layout::TensorNHWC, ${align},
    ${element}, cutlass::layout::TensorNHWC, ${align},
    cutlass::epilogue::TmaWarpSpecialized, EpilogueTree>::CollectiveOp;

using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
    ${element}, cutlass::layout::TensorNHWC, ${align},
    ${element}, cutlass::layout::TensorNHWC, ${align},
    ${element_acc}, TileShape, ClusterShape,
    cutlass::conv::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;

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
SM90_CONV_ARGUMENTS = Template("""\
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


def sm90_conv2d_kernel_parts(kernel: Conv2dKernel) -> dict[str, str]:
    """includes / instance / operation_type / arguments for cutlass_device.KERNEL_TU."""
    p, t, epi = kernel.problem, kernel.tile, kernel.epilogue
    tree = epilogue_tree(kernel)
    element = CUTLASS_ELEMENT[p.element]
    tm, tn, tk = t.threadblock
    instance = SM90_CONV_INSTANCE.substitute(
        tm=tm, tn=tn, tk=tk, cm=t.cluster[0], cn=t.cluster[1],
        element_c=element if epi.residual else "void",
        tree_type=tree.type,
        element_acc=CUTLASS_ELEMENT[p.element_accumulator],
        element=element,
        align=128 // DTYPE_BITS[p.element],
        name=kernel.name,
    )  # fmt: skip
    arguments = SM90_CONV_ARGUMENTS.substitute(
        element=element, tree_args=tree.args, c_ptr="p->residual" if epi.residual else "nullptr"
    )
    return {
        "includes": SM90_CONV_INCLUDES,
        "instance": instance,
        "operation_type": f"cutlass::conv::device::ConvUniversalAdapter<{kernel.name}_kernel>",
        "arguments": arguments,
    }
