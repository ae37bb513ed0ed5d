"""C++ of the norm kind: its kernel ABI, the row-wise kernel's translation unit and a region's glue.

The kernel is written here rather than taken from CUTLASS: cutlass/util/device_layernorm.h
hard-codes epsilon = 1e-5, has no RMSNorm, no residual add and one output, so it cannot run these
regions as they are. Its reductions are CUTLASS's (warpReduceSum / blockReduceSum of
cutlass/util/device_utils.h)."""

from __future__ import annotations

from string import Template

from ...toolkit.templates import GLUE_FUNCTION_HEAD, GLUE_FUNCTION_TAIL, KERNEL_PRELUDE

ARGS_TYPE = "RelaxCutlassNormArgs"
ARGS = """\
struct RelaxCutlassNormArgs {
  int64_t rows, n;                // n: the normalized size the kernel was built for
  const void* data;               // (rows, n)
  const void* residual;           // (rows, n), or nullptr (no residual add)
  const void* gamma;              // n elements, or nullptr
  const void* beta;               // n elements, or nullptr
  void* sum;                      // (rows, n) data + residual, or nullptr (not an output)
  void* norm;                     // (rows, n) the norm before the cast, or nullptr (not an output)
  void* out;                      // (rows, n)
};
"""

CTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"}

KERNEL_TU = Template(
    """\
// relax_cutlass generated kernel: $name
"""
    + KERNEL_PRELUDE
    + """\
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "cutlass/util/device_utils.h"
$pdl_switch
$pdl_device
$args
namespace {
$check_device
// sm_90 and later: launched as a programmatic dependent (PDL), like the SM90 GEMMs around it, so that
// it is scheduled while the kernel before it drains, and lets the next one be scheduled early
constexpr bool kPdl = $pdl;
using TData = $data_t;
using TResidual = $residual_t;
using TSum = $sum_t;
using TGamma = $gamma_t;
using TBeta = $beta_t;
using TNorm = $norm_t;
using TOut = $out_t;
constexpr bool kResidual = $residual;
constexpr bool kRms = $rms;
constexpr bool kScale = $scale;
constexpr bool kCenter = $center;
constexpr float kEpsilon = $epsilon;
constexpr int kN = $n;
constexpr int kVec = $vec;                // elements per vector access
constexpr int kRowThreads = $row_threads;  // threads per row: 32 = a warp per row
constexpr int kBlock = $block;
constexpr int kRowsPerBlock = kBlock / kRowThreads;
constexpr int kVectors = $vectors;        // vectors of the row each thread holds in registers

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T FromFloat(float v);
template <> __device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <> __device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
// v rounded to T (the graph's value of a T tensor), back in float32
template <typename T> __device__ __forceinline__ float Round(float v) { return ToFloat(FromFloat<T>(v)); }

// The widest access (128 bits where the vector has them) that divides kVec elements of T.
template <int kBytes> struct Chunk { using type = uint4; };
template <> struct Chunk<8> { using type = uint2; };
template <> struct Chunk<4> { using type = unsigned; };
template <> struct Chunk<2> { using type = unsigned short; };
template <typename T> struct Access {
  static constexpr int kBytes = kVec * sizeof(T) >= 16 ? 16 : kVec * sizeof(T);
  using type = typename Chunk<kBytes>::type;
  static constexpr int kCount = kVec * sizeof(T) / kBytes;
};

template <typename T> __device__ __forceinline__ void Load(const void* base, int64_t offset, float* out) {
  using A = Access<T>;
  alignas(16) T values[kVec];
  const auto* from = reinterpret_cast<const typename A::type*>(static_cast<const T*>(base) + offset);
#pragma unroll
  for (int c = 0; c < A::kCount; ++c) reinterpret_cast<typename A::type*>(values)[c] = from[c];
#pragma unroll
  for (int i = 0; i < kVec; ++i) out[i] = ToFloat(values[i]);
}

template <typename T> __device__ __forceinline__ void Store(void* base, int64_t offset, const float* in) {
  using A = Access<T>;
  alignas(16) T values[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) values[i] = FromFloat<T>(in[i]);
  auto* to = reinterpret_cast<typename A::type*>(static_cast<T*>(base) + offset);
#pragma unroll
  for (int c = 0; c < A::kCount; ++c) to[c] = reinterpret_cast<const typename A::type*>(values)[c];
}

// The sum over the row's threads, in every one of them. (CUTLASS's blockReduceSum leaves the total
// in the first warp only: thread 0 hands it to the others through shared memory.)
__device__ __forceinline__ float RowSum(float v) {
  if constexpr (kRowThreads == 32) {
    warpReduceSum<float, 1>(&v);
  } else {
    __shared__ float total;
    blockReduceSum<float, 1>(&v);
    if (threadIdx.x == 0) total = v;
    __syncthreads();
    v = total;
    __syncthreads();  // every thread has read it (and blockReduceSum's shared memory) before reuse
  }
  return v;
}

__global__ void __launch_bounds__(kBlock) NormKernel(RelaxCutlassNormArgs a) {
  PdlWaitForPrerequisites();  // before any global memory access (a no-op without PDL)
  const int lane = threadIdx.x % kRowThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
  if (kRowThreads == 32 && row >= a.rows) return;  // a whole warp: its row is past the end
  const int64_t base = row * kN;
  float x[kVectors][kVec];
  float total = 0.f;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int col = (v * kRowThreads + lane) * kVec;
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[v][i] = 0.f;
    if (col < kN) {
      Load<TData>(a.data, base + col, x[v]);
      if constexpr (kResidual) {
        float r[kVec];
        Load<TResidual>(a.residual, base + col, r);
#pragma unroll
        for (int i = 0; i < kVec; ++i) x[v][i] = Round<TSum>(x[v][i] + r[i]);
        if (a.sum != nullptr) Store<TSum>(a.sum, base + col, x[v]);
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) total += x[v][i];
    }
  }
  PdlLetDependentsLaunch();  // the row is in registers: the rest is arithmetic and stores
  // Two passes over the registers: the mean, then the mean square of (x - mean) (x for RMSNorm).
  const float mean = kRms ? 0.f : RowSum(total) / kN;
  float squares = 0.f;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    if ((v * kRowThreads + lane) * kVec < kN) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) squares += (x[v][i] - mean) * (x[v][i] - mean);
    }
  }
  const float rstd = rsqrtf(RowSum(squares) / kN + kEpsilon);
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int col = (v * kRowThreads + lane) * kVec;
    if (col >= kN) continue;
    float y[kVec], g[kVec], b[kVec];
    if constexpr (kScale) Load<TGamma>(a.gamma, col, g);
    if constexpr (kCenter) Load<TBeta>(a.beta, col, b);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float value = (x[v][i] - mean) * rstd;
      if constexpr (kScale) value *= g[i];
      if constexpr (kCenter) value += b[i];
      y[i] = Round<TNorm>(value);
    }
    if (a.norm != nullptr) Store<TNorm>(a.norm, base + col, y);
    Store<TOut>(a.out, base + col, y);
  }
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const char* ${name}_run(const ${args_type}* p, void* stream) {
  if (const char* error = CheckDevice()) return error;
  if (const char* error = PdlSettingError()) return error;
  if (p->n != kN) return "$name: called with another normalized size than it was built for";
  if (p->rows == 0) return nullptr;
  const int64_t blocks = (p->rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (blocks > 2147483647LL) return "$name: too many rows for one launch";
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kBlock);
  config.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = pdl;
  config.numAttrs = kPdl && LaunchWithPdl(config.stream) ? 1 : 0;
  if (cudaLaunchKernelEx(&config, NormKernel, *p) != cudaSuccess) {
    cudaGetLastError();  // clear it: the error is this call's, not the next one's
    return "$name: kernel launch failed";
  }
  return nullptr;
}
"""
)

GLUE_FUNCTION = Template(
    GLUE_FUNCTION_HEAD
    + """\
  TRY(CheckDim(fn, "data's last dim (the normalized size)", data->ndim ? data->shape[data->ndim - 1] : 0, $n, data));
  const int64_t rows = Numel(data) / $n;
$shape_checks
  ${args_type} args{rows, $n, Data(data), $residual, $gamma, $beta, $sum, $norm, const_cast<void*>(Data(out))};
"""
    + GLUE_FUNCTION_TAIL
)
