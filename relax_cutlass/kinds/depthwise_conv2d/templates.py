"""C++ of the depthwise kind: its kernel ABI, the CUTLASS direct-convolution instance (no
cutlass_library emitter takes a bias or activation for it: its template hard-codes an alpha-only
LinearCombination) and the glue function of a region."""

from __future__ import annotations

from string import Template

from ...toolkit.templates import GLUE_FUNCTION_HEAD, GLUE_FUNCTION_TAIL
from ..nhwc import NHWC_CONV_CHECKS

ARGS_TYPE = "RelaxCutlassDwConv2dArgs"

DWCONV2D_ARGS = """\
struct RelaxCutlassDwConv2dArgs {
  int n, h, w, c, r, s, p, q;            // K == C == groups
  int pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  int split_k;                           // CTAs per channel group along the output tiles (no reduction)
  const void* data;                      // (N, H, W, C)
  const void* weight;                    // (C, R, S, 1)
  const void* bias;                      // C elements, or nullptr
  void* out;                             // (N, P, Q, C)
};
"""

INCLUDES = """\
#include "cutlass/numeric_types.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/kernel/default_depthwise_fprop.h"
#include "cutlass/conv/device/direct_convolution.h"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"
"""

# CUTLASS examples/46's kernel: each threadblock computes a (1, P_tile, Q_tile) output patch of
# `groups` channels; its threadblock "GEMM" shape is (P_tile * Q_tile, groups, R * S).
INSTANCE = Template("""\
using ${name}_base = typename cutlass::conv::kernel::DefaultDepthwiseDirect2dConvFprop<
    ${element}, cutlass::layout::TensorNHWC, ${element}, cutlass::layout::TensorNHWC,
    ${element}, cutlass::layout::TensorNHWC, ${element_acc},
    cutlass::arch::OpClassSimt, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<${tile_pq}, ${groups}, ${rs}>,
    cutlass::conv::TensorNHWCShape<1, ${tile_p}, ${tile_q}, ${groups}>,
    cutlass::MatrixShape<${r}, ${s}>,
    cutlass::gemm::GemmShape<${warp_m}, ${groups}, ${rs}>,
    cutlass::gemm::GemmShape<1, 1, 1>,
    ${epilogue},
    cutlass::conv::threadblock::DepthwiseDirect2dConvIdentityThreadblockSwizzle<1, 1, ${tile_p}, ${tile_q}>,
    ${stages}, cutlass::arch::OpMultiplyAdd, ${iterator}, ${stride_support},
    cutlass::MatrixShape<${stride_r}, ${stride_s}>, cutlass::MatrixShape<${dilation_r}, ${dilation_s}>>::Kernel;
struct ${name}_kernel : ${name}_base {};

// The kernel reads its filter from a (R*S, C) copy that DirectConvolution::run writes first.
struct ReorderedFilter {
  void* ptr = nullptr;
  cudaStream_t stream;
  ~ReorderedFilter() { if (ptr != nullptr) cudaFreeAsync(ptr, stream); }
};
""")

# D = act(conv(x, w) + bias): the bias is the epilogue's source with an all-zero stride (one
# C-vector broadcast over N, P, Q; NoBetaScaling adds it unscaled); without bias the epilogue
# is alpha-only and never reads a source.
ARGUMENTS = """\
using Layout = cutlass::layout::TensorNHWC;
  using ElementB = typename Gemm::ElementB;
  using ElementC = typename Gemm::ElementC;
  using ElementCompute = typename Gemm::EpilogueOutputOp::ElementCompute;
  cutlass::conv::Conv2dProblemSize problem(
      p->n, p->h, p->w, p->c, p->c, p->r, p->s, p->p, p->q, p->pad_h, p->pad_w, p->stride_h,
      p->stride_w, p->dilation_h, p->dilation_w, cutlass::conv::Mode::kCrossCorrelation, p->split_k, p->c);
  ReorderedFilter reordered{nullptr, stream};
  const Layout layout_w = Layout::packed(cutlass::make_Coord(p->c, p->r, p->s, 1));
  if (cudaMallocAsync(&reordered.ptr, sizeof(ElementB) * p->c * p->r * p->s, stream) != cudaSuccess) {
    return Fail("filter reorder buffer allocation", cutlass::Status::kErrorWorkspaceNull);
  }
  const Layout layout_d = Layout::packed(cutlass::make_Coord(p->n, p->p, p->q, p->c));
  typename Gemm::Arguments arguments(
      problem,
      {static_cast<typename Gemm::ElementA*>(const_cast<void*>(p->data)),
       Layout::packed(cutlass::make_Coord(p->n, p->h, p->w, p->c))},
      {static_cast<ElementB*>(const_cast<void*>(p->weight)), layout_w},
      {static_cast<ElementC*>(const_cast<void*>(p->bias ? p->bias : p->out)),
       p->bias ? Layout(Layout::Stride(0)) : layout_d},
      {static_cast<ElementC*>(p->out), layout_d},
      typename Gemm::EpilogueOutputOp::Params(ElementCompute(1), ElementCompute(0)),
      {static_cast<ElementB*>(reordered.ptr), layout_w});"""

GLUE_FUNCTION = Template(
    GLUE_FUNCTION_HEAD
    + NHWC_CONV_CHECKS
    + """\
  RelaxCutlassDwConv2dArgs args{static_cast<int>(n), $h, $w, $c, $r, $s, $p, $q,
                                $pad_h, $pad_w, $stride_h, $stride_w, $dilation_h, $dilation_w, $split_k,
                                Data(data), Data(weight), $bias_ptr, const_cast<void*>(Data(out))};
"""
    + GLUE_FUNCTION_TAIL
)
