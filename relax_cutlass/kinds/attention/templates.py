"""C++ of the fused attention kind: the kernel ABI, its translation unit and the glue function."""

from __future__ import annotations

from string import Template

from ...toolkit.templates import GLUE_FUNCTION_HEAD, GLUE_FUNCTION_TAIL, KERNEL_PRELUDE

ARGS_TYPE = "RelaxCutlassAttentionArgs"

# The ABI of fused attention kernels: sizes, and for q/k/v the element strides of the batch, row
# and head dimensions (the head dim itself is contiguous). The output is (B, S, N, V), packed.
# The optional additive bias (masks) comes last, so that callers without one leave it zero.
ATTENTION_ARGS = """\
struct RelaxCutlassAttentionArgs {
  int64_t batch, heads, seq_q, seq_kv, head_dim, head_dim_value;
  const void* q; int64_t q_stride_b, q_stride_s, q_stride_n;
  const void* k; int64_t k_stride_b, k_stride_s, k_stride_n;
  const void* v; int64_t v_stride_b, v_stride_s, v_stride_n;
  void* out;
  float scale;
  // Additive bias on the scores, or nullptr (kernels built with bias support only): (B, N, S, T)
  // in the q/k/v element type, read through these element strides (0: broadcast axis); the keys
  // are contiguous. 16-byte aligned, with seq_kv and every stride a multiple of 8.
  const void* bias; int64_t bias_stride_b, bias_stride_n, bias_stride_s;
  // What a row whose every score is -inf (every key masked) gives: 0 NaN (the softmax's 0/0),
  // 1 zeros (torch's safe softmax), 2 the mean of the values. Used with a bias only.
  int32_t masked_rows;
  // TVM's causal mask (relax.nn.attention's causal_mask): 0 none, 1 TopLeft, 2 BottomRight. Query
  // i sees key j iff j <= i + offset, offset 0 (TopLeft) or |seq_q - seq_kv| (BottomRight).
  int32_t causal;
  // Grouped-query attention: query head n reads key/value head n / kv_group, k and v having
  // heads / kv_group heads (their *_stride_n steps between those); 0 or 1: one kv head per head.
  int64_t kv_group;
};
"""


# Both attention kernel TUs' error message: the failing step and CUDA's last error.
FAIL_FUNCTION = """\
$check_device
const char* Fail(const char* step) {
  static thread_local char message[512];
  std::snprintf(message, sizeof(message), "$name: %s failed (CUDA: %s)", step,
                cudaGetErrorString(cudaGetLastError()));
  return message;
}
"""

# Both attention kernel TUs' fix-up of fully masked rows (after the kernel, on its stream): the
# mean over all seq_kv keys of one (batch, head)'s values (masked_rows 2; zeros otherwise) written
# into the rows `is_masked` picks among the first `rows`. Its CTA reads kFixColumns columns of V
# (blockIdx.y): 8 threads a key's columns, kFixThreads / 8 keys at a time, the partial sums added
# in shared memory, so V is read in coalesced rows by every SM at once (a thread a row, looping over
# the keys, took 55 us a call on the H200 for a left-padded Gemma-2 batch, 4 x 512, head dim 256).
MASKED_ROWS_MEAN = """\
constexpr int kFixColumns = 64, kFixThreads = 256;
template <typename T, typename IsMasked>
__device__ void WriteMaskedRowsMean(const RelaxCutlassAttentionArgs& a, int64_t b, int64_t n, int64_t rows,
                                    IsMasked is_masked) {
  constexpr int kKeysAtOnce = kFixThreads / 8;
  __shared__ float partial[kKeysAtOnce][kFixColumns];
  __shared__ float mean[kFixColumns];
  int any = 0;
  for (int64_t s = threadIdx.x; s < rows && !any; s += blockDim.x) any = is_masked(s);
  if (!__syncthreads_or(any)) return;
  const int64_t c0 = int64_t(blockIdx.y) * kFixColumns;
  const int64_t columns = a.head_dim_value - c0 < kFixColumns ? a.head_dim_value - c0 : kFixColumns;
  const int lane = threadIdx.x % 8, key = threadIdx.x / 8;
  if (a.masked_rows == 2) {
    const int64_t g = a.kv_group > 1 ? a.kv_group : 1;
    const T* v = static_cast<const T*>(a.v) + b * a.v_stride_b + (n / g) * a.v_stride_n + c0 + lane * 8;
    float sum[8] = {};
    for (int64_t t = key; t < a.seq_kv; t += kKeysAtOnce) {
      const T* row = v + t * a.v_stride_s;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (lane * 8 + j < columns) sum[j] += static_cast<float>(row[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) partial[key][lane * 8 + j] = sum[j];
  }
  __syncthreads();
  if (threadIdx.x < kFixColumns) {
    float total = 0.0f;
    if (a.masked_rows == 2) {
      for (int r = 0; r < kKeysAtOnce; ++r) total += partial[r][threadIdx.x];
      total /= static_cast<float>(a.seq_kv);
    }
    mean[threadIdx.x] = total;
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out) + (b * a.seq_q * a.heads + n) * a.head_dim_value + c0;  // (B, S, N, V)
  for (int64_t i = threadIdx.x; i < rows * kFixColumns; i += blockDim.x) {
    const int64_t s = i / kFixColumns, c = i % kFixColumns;
    if (c < columns && is_masked(s)) out[s * a.heads * a.head_dim_value + c] = static_cast<T>(mean[c]);
  }
}
"""


# One fused attention configuration -> one object exporting `<kernel>_run`: CUTLASS's
# examples/41 forward kernel (xFormers' memory-efficient attention), launched as its own
# example launches it.
ATTENTION_KERNEL_TU = Template(
    """\
// relax_cutlass generated kernel: $name
"""
    + KERNEL_PRELUDE
    + """\
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
#include "kernel_forward.h"

$attention_args
namespace {
// A TU-local kernel type, so no other library ever shares this kernel's symbols.
struct Attention : AttentionKernel<$element, cutlass::arch::Sm80, /*isAligned=*/$aligned,
                                   /*kQueriesPerBlock=*/$queries, /*kKeysPerBlock=*/$keys,
                                   /*kMaxK=*/$max_k, /*kSupportsDropout=*/false,
                                   /*kSupportsBias=*/$supports_bias> {};

// A row whose every score is -inf leaves the kernel as 0/0 = NaN, its logsumexp -inf. The graph
// gives zeros there (masked_rows 1, torch's safe softmax) or the mean of the values (2: a finite
// mask value swamped the scores, so the softmax of the row was uniform).
// The kernel loads bias rows 16 bytes at a time (its BiasLoader), so the bias's base and its
// batch / head / query-row strides must be whole vectors of 8 elements. Any other bias (a key
// count off a multiple of 8, typical of a sequence length that is only known at run time, or an
// offset view) is copied first into rows of keys rounded up to 8, zeros after the last key (keys
// past the end are masked by the kernel), each broadcast axis kept as one copy.
template <typename T>
__global__ void PadBiasRows(const T* src, int64_t stride_b, int64_t stride_n, int64_t stride_s, T* dst,
                            int64_t rows_b, int64_t rows_n, int64_t rows_s, int64_t keys, int64_t padded) {
  const int64_t total = rows_b * rows_n * rows_s * padded;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i % padded, s = i / padded % rows_s, n = i / padded / rows_s % rows_n;
    const int64_t b = i / padded / rows_s / rows_n;
    dst[i] = t < keys ? src[b * stride_b + n * stride_n + s * stride_s + t] : T(0.0f);
  }
}

// One call's stream-ordered scratch allocations (padded bias, output accumulator, logsumexp),
// freed on the stream however the call returns: after its launches, or on an early error.
class StreamScratch {
 public:
  explicit StreamScratch(cudaStream_t stream) : stream_(stream) {}
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    for (void* block : blocks_) {
      if (block != nullptr) cudaFreeAsync(block, stream_);
    }
  }
  // -> `bytes` of device memory, or nullptr if the allocation failed
  void* Allocate(size_t bytes) {
    void* block = nullptr;
    if (count_ == kMaxBlocks || cudaMallocAsync(&block, bytes, stream_) != cudaSuccess) return nullptr;
    blocks_[count_++] = block;
    return block;
  }

 private:
  static constexpr int kMaxBlocks = 3;
  cudaStream_t stream_;
  void* blocks_[kMaxBlocks] = {};
  int count_ = 0;
};

bool BiasIsVectorAligned(const RelaxCutlassAttentionArgs* a) {
  return reinterpret_cast<uintptr_t>(a->bias) % 16 == 0 && a->seq_kv % 8 == 0 && a->bias_stride_b % 8 == 0 &&
         a->bias_stride_n % 8 == 0 && a->bias_stride_s % 8 == 0;
}

"""
    + MASKED_ROWS_MEAN
    + """\
// A CTA per (batch, head) and kFixColumns value columns (blockIdx.x, .y), kFixThreads threads.
template <typename T>
__global__ void __launch_bounds__(kFixThreads) FixMaskedRows(RelaxCutlassAttentionArgs a, const float* lse,
                                                             int64_t lse_dim) {
  const int64_t b = blockIdx.x / a.heads, n = blockIdx.x % a.heads;
  // Grouped-query attention ran one launch per kv head, each writing (B, G) rows of logsumexp.
  const int64_t g = a.kv_group > 1 ? a.kv_group : 1;
  const float* row_lse = lse + (g > 1 ? ((n / g) * a.batch + b) * g + n % g : b * a.heads + n) * lse_dim;
  WriteMaskedRowsMean<T>(a, b, n, a.seq_q, [row_lse](int64_t s) { return row_lse[s] == -INFINITY; });
}

"""
    + FAIL_FUNCTION
    + """\
}  // namespace

// Returns nullptr on success, else a message that names the failing step.
extern "C" __attribute__((visibility("default"))) const char* ${name}_run(
    const RelaxCutlassAttentionArgs* a, void* stream_handle) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (const char* error = CheckDevice()) return error;
  using T = typename Attention::scalar_t;
  typename Attention::Params p;
  p.query_ptr = static_cast<T*>(const_cast<void*>(a->q));
  p.key_ptr = static_cast<T*>(const_cast<void*>(a->k));
  p.value_ptr = static_cast<T*>(const_cast<void*>(a->v));
  p.output_ptr = static_cast<T*>(a->out);
  p.logsumexp_ptr = nullptr;
  p.scale = a->scale;
  p.num_batches = static_cast<int32_t>(a->batch);
  p.num_heads = static_cast<int32_t>(a->heads);
  p.head_dim = static_cast<int32_t>(a->head_dim);
  p.head_dim_value = static_cast<int32_t>(a->head_dim_value);
  p.num_queries = static_cast<int32_t>(a->seq_q);
  p.num_keys = static_cast<int32_t>(a->seq_kv);
  // TVM's masks are xFormers' top-left one moved right by TVM's offset (xFormers' own bottom-right
  // offset, seq_kv - seq_q, differs from TVM's |seq_q - seq_kv| when seq_q > seq_kv).
  p.custom_mask_type = a->causal != 0 ? Attention::CausalFromTopLeft : Attention::NoCustomMask;
  if (a->causal == 2) {
    const int64_t offset = a->seq_q > a->seq_kv ? a->seq_q - a->seq_kv : a->seq_kv - a->seq_q;
    p.causal_diagonal_offset = static_cast<uint32_t>(offset);
  }
  p.q_strideB = a->q_stride_b;
  p.q_strideM = static_cast<int32_t>(a->q_stride_s);
  p.q_strideH = static_cast<int32_t>(a->q_stride_n);
  p.k_strideB = a->k_stride_b;
  p.k_strideM = static_cast<int32_t>(a->k_stride_s);
  p.k_strideH = static_cast<int32_t>(a->k_stride_n);
  p.v_strideB = a->v_stride_b;
  p.v_strideM = static_cast<int32_t>(a->v_stride_s);
  p.v_strideH = static_cast<int32_t>(a->v_stride_n);
  p.o_strideM = static_cast<int32_t>(a->head_dim_value * a->heads);
  StreamScratch scratch(stream);
  if (a->bias != nullptr) {
    if (!Attention::kSupportsBias) return "$name: this kernel was built without attention-bias support";
    p.attn_bias_ptr = static_cast<T*>(const_cast<void*>(a->bias));
    p.bias_strideB = a->bias_stride_b;
    p.bias_strideH = a->bias_stride_n;
    p.bias_strideM = static_cast<int32_t>(a->bias_stride_s);
    if (!BiasIsVectorAligned(a)) {
      const int64_t padded = (a->seq_kv + 7) / 8 * 8;
      const int64_t rows_b = a->bias_stride_b != 0 ? a->batch : 1, rows_n = a->bias_stride_n != 0 ? a->heads : 1;
      const int64_t rows_s = a->bias_stride_s != 0 ? a->seq_q : 1;
      const int64_t elements = rows_b * rows_n * rows_s * padded;
      // the bias in 16-byte rows (PadBiasRows)
      T* padded_bias = static_cast<T*>(scratch.Allocate(sizeof(T) * elements));
      if (padded_bias == nullptr) return Fail("padded bias allocation");
      const int blocks = static_cast<int>(elements / 256 + 1 < 4096 ? elements / 256 + 1 : 4096);
      PadBiasRows<T><<<blocks, 256, 0, stream>>>(static_cast<const T*>(a->bias), a->bias_stride_b, a->bias_stride_n,
                                                 a->bias_stride_s, padded_bias, rows_b, rows_n, rows_s, a->seq_kv,
                                                 padded);
      if (cudaPeekAtLastError() != cudaSuccess) return Fail("bias padding launch");
      p.attn_bias_ptr = padded_bias;
      p.bias_strideB = a->bias_stride_b != 0 ? rows_n * rows_s * padded : 0;
      p.bias_strideH = a->bias_stride_n != 0 ? rows_s * padded : 0;
      p.bias_strideM = static_cast<int32_t>(a->bias_stride_s != 0 ? padded : 0);
    }
  }
  if (a->kv_group > 1 && a->heads % a->kv_group != 0) return "$name: the heads are no multiple of kv_group";
  if (!Attention::check_supported(p)) return "$name: q/k/v or a stride is not aligned as the kernel needs";
  void* workspace = nullptr;
  if (Attention::kNeedsOutputAccumulatorBuffer) {
    const size_t bytes =
        sizeof(typename Attention::output_accum_t) * a->batch * a->seq_q * a->heads * a->head_dim_value;
    workspace = scratch.Allocate(bytes);
    if (workspace == nullptr) return Fail("output accumulator allocation");
    p.output_accum_ptr = static_cast<typename Attention::output_accum_t*>(workspace);
  }
  constexpr auto kernel = attention_kernel_batched_impl<Attention>;
  const int smem_bytes = sizeof(typename Attention::SharedStorage);
  if (smem_bytes > 0xc000) {
    // Per device: the opt-in to more than 48 KB of shared memory is a property of the context.
    static bool configured[64] = {};
    int device = 0;
    cudaGetDevice(&device);
    if (device >= 64 || !configured[device]) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess) {
        return Fail("shared memory opt-in");
      }
      if (device < 64) configured[device] = true;
    }
  }
  // Fully masked rows are found by their logsumexp (-inf), which the kernel then writes.
  float* lse = nullptr;
  const int64_t lse_dim = (a->seq_q + Attention::kAlignLSE - 1) / Attention::kAlignLSE * Attention::kAlignLSE;
  if (a->bias != nullptr && a->masked_rows != 0) {
    lse = static_cast<float*>(scratch.Allocate(sizeof(float) * a->batch * a->heads * lse_dim));
    if (lse == nullptr) return Fail("logsumexp allocation");
    p.logsumexp_ptr = lse;
  }
  // Grouped-query attention: one launch per kv head, over its group of query heads, which all
  // read it (head stride 0); one launch over every head otherwise.
  const int64_t group = a->kv_group > 1 ? a->kv_group : 1;
  const int64_t launches = group > 1 ? a->heads / group : 1;
  cudaError_t launched = cudaSuccess;
  for (int64_t i = 0; i < launches && launched == cudaSuccess; ++i) {
    typename Attention::Params launch = p;
    if (group > 1) {
      launch.num_heads = static_cast<int32_t>(group);
      launch.query_ptr += i * group * a->q_stride_n;
      launch.key_ptr += i * a->k_stride_n;
      launch.value_ptr += i * a->v_stride_n;
      launch.k_strideH = 0;
      launch.v_strideH = 0;
      launch.output_ptr += i * group * a->head_dim_value;
      if (a->bias != nullptr) launch.attn_bias_ptr += i * group * p.bias_strideH;
      if (workspace != nullptr) launch.output_accum_ptr += i * a->batch * a->seq_q * group * a->head_dim_value;
      if (lse != nullptr) launch.logsumexp_ptr = lse + i * a->batch * group * lse_dim;
    }
    kernel<<<launch.getBlocksGrid(), launch.getThreadsGrid(), smem_bytes, stream>>>(launch);
    launched = cudaPeekAtLastError();
  }
  if (launched == cudaSuccess && lse != nullptr) {
    const dim3 blocks(static_cast<unsigned>(a->batch * a->heads),
                      static_cast<unsigned>((a->head_dim_value + kFixColumns - 1) / kFixColumns));
    FixMaskedRows<T><<<blocks, kFixThreads, 0, stream>>>(*a, lse, lse_dim);
    launched = cudaPeekAtLastError();
  }
  if (launched != cudaSuccess) return Fail("kernel launch");
  return nullptr;
}
"""
)


ATTENTION_GLUE_FUNCTION = Template(
    GLUE_FUNCTION_HEAD
    + """\
$rank_checks
$sizes
$shape_checks
  TRY(CheckDim(fn, "output elements", Numel(out), batch * seq_q * $heads * $head_dim_value, out));
  if (batch == 0 || seq_q == 0) return 0;
  if (seq_kv == 0) {
    return Raise("ValueError", "%s: attention over zero keys (shape %s) is undefined", fn, ShapeStr(key).text);
  }
  if (batch > 65535 || Numel(query) > INT32_MAX || Numel(key) > INT32_MAX || Numel(value) > INT32_MAX) {
    return Raise("ValueError", "%s: batch %lld or a q/k/v tensor of over 2^31 elements is past the fused attention "
                 "kernel's 32-bit row strides and grid; split the batch", fn, static_cast<long long>(batch));
  }
  RelaxCutlassAttentionArgs args{batch, $heads, seq_q, seq_kv, $head_dim, $head_dim_value,
      $operands,
      const_cast<void*>(Data(out)), ${scale}${bias}};
  args.causal = $causal;
  args.kv_group = $kv_group;
"""
    + GLUE_FUNCTION_TAIL
)
