"""C++ of the conv2d kind: the kernel ABI and the glue function of a region."""

from __future__ import annotations

from string import Template

from ...toolkit.templates import GLUE_FUNCTION_HEAD, GLUE_FUNCTION_TAIL
from ..nhwc import NHWC_CONV_CHECKS

ARGS_TYPE = "RelaxCutlassConv2dArgs"

# The same ABI for conv2d fprop kernels: NHWC activations, OHWI (K, R, S, C/groups) filters, NHWC output.
CONV2D_ARGS = """\
struct RelaxCutlassConv2dArgs {
  int n, h, w, c, k, r, s, p, q;
  int pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  int groups;                            // 1: ungrouped; else C/groups and K/groups channels per group
  int split_k;                           // serial split-K slices (1: none)
  const void* data;
  const void* weight;                    // (K, R, S, C/groups)
  const void* bias;                      // per-channel vector of K elements, or nullptr
  const void* residual;                  // (N, P, Q, K) tensor, or nullptr
  void* out;
};
"""


# The problem and tensor layouts every conv2d kernel builds its arguments from.
_CONV2D_SETUP = """\
using Layout = cutlass::layout::TensorNHWC;
  cutlass::conv::Conv2dProblemSize problem(
      p->n, p->h, p->w, p->c, p->k, p->r, p->s, p->p, p->q, p->pad_h, p->pad_w, p->stride_h,
      p->stride_w, p->dilation_h, p->dilation_w, cutlass::conv::Mode::kCrossCorrelation, p->split_k,
      p->groups);
  using ElementA = typename Gemm::ElementA;
  using ElementB = typename Gemm::ElementB;
  using ElementC = typename Gemm::ElementC;
  const Layout layout_d = Layout::packed(cutlass::make_Coord(p->n, p->p, p->q, p->k));
  typename Gemm::Arguments arguments(
      problem,
      {static_cast<ElementA*>(const_cast<void*>(p->data)),
       Layout::packed(cutlass::make_Coord(p->n, p->h, p->w, p->c))},
      {static_cast<ElementB*>(const_cast<void*>(p->weight)),
       Layout::packed(cutlass::make_Coord(p->k, p->r, p->s, p->c / p->groups))},
"""


# conv2d: D = act(conv(x, w) + bias). The bias is the C operand with an all-zero stride (one
# K-vector broadcast over N, P, Q); without bias, beta = 0 and C is never read.
CONV2D_ARGUMENTS = (
    _CONV2D_SETUP
    + """\
      {static_cast<ElementC*>(const_cast<void*>(p->bias ? p->bias : p->out)),
       p->bias ? Layout(Layout::Stride(0)) : layout_d},
      {static_cast<ElementC*>(p->out), layout_d},
      typename Gemm::EpilogueOutputOp::Params(1.0f, p->bias ? 1.0f : 0.0f),
      cutlass::conv::SplitKMode::kSerial);"""
)


# conv2d residual block: D = post(act(conv(x, w) + bias) + residual): the residual is C, the bias
# the broadcast vector of the fused epilogue.
CONV2D_RESIDUAL_ARGUMENTS = (
    _CONV2D_SETUP
    + """\
      {static_cast<ElementC*>(const_cast<void*>(p->residual)), layout_d},
      {static_cast<ElementC*>(p->out), layout_d},
      typename Gemm::EpilogueOutputOp::Params(1.0f, 1.0f),
      cutlass::conv::SplitKMode::kSerial,
      const_cast<void*>(p->bias), /*ptr_Tensor=*/nullptr, /*ldr=*/0, /*ldt=*/p->k);"""
)


CONV2D_GLUE_FUNCTION = Template(
    GLUE_FUNCTION_HEAD
    + NHWC_CONV_CHECKS
    + """\
  RelaxCutlassConv2dArgs args{static_cast<int>(n), $h, $w, $c, $k, $r, $s, $p, $q,
                              $pad_h, $pad_w, $stride_h, $stride_w, $dilation_h, $dilation_w, $groups, $split_k,
                              Data(data), Data(weight), $bias_ptr, $residual_ptr,
                              const_cast<void*>(Data(out))};
"""
    + GLUE_FUNCTION_TAIL
)
