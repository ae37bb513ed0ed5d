"""C++ of the depthwise kind's own kernel family: a register-blocked NHWC direct depthwise
convolution written for relax_cutlass (the "direct" tiles, `BlockedTile`).

Why a hand-written kernel: CUTLASS 2.x's SIMT direct convolution (examples/46, the kind's other
family) was measured on an H200 against cuDNN (fp16, channels_last, batch 32;
bench/results/2026-11-26-depthwise-tiles-nvidia-h200.json), ms per conv, cuDNN / best
CUTLASS tile, for ConvNeXt-tiny's 7x7 stride-1 convs: 56x56x96 0.095 / 0.146, 28x28x192 0.056 /
0.086, 14x14x384 0.032 / 0.061, 7x7x768 0.024 / 0.039 -- weighted by how often the model runs each
(3, 3, 9, 3), cuDNN 0.81 ms against CUTLASS's 1.37 ms, the largest single cost of ConvNeXt's ~3.9 ms
forward. Their roofline is far below both (ConvNeXt's 18 depthwise convs move ~274 MB, ~0.1 ms at
the H200's bandwidth, for 3.4 GMACs). No maintained library a stock TVM user has does better than
CUTLASS here (cuDNN is not one of them), and CUTLASS's path also allocates and reorders the filter
on every call. So this kernel: memory-bound by design, nothing allocated or reordered per call.

How it computes (one CTA = a TP x TQ patch of output pixels of G channels of one image):
  1. Load: the CTA's input halo ((TP-1)*SH + R rows x (TQ-1)*SW + S columns x G channels) is copied
     into shared memory with 128-bit loads (8 channels each; C % 8 == 0 is the kind's rule), zeros
     where it lies in the padding or past the last channel.
  2. Compute: each thread owns one channel pair (half2 / bfloat162, summed as float2) and a PT x QT
     block of output pixels. It keeps its pair's R*S filter taps in registers (read once from the
     (C, R, S, 1) filter as it is: no reordered copy) and slides down the (PT-1)*SH + R input rows
     of its block, converting each row's (QT-1)*SW + S pixels once and adding each to every output
     of the block it touches (fp32 FMAs).
  3. Epilogue: act(sum + bias) per channel, written as one 32-bit pair per output pixel.
The two phases are __host__ __device__ functions, so the same code also runs on the CPU, one CTA
and one thread after another (`<kernel>_emulate`, compiled only with RELAX_CUTLASS_DW_EMULATE: the
tests check the index math against the numpy reference without a GPU).
"""

from __future__ import annotations

from string import Template

from ...toolkit.templates import KERNEL_PRELUDE

DIRECT_INCLUDES = """\
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "cutlass/numeric_types.h"
#include "cutlass/epilogue/thread/activation.h"
"""

# Everything that does not depend on the instance: the element pairs and the two phases of a CTA.
DIRECT_KERNEL = """\
namespace relax_cutlass_dw {

// A channel pair of one 16-bit element type, read and written as one 32-bit word, summed as float2.
template <typename E>
struct Pair;

template <>
struct Pair<__half> {
  static __host__ __device__ float2 load(const void* at) { return __half22float2(*static_cast<const __half2*>(at)); }
  static __host__ __device__ void store(void* at, float2 v) { *static_cast<__half2*>(at) = __float22half2_rn(v); }
  static __host__ __device__ float scalar(const void* base, int i) {
    return __half2float(static_cast<const __half*>(base)[i]);
  }
};

template <>
struct Pair<__nv_bfloat16> {
  static __host__ __device__ float2 load(const void* at) {
    return __bfloat1622float2(*static_cast<const __nv_bfloat162*>(at));
  }
  static __host__ __device__ void store(void* at, float2 v) {
    *static_cast<__nv_bfloat162*>(at) = __float22bfloat162_rn(v);
  }
  static __host__ __device__ float scalar(const void* base, int i) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  }
};

// The compile-time shape of one kernel: filter R x S, stride SH x SW (dilation 1), a CTA's output
// tile TP x TQ of G channels, each thread's block PT x QT of one channel pair.
template <int R_, int S_, int SH_, int SW_, int TP_, int TQ_, int G_, int PT_, int QT_>
struct Shape {
  static constexpr int R = R_, S = S_, SH = SH_, SW = SW_, TP = TP_, TQ = TQ_, G = G_, PT = PT_, QT = QT_;
  static constexpr int kHaloRows = (TP - 1) * SH + R;  // input rows a CTA reads
  static constexpr int kHaloCols = (TQ - 1) * SW + S;
  static constexpr int kVectors = G / 8;                // 128-bit vectors per halo pixel
  static constexpr int kHaloVectors = kHaloRows * kHaloCols * kVectors;
  static constexpr int kPairs = G / 2;
  static constexpr int kThreads = kPairs * (TP / PT) * (TQ / QT);
  static constexpr int kWindowRows = (PT - 1) * SH + R;  // input rows one thread reads
  static constexpr int kWindowCols = (QT - 1) * SW + S;
  static_assert(G % 8 == 0 && TP % PT == 0 && TQ % QT == 0, "tile shape");
  static_assert(kHaloVectors * 16 <= 48 * 1024, "the input halo must fit 48 KB of static shared memory");
};

// What the kernel takes at run time (the batch, the sizes the glue checked, the padding).
struct Params {
  int n, h, w, c, p, q, pad_h, pad_w, tiles_p, tiles_q;
  const void* data;    // (N, H, W, C)
  const void* weight;  // (C, R, S, 1)
  const void* bias;    // C, or nullptr
  void* out;           // (N, P, Q, C)
};

// Phase 1 (every thread of the CTA, then a barrier): the input halo of CTA (tile, group) into
// `halo`, laid out [row][col][G channels], zero outside the image and past the last channel.
template <typename Sh>
__host__ __device__ inline void LoadHalo(const Params& prm, int tile, int group, int thread, uint4* halo) {
  const int tq = tile % prm.tiles_q;
  const int tp = (tile / prm.tiles_q) % prm.tiles_p;
  const int image = tile / (prm.tiles_q * prm.tiles_p);
  const int h0 = tp * Sh::TP * Sh::SH - prm.pad_h;
  const int w0 = tq * Sh::TQ * Sh::SW - prm.pad_w;
  const uint4* data = static_cast<const uint4*>(prm.data);
#if defined(__CUDA_ARCH__)
#pragma unroll 4
#endif
  for (int i = thread; i < Sh::kHaloVectors; i += Sh::kThreads) {
    const int vector = i % Sh::kVectors;
    const int pixel = i / Sh::kVectors;
    const int h = h0 + pixel / Sh::kHaloCols;
    const int w = w0 + pixel % Sh::kHaloCols;
    const int c = group * Sh::G + vector * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (h >= 0 && h < prm.h && w >= 0 && w < prm.w && c < prm.c) {
      value = data[(((image * prm.h + h) * prm.w + w) * prm.c + c) / 8];
    }
    halo[i] = value;
  }
}

// Phase 2: thread `thread`'s channel pair and PT x QT output block, from the halo, with the epilogue.
template <typename Sh, typename E, bool kBias, typename Act>
__host__ __device__ inline void ComputeBlock(const Params& prm, int tile, int group, int thread, const uint4* halo) {
  const int pair = thread % Sh::kPairs;
  const int strip = thread / Sh::kPairs;
  const int strip_q = strip % (Sh::TQ / Sh::QT);
  const int strip_p = strip / (Sh::TQ / Sh::QT);
  const int c = group * Sh::G + 2 * pair;
  if (c >= prm.c) return;  // the last group's channels past C: loaded as zeros, never written
  const int tq = tile % prm.tiles_q;
  const int tp = (tile / prm.tiles_q) % prm.tiles_p;
  const int image = tile / (prm.tiles_q * prm.tiles_p);

  float2 taps[Sh::R * Sh::S];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < Sh::R * Sh::S; ++k) {
    taps[k] = make_float2(Pair<E>::scalar(prm.weight, c * Sh::R * Sh::S + k),
                          Pair<E>::scalar(prm.weight, (c + 1) * Sh::R * Sh::S + k));
  }
  float2 acc[Sh::PT][Sh::QT];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < Sh::PT; ++i) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < Sh::QT; ++j) acc[i][j] = make_float2(0.f, 0.f);
  }

  // The thread's window starts at halo row strip_p * PT * SH, column strip_q * QT * SW; window row
  // `row` holds tap r of output row i where row == i * SH + r.
  const __half* channels = reinterpret_cast<const __half*>(halo);  // 16-bit elements, any type
  const int first_row = strip_p * Sh::PT * Sh::SH;
  const int first_col = strip_q * Sh::QT * Sh::SW;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int row = 0; row < Sh::kWindowRows; ++row) {
    float2 in[Sh::kWindowCols];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int col = 0; col < Sh::kWindowCols; ++col) {
      in[col] = Pair<E>::load(channels + ((first_row + row) * Sh::kHaloCols + first_col + col) * Sh::G + 2 * pair);
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < Sh::PT; ++i) {
      const int r = row - i * Sh::SH;
      if (r < 0 || r >= Sh::R) continue;  // resolved at compile time once unrolled
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int s = 0; s < Sh::S; ++s) {
        const float2 tap = taps[r * Sh::S + s];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
        for (int j = 0; j < Sh::QT; ++j) {
          acc[i][j].x = fmaf(in[j * Sh::SW + s].x, tap.x, acc[i][j].x);
          acc[i][j].y = fmaf(in[j * Sh::SW + s].y, tap.y, acc[i][j].y);
        }
      }
    }
  }

  float2 bias = make_float2(0.f, 0.f);
  if (kBias) bias = Pair<E>::load(static_cast<const E*>(prm.bias) + c);
  Act act;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < Sh::PT; ++i) {
    const int p = tp * Sh::TP + strip_p * Sh::PT + i;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < Sh::QT; ++j) {
      const int q = tq * Sh::TQ + strip_q * Sh::QT + j;
      if (p < prm.p && q < prm.q) {
        const float2 v = make_float2(act(acc[i][j].x + bias.x), act(acc[i][j].y + bias.y));
        Pair<E>::store(static_cast<E*>(prm.out) + (((image * prm.p + p) * prm.q + q) * prm.c + c), v);
      }
    }
  }
}

template <typename Sh, typename E, bool kBias, typename Act>
__global__ void __launch_bounds__(Sh::kThreads) DepthwiseDirect(const Params prm) {
  __shared__ uint4 halo[Sh::kHaloVectors];
  LoadHalo<Sh>(prm, blockIdx.x, blockIdx.y, threadIdx.x, halo);
  __syncthreads();
  ComputeBlock<Sh, E, kBias, Act>(prm, blockIdx.x, blockIdx.y, threadIdx.x, halo);
}

}  // namespace relax_cutlass_dw
"""

# One kernel configuration -> one object exporting `<name>_run` (and, built with
# RELAX_CUTLASS_DW_EMULATE, `<name>_emulate`, the same phases run on the host over host memory).
DIRECT_TU = Template(
    """\
// relax_cutlass generated kernel: $name
"""
    + KERNEL_PRELUDE
    + """\
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
$includes

$args
namespace {
$definitions
$kernel
using Sh = relax_cutlass_dw::Shape<$r, $s, $stride_h, $stride_w, $tile_p, $tile_q, $groups, $rows_per_thread,
                                   $cols_per_thread>;
using Element = $element;
using Act = $activation;
constexpr bool kBias = $bias;

$check_device
const char* Message(const char* format, long long a, long long b) {
  static thread_local char message[512];
  std::snprintf(message, sizeof(message), format, a, b);
  return message;
}

// The run-time problem against what this kernel was compiled for; fills `prm`.
const char* MakeParams(const RelaxCutlassDwConv2dArgs* p, relax_cutlass_dw::Params* prm) {
  if (p->r != Sh::R || p->s != Sh::S) return Message("$name: built for a $r x $s filter, got %lld x %lld", p->r, p->s);
  if (p->stride_h != Sh::SH || p->stride_w != Sh::SW) {
    return Message("$name: built for stride $stride_h x $stride_w, got %lld x %lld", p->stride_h, p->stride_w);
  }
  if (p->dilation_h != 1 || p->dilation_w != 1) {
    return Message("$name: built for dilation 1, got %lld x %lld", p->dilation_h, p->dilation_w);
  }
  if (p->c % 8 != 0) {
    return Message("$name: C=%lld is not a multiple of 8 (%lld-channel tiles, 128-bit loads)", p->c, Sh::G);
  }
  const int tiles_p = (p->p + Sh::TP - 1) / Sh::TP, tiles_q = (p->q + Sh::TQ - 1) / Sh::TQ;
  if (static_cast<long long>(p->n) * tiles_p * tiles_q > INT_MAX) {
    return Message("$name: batch %lld gives more than 2^31 - 1 tiles of %lld pixels; split the batch", p->n,
                   Sh::TP * Sh::TQ);
  }
  *prm = {p->n, p->h, p->w, p->c, p->p, p->q, p->pad_h, p->pad_w, tiles_p, tiles_q,
          p->data, p->weight, kBias ? p->bias : nullptr, p->out};
  return nullptr;
}
}  // namespace

// Returns nullptr on success, else a message that names the failing step.
extern "C" __attribute__((visibility("default"))) const char* ${name}_run(
    const RelaxCutlassDwConv2dArgs* p, void* stream_handle) {
  if (const char* error = CheckDevice()) return error;
  relax_cutlass_dw::Params prm;
  if (const char* error = MakeParams(p, &prm)) return error;
  if (prm.n == 0) return nullptr;
  const dim3 grid(prm.n * prm.tiles_p * prm.tiles_q, (prm.c + Sh::G - 1) / Sh::G);
  relax_cutlass_dw::DepthwiseDirect<Sh, Element, kBias, Act>
      <<<grid, Sh::kThreads, 0, static_cast<cudaStream_t>(stream_handle)>>>(prm);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    static thread_local char message[512];
    std::snprintf(message, sizeof(message), "$name: %s failed (CUDA: %s)", "kernel launch", cudaGetErrorString(error));
    return message;
  }
  return nullptr;
}

#ifdef RELAX_CUTLASS_DW_EMULATE
// The kernel's two phases on the host, over host pointers: every CTA, each phase one thread after
// another (on the device a barrier separates them, and no thread reads what another writes in one).
extern "C" __attribute__((visibility("default"))) const char* ${name}_emulate(const RelaxCutlassDwConv2dArgs* p) {
  relax_cutlass_dw::Params prm;
  if (const char* error = MakeParams(p, &prm)) return error;
  uint4* halo = static_cast<uint4*>(std::malloc(sizeof(uint4) * Sh::kHaloVectors));
  const int groups = (prm.c + Sh::G - 1) / Sh::G;
  for (int tile = 0; tile < prm.n * prm.tiles_p * prm.tiles_q; ++tile) {
    for (int group = 0; group < groups; ++group) {
      for (int i = 0; i < Sh::kHaloVectors; ++i) halo[i] = make_uint4(0xdeadbeef, 0xdeadbeef, 0xdeadbeef, 0xdeadbeef);
      for (int t = 0; t < Sh::kThreads; ++t) relax_cutlass_dw::LoadHalo<Sh>(prm, tile, group, t, halo);
      for (int t = 0; t < Sh::kThreads; ++t) {
        relax_cutlass_dw::ComputeBlock<Sh, Element, kBias, Act>(prm, tile, group, t, halo);
      }
    }
  }
  std::free(halo);
  return nullptr;
}
#endif
"""
)
