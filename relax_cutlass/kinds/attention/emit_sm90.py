"""C++ of the attention kind's SM90 family: CUTLASS examples/88's Hopper FMHA forward kernel (TMA
loads, wgmma, warp-specialized cooperative or ping-pong consumers, online softmax), shipped in the
nvidia-cutlass wheel. Its collective mainloop and kernel are used as the example's `FmhaBuilder`
assembles them, with two pieces of ours:

  * the mask (`RelaxMask`, the example's `Fusion` customization point): keys past seq_kv of the
    last, partial key tile (what the example's ResidualFusion does; its DefaultFusion would let
    TMA's zero-filled keys into the softmax), and for causal attention TVM's mask (key j is seen
    by query i iff j <= i + offset; offset 0 for "TopLeft", |seq_q - seq_kv| for "BottomRight").
    The example's CausalFusion is TopLeft and leaves residual keys in when seq_q > seq_kv;
  * the epilogue: the example's FmhaFwdEpilogue without its logsumexp store (relax_cutlass has
    no use for it, and it would need a B*N*S float buffer per call).

Kernels that modify the scores (an additive bias, logit soft-capping) run the example's mainloop
with a score step of ours on every key tile (`BIAS_MAINLOOP`).
Grouped-query kernels wrap either mainloop in `GROUPED_MAINLOOP`: one launch over every (batch,
query head), each CTA loading its query head's kv head.

The softmax scale is the example's 1/sqrt(head dim) unless set: the glue overwrites it in the
kernel's Params after `to_underlying_arguments`.
"""

from __future__ import annotations

from string import Template

from ...arch import smem_limit
from ...toolkit.compile import Source
from ...toolkit.dtypes import CUTLASS_ELEMENT
from ...toolkit.glue import check_device
from ...toolkit.literals import cxx_float
from ...toolkit.templates import KERNEL_PRELUDE, PDL_DEVICE, pdl_switch
from ...toolkit.toolchain import package_dir
from .records import CAUSAL_CODE, AttentionKernel
from .templates import ATTENTION_ARGS, FAIL_FUNCTION, MASKED_ROWS_MEAN

# schedule -> (the example's kernel options, its tile scheduler). "pingpong" is what the
# example's builder makes of KernelTmaWarpSpecializedPingpong: the cooperative kernel, persistent,
# with Q loaded by its own producer warp. The "_locked" schedules add the example's
# kIsMainloopLocked option: the consumer warp groups take turns at the softmax (an ordered
# barrier around it), so one group's softmax runs while the other's GEMMs do, FlashAttention 3's
# inter-warpgroup ping-pong; profiling decides whether that pays on a problem.
_PERSISTENT = (
    ", cutlass::fmha::kernel::Option<cutlass::fmha::kernel::Tag::kIsPersistent, cute::true_type>"
    ", cutlass::fmha::kernel::Option<cutlass::fmha::kernel::Tag::kLoadsQSeparately, cute::true_type>"
)
_LOCKED = ", cutlass::fmha::kernel::Option<cutlass::fmha::kernel::Tag::kIsMainloopLocked, cute::true_type>"
SM90_SCHEDULES = {
    "cooperative": ("", "cutlass::fmha::kernel::IndividualTileScheduler"),
    "pingpong": (_PERSISTENT, "cutlass::fmha::kernel::PersistentTileScheduler"),
    "cooperative_locked": (_LOCKED, "cutlass::fmha::kernel::IndividualTileScheduler"),
    "pingpong_locked": (_PERSISTENT + _LOCKED, "cutlass::fmha::kernel::PersistentTileScheduler"),
}

# Causal attention's query blocks do unequal work (block m of a TopLeft mask reads m + 1 key
# tiles), and the example's schedulers hand them out in order, lightest first within each head: the
# last wave then holds the heaviest blocks and most SMs idle while they finish (seq 4096, head dim
# 128: 0.99x torch's sdpa on the H200). Causal kernels hand the blocks out heaviest first instead
# (longest-processing-time order, as FlashAttention 3's scheduler does), taking the (batch, head)
# pairs a section at a time, a section's keys and values filling at most half of the L2, so the
# blocks running together still share them. `RelaxCausalOrder` is plain C++ (the CPU tests compile
# it with the host compiler and check that it visits every block once).
CAUSAL_ORDER = """\
// Block `index` of `m_blocks` query blocks x `pairs` (batch, head) pairs, `section` pairs at a
// time: within a section the query blocks from the last (the heaviest, causal) to the first, the
// section's pairs fastest.
struct RelaxCausalOrder {
  int m_block;
  int pair;
};
CUTLASS_HOST_DEVICE RelaxCausalOrder relax_causal_order(int index, int m_blocks, int pairs, int section) {
  const int section_blocks = section * m_blocks;
  const int first = index / section_blocks * section;
  const int rest = index - first * m_blocks;
  const int size = pairs - first < section ? pairs - first : section;
  return {m_blocks - 1 - rest / size, first + rest % size};
}
"""

CAUSAL_SCHEDULER = Template(
    """\
$order
// The example's IndividualTileScheduler (kPersistent false: one block per CTA) or
// PersistentTileScheduler (true: a CTA per SM, striding over the blocks), in RelaxCausalOrder.
template <bool kPersistent>
struct RelaxCausalTileScheduler {
  struct Params {
    int blocks;
    int m_blocks;
    int pairs;
    int heads;
    int section;
    int sm_count;
  };

  int index;
  Params params;

  CUTLASS_DEVICE RelaxCausalTileScheduler(Params const& p) : index(blockIdx.x), params(p) {}

  template <class ProblemSize, class ClusterShape, class TileShape>
  static Params to_underlying_arguments(ProblemSize const& problem_size, cutlass::KernelHardwareInfo hw_info,
                                        ClusterShape const& cluster_shape, TileShape const& tile_shape) {
    const int m_blocks = cutlass::round_up(cute::ceil_div(cute::get<2>(problem_size), cute::get<0>(tile_shape)),
                                           cute::size<0>(cluster_shape));
    const int pairs = cute::get<0>(problem_size) * cute::get<1>(problem_size);
    // The bytes of keys and values one pair reads (grouped-query pairs share their group's).
    // (the heads of a grouped-query group share theirs: the launch scales the section, SECTION_SHARING)
    int64_t pair_bytes = int64_t(cute::get<3>(problem_size)) * cute::get<4>(problem_size) * 2 * sizeof($element);
    static int l2_bytes[64] = {};
    const int device = hw_info.device_id;
    if (device >= 0 && device < 64 && l2_bytes[device] == 0 &&
        cudaDeviceGetAttribute(&l2_bytes[device], cudaDevAttrL2CacheSize, device) != cudaSuccess) {
      l2_bytes[device] = 0;
    }
    const int64_t l2 = device >= 0 && device < 64 && l2_bytes[device] > 0 ? l2_bytes[device] : (32 << 20);
    int64_t section = l2 / 2 / (pair_bytes > 0 ? pair_bytes : 1);
    section = section < 1 ? 1 : (section > pairs ? pairs : section);
    return Params{m_blocks * pairs, m_blocks, pairs, int(cute::get<1>(problem_size)), int(section),
                  hw_info.sm_count > 0 ? hw_info.sm_count : 1};
  }

  static dim3 get_grid_shape(Params const& params) {
    if constexpr (kPersistent) return dim3(params.blocks < params.sm_count ? params.blocks : params.sm_count, 1, 1);
    return dim3(params.blocks, 1, 1);
  }

  CUTLASS_DEVICE bool is_valid() { return index < params.blocks; }

  CUTLASS_DEVICE auto get_block_coord() {
    const RelaxCausalOrder at = relax_causal_order(index, params.m_blocks, params.pairs, params.section);
    return cute::make_coord(at.m_block, cute::_0{}, cute::make_coord(at.pair / params.heads, at.pair % params.heads));
  }

  CUTLASS_DEVICE RelaxCausalTileScheduler& operator++() {
    index += gridDim.x;
    return *this;
  }
};
"""
)
# The schedules of kernels with a bias: one (batch, head) block per CTA (the bias's rows are found
# from the CTA's blockIdx), in the example's order, causal or not.
SM90_BIAS_SCHEDULES = tuple(s for s, (options, _) in SM90_SCHEDULES.items() if "kIsPersistent" not in options)
# a persistent schedule's causal scheduler is persistent too
CAUSAL_SCHEDULERS = {
    schedule: f"RelaxCausalTileScheduler<{'true' if 'kIsPersistent' in options else 'false'}>"
    for schedule, (options, _) in SM90_SCHEDULES.items()
}

SM90_ATTENTION_TU = Template(
    """\
// relax_cutlass generated kernel: $name
"""
    + KERNEL_PRELUDE
    + """\
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <type_traits>
#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "collective/fmha_fusion.hpp"
#include "collective/fmha_collective_tma_warpspecialized.hpp"
#include "collective/fmha_epilogue.hpp"
#include "kernel/fmha_kernel_tma_warpspecialized.hpp"
#include "kernel/fmha_tile_scheduler.hpp"
#include "kernel/fmha_options.hpp"
#include "device/device_universal.hpp"
#include "cutlass/cluster_launch.hpp"
"""
    + pdl_switch("attention")
    + PDL_DEVICE
    + """\

$attention_args
namespace {
// (No `using namespace cute` here: nvcc then finds cute's anonymous namespace ambiguous with this one.)

// The example's Fusion customization point. Problem sizes are (B, H, Q, K, D); `index_qk` gives
// each score's absolute (query, key) position. kCausal: 0 none, 1 TopLeft, 2 BottomRight (TVM's
// relax.nn.attention: query i sees key j iff j <= i + offset, offset 0 / |Q - K|). Every kind
// also masks the keys past K of the last key tile. The kernel applies the mask to its first key
// tile and its last `get_masked_trip_count` ones: those must hold every tile that the diagonal or
// the end of the keys crosses.
template <int kCausal>
struct RelaxMask : cutlass::fmha::collective::DefaultFusion {
  template <class ProblemSize>
  CUTLASS_DEVICE static int offset(ProblemSize const& problem_size) {
    if constexpr (kCausal == 2) {
      int d = cute::get<2>(problem_size) - cute::get<3>(problem_size);
      return d < 0 ? -d : d;
    } else {
      return 0;
    }
  }

  template <class BlkCoord, class TileShape, class ProblemSize>
  CUTLASS_DEVICE int get_trip_count(BlkCoord const& blk_coord, TileShape const& tile_shape,
                                    ProblemSize const& problem_size) {
    int keys = cute::ceil_div(cute::get<3>(problem_size), cute::get<1>(tile_shape));
    if constexpr (kCausal == 0) {
      return keys;
    } else {
      // The last key any query of this block sees is (block end - 1) + offset.
      int seen = (cute::get<0>(blk_coord) + 1) * cute::get<0>(tile_shape) + offset(problem_size);
      int tiles = cute::ceil_div(seen, cute::get<1>(tile_shape));
      return tiles < keys ? tiles : keys;
    }
  }

  template <class BlkCoord, class TileShape, class ProblemSize>
  CUTLASS_DEVICE int get_masked_trip_count(BlkCoord const& blk_coord, TileShape const& tile_shape,
                                           ProblemSize const& problem_size) {
    // Non-causal: the last tile (the only one the end of the keys can cross). Causal: the
    // diagonal crosses at most ceil(BQ / BK) + 1 tiles, the last ones (the end of the keys, when
    // reached, is in the last).
    int masked = kCausal == 0 ? 1 : cute::ceil_div(cute::get<0>(tile_shape), cute::get<1>(tile_shape)) + 1;
    int trips = get_trip_count(blk_coord, tile_shape, problem_size);
    return masked < trips ? masked : trips;
  }

  template <class BlkCoord, class TileShape, class ProblemSize>
  CUTLASS_DEVICE int get_unmasked_trip_count(BlkCoord const& blk_coord, TileShape const& tile_shape,
                                             ProblemSize const& problem_size) {
    return get_trip_count(blk_coord, tile_shape, problem_size) -
           get_masked_trip_count(blk_coord, tile_shape, problem_size);
  }

  template <class AccQK, class IndexQK, class ProblemSize>
  CUTLASS_DEVICE void before_softmax(AccQK& acc_qk, IndexQK const& index_qk, ProblemSize const& problem_size) {
    const int keys = cute::get<3>(problem_size);
    const int diagonal = offset(problem_size);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(acc_qk); i++) {
      auto pos = index_qk(i);
      bool masked = cute::get<1>(pos) >= keys;
      if constexpr (kCausal != 0) masked = masked || cute::get<1>(pos) > cute::get<0>(pos) + diagonal;
      if (masked) acc_qk(i) = -INFINITY;
    }
  }
};

using Element = $element;
using TileShape = cute::Shape<cute::_${queries}, cute::_${keys}, cute::_${head_dim}>;
// (rows, head dim, (batch, heads)): the head dim contiguous, the rest any stride.
using RowStride = cute::tuple<int, cute::_1, cute::tuple<int, int>>;
RowStride MakeStride(int rows, int batch, int head) {
  return cute::make_stride(rows, cute::_1{}, cute::make_stride(batch, head));
}
// Grouped-query attention: every query head of a group reads its kv head (GroupedMainloop), so the
// repeat of keys and values is never written.
constexpr bool kGrouped = $grouped;
// c of logit soft-capping, c * tanh(scale * q.k) (Gemma-2), or 0: none (BIAS_MAINLOOP's score step).
constexpr float kSoftcap = $softcap;
${causal_scheduler}${mainloop}
// The example's forward epilogue (a TMA store of O) without its logsumexp store.
struct Epilogue : cutlass::fmha::collective::FmhaFwdEpilogue<Element, float, typename Mainloop::TileShapePV> {
  using Base = cutlass::fmha::collective::FmhaFwdEpilogue<Element, float, typename Mainloop::TileShapePV>;
  using CollectiveEpilogueTMA = typename Base::CollectiveEpilogueTMA;

  template <class Tile, class BlkCoord, class ResultTuple, class TiledMma, class ProblemShape>
  CUTLASS_DEVICE void operator()(Tile const& tile_shape, BlkCoord const& blk_coord, ResultTuple const& result,
                                 TiledMma const& tiled_mma, ProblemShape const& problem_size,
                                 typename Base::Params const& params, typename Base::LoadPipeline epi_load_pipeline,
                                 typename Base::TensorStorage& epi_tensor_storage) {
    auto acc = cute::get<0>(result);
    auto problem_size_o = cute::make_shape(cute::get<2>(problem_size), cute::get<4>(problem_size), cute::_,
                                     cute::make_shape(cute::get<0>(problem_size), cute::get<1>(problem_size)));
    CollectiveEpilogueTMA epilogue_tma(params.epilogue_TMA, epi_tensor_storage);
    using EpiStorePipeline = typename CollectiveEpilogueTMA::StorePipeline;
    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);
    typename CollectiveEpilogueTMA::LoadPipelineState epi_load_pipe_consumer_state;
    auto epi_store_pipe_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();
    auto [epi_load_pipe_consumer_state_next, epi_store_pipe_producer_state_next] = epilogue_tma.store(
        epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline, epi_store_pipe_producer_state,
        problem_size_o, tile_shape,
        cute::make_coord(cute::get<0>(blk_coord), cute::_0{}, cute::_, cute::get<2>(blk_coord)), acc, tiled_mma,
        threadIdx.x % cutlass::NumThreadsPerWarpGroup, epi_tensor_storage);
    epilogue_tma.store_tail(epi_load_pipeline, epi_load_pipe_consumer_state_next, epi_store_pipeline,
                            epi_store_pipe_producer_state_next);
  }
};

// A TU-local kernel type, so no other library ever shares this kernel's symbols.
struct Kernel : cutlass::fmha::kernel::FmhaKernelTmaWarpSpecialized<Mainloop, Epilogue, $scheduler$options> {};
using Operation = cutlass::device::Universal<Kernel>;
constexpr int kHeadDim = $head_dim;
// A kernel whose shared storage is more than a CTA may opt in to fails at its first launch (head
// dim 256's ping-pong kernels did on the H200): nvcc refuses it here instead, and the region stays
// in TVM with this message in the offload report.
static_assert(Kernel::SharedStorageSize <= $smem_limit,
              "$name needs more shared memory than a CTA may opt in to ($smem_limit bytes)");

// The example's device_kernel (what Operation::run launches) with griddepcontrol.wait ahead of the
// kernel's first global memory access, launched as a programmatic dependent (PDL) like the SM90
// GEMMs and norms around it: its CTAs are scheduled while the kernel before it drains. The
// example's kernel never signals its own dependents: they are scheduled as it exits.
template <class K>
__global__ void __launch_bounds__(K::MaxThreadsPerBlock, K::MinBlocksPerMultiprocessor)
    RelaxPdlKernel(CUTLASS_GRID_CONSTANT typename K::Params const params) {
  PdlWaitForPrerequisites();
  extern __shared__ char smem[];
  K op;
  op(params, smem);
}

// Operation::run's launch (CUTLASS's cluster launcher), of RelaxPdlKernel, with the PDL attribute
// unless RELAX_CUTLASS_PDL=0.
cutlass::Status Launch(typename Kernel::Params& params, cudaStream_t stream) {
  const dim3 cluster(cute::size<0>(typename Kernel::ClusterShape{}), cute::size<1>(typename Kernel::ClusterShape{}),
                     cute::size<2>(typename Kernel::ClusterShape{}));
  void* kernel_params[] = {&params};
  const cutlass::Status status = cutlass::ClusterLauncher::launch(
      Kernel::get_grid_shape(params), cluster, Kernel::get_block_shape(), Kernel::SharedStorageSize, stream,
      reinterpret_cast<const void*>(RelaxPdlKernel<Kernel>), kernel_params, LaunchWithPdl(stream));
  return cudaPeekAtLastError() == cudaSuccess ? status : cutlass::Status::kErrorInternal;  // Fail() reads it
}
constexpr int kCausal = $causal;
// Soft-capped scores get the softmax's scale 1: the kernel's score step computes
// kSoftcap * tanh(scale * q.k) (+ bias) itself.
constexpr bool kSoftmaxScaleIsOne = kSoftcap != 0.0f;
constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte aligned base and strides

"""
    + FAIL_FUNCTION
    + """\

$mean_rows_function
bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool FitsStride(int64_t s) { return s >= 0 && s <= INT32_MAX && s % kAlignment == 0; }
}  // namespace

// Returns nullptr on success, else a message that names the failing step or the unmet need.
extern "C" __attribute__((visibility("default"))) const char* ${name}_run(
    const RelaxCutlassAttentionArgs* a, void* stream_handle) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (const char* error = CheckDevice()) return error;
  if (const char* error = PdlSettingError()) return error;
$bias_check  if (a->causal != kCausal) return "$name: built for another causal mask than the call's";
  // A narrower head dim runs padded: TMA zero-fills Q's, K's and V's columns past it (they add
  // nothing to either product) and O's store stops at it (select.sm90_padded_head_dim).
  if (a->head_dim != a->head_dim_value || a->head_dim > kHeadDim || a->head_dim % kAlignment != 0) {
    return "$name: built for head dims up to $head_dim in 16-byte vectors (q/k and v alike)";
  }
  if (!(a->scale > 0.0f) || !std::isfinite(a->scale)) {
    return "$name: the SM90 attention kernel needs a positive finite scale";
  }
  // the scale the example's online softmax applies (exp2 of scale * log2(e) * (s - max))
  const float softmax_scale = kSoftmaxScaleIsOne ? 1.0f : a->scale;
  if (!Aligned(a->q) || !Aligned(a->k) || !Aligned(a->v) || !Aligned(a->out)) {
    return "$name: q, k, v and out must be 16-byte aligned (TMA)";
  }
  if (!FitsStride(a->q_stride_b) || !FitsStride(a->q_stride_s) || !FitsStride(a->q_stride_n) ||
      !FitsStride(a->k_stride_b) || !FitsStride(a->k_stride_s) || !FitsStride(a->k_stride_n) ||
      !FitsStride(a->v_stride_b) || !FitsStride(a->v_stride_s) || !FitsStride(a->v_stride_n)) {
    return "$name: every q/k/v stride must be a multiple of 16 bytes and below 2^31 elements (TMA)";
  }
  const int64_t o_row = a->heads * a->head_dim_value;
  if (a->batch > INT32_MAX || a->heads > 65535 || a->batch > 65535 || a->seq_q > INT32_MAX ||
      a->seq_kv > INT32_MAX || a->seq_q * o_row > INT32_MAX) {
    return "$name: batch, heads or sequence lengths past the kernel's 32-bit sizes and grid";
  }
  const int64_t group = a->kv_group > 1 ? a->kv_group : 1;
  if (kGrouped != (group > 1)) {
    return kGrouped ? "$name: built for grouped-query attention (kv_group > 1)"
                    : "$name: built for one key/value head per query head (kv_group 1)";
  }
  if (a->heads % group != 0) return "$name: the heads are no multiple of kv_group";
  auto i32 = [](int64_t x) { return static_cast<int>(x); };
  const int s = i32(a->seq_q), t = i32(a->seq_kv), dv_ = i32(a->head_dim_value), g = i32(group);
  const int qs = i32(a->q_stride_s), ks = i32(a->k_stride_s), vs = i32(a->v_stride_s);
  const int qn = i32(a->q_stride_n), kn = i32(a->k_stride_n), vn = i32(a->v_stride_n);
  // The kernel's (batch, heads) modes: every (batch, query head) in one launch (K and V over their
  // kv heads in a grouped kernel's mainloop).
  const RowStride dq = MakeStride(qs, i32(a->q_stride_b), qn);
  const RowStride dk = MakeStride(ks, i32(a->k_stride_b), kn);
  const RowStride dv = MakeStride(vs, i32(a->v_stride_b), vn);
  // The output is (B, S, N, V), packed.
  const RowStride d_o = MakeStride(i32(o_row), i32(a->seq_q * o_row), dv_);
  static int sm_counts[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Fail("cudaGetDevice");
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = device;
  if (device < 64 && sm_counts[device] == 0) {
    if (cudaDeviceGetAttribute(&sm_counts[device], cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return Fail("SM count query");
    }
  }
  hw_info.sm_count = device < 64 ? sm_counts[device] : 0;
  typename Kernel::Arguments args{
      {i32(a->batch), i32(a->heads), s, t, dv_},
      $mainloop_args,
      {static_cast<Element*>(a->out), d_o, nullptr, {}},
      hw_info};
  // The example's can_implement: the head dim fits the tile and is whole 16-byte vectors, and
  // seq_q a multiple of the alignment. That last clause is its own test setup's (a packed
  // logsumexp / BHSD tensor), not TMA's: TMA needs aligned strides (checked above), not extents,
  // and this epilogue stores no logsumexp. So it is asked with seq_q rounded up.
  typename Kernel::Arguments asked = args;
  cute::get<2>(asked.problem_size) = (s + kAlignment - 1) / kAlignment * kAlignment;
  if (Operation::can_implement(asked) != cutlass::Status::kSuccess) {
    return "$name: CUTLASS's can_implement refused the problem";
  }
  if (Operation::get_workspace_size(args) != 0) return "$name: the kernel asks for a workspace it was not given";
  const int smem_bytes = Kernel::SharedStorageSize;
  if (smem_bytes > 0xc000) {
    // Per device: the opt-in to more than 48 KB of shared memory is a property of the context.
    static bool configured[64] = {};
    if (device >= 64 || !configured[device]) {
      if (cudaFuncSetAttribute(RelaxPdlKernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) !=
          cudaSuccess) {
        return Fail("shared memory opt-in");
      }
      if (device < 64) configured[device] = true;
    }
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
  params.mainloop.scale_softmax = softmax_scale;
  params.mainloop.scale_softmax_log2 = softmax_scale * static_cast<float>(M_LOG2E);
$section_sharing  if (Launch(params, stream) != cutlass::Status::kSuccess) return Fail("kernel launch");
$mean_rows_launch  return nullptr;
}
"""
)


# Grouped-query attention in one launch over every (batch, query head): K and V have heads / group
# heads, so their TMA descriptors are made over (batch, kv heads), and the load warp reads query
# head h's kv head h / group: the example's load_kv_maybe_q with K's and V's problem size and
# block coordinate. (The kernel's (batch, heads) modes as (kv heads, group), a stride 0 over the
# group, need a launch per batch instead: a left-padded Llama batch of 4 x 512 ran 16 launches of
# 17 us, 0.27 of its 1.70 ms on the H200.)
GROUPED_MAINLOOP = """\
template <class Base, class Fusion>
struct GroupedMainloop : Base {
  struct Arguments : Base::Arguments {
    int group;
  };
  struct Params : Base::Params {
    int group;
  };

  template <class ProblemShape>
  CUTLASS_HOST_DEVICE static ProblemShape kv_problem(ProblemShape problem_size, int group) {
    cute::get<1>(problem_size) = cute::get<1>(problem_size) / group;
    return problem_size;
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_size, Arguments const& args, void* workspace) {
    Params params{Base::to_underlying_arguments(problem_size, args, workspace), args.group};
    auto kv = Base::to_underlying_arguments(kv_problem(problem_size, args.group), args, workspace);
    params.tma_load_k = kv.tma_load_k;
    params.tma_load_v = kv.tma_load_v;
    return params;
  }

  template <bool kLoadQ, class BlkCoord, class ProblemShape, class Pipeline, class PipelineState, class PipelineQ,
            class PipelineStateQ, class SharedStorage, class LoadWarpBarrier>
  CUTLASS_DEVICE void load_kv_maybe_q(int block_rank_in_cluster, BlkCoord const& blk_coord, Params const& params,
                                      ProblemShape const& problem_size, Pipeline& pipeline,
                                      PipelineState& smem_pipe_write, PipelineQ& pipeline_q,
                                      PipelineStateQ& smem_pipe_write_q, SharedStorage& storage,
                                      LoadWarpBarrier& load_warp_barrier, bool do_barrier) {
    using namespace cute;
    int fusion_tile_count = Fusion{}.get_trip_count(blk_coord, typename Base::TileShape{}, problem_size);
    int lane_predicate = cute::elect_one_sync();
    uint16_t mcast_mask_b = 0;
    if (lane_predicate == 1) {
      if constexpr (cute::is_same_v<typename Base::CollectiveMmaQK::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
        auto block_layout = Layout<typename Base::ClusterShape>{};  // (m,n) -> block_id
        for (int m = 0; m < size<0>(block_layout); ++m) {
          mcast_mask_b |= (uint16_t(1) << block_layout(m, _0{}, Int<0>{}));
        }
      }
    }

    auto q_tile_iter = cute::make_coord_iterator(Int<Base::NumMmaWarpGroups>{});
    [[maybe_unused]] int q_tile_count = Base::NumMmaWarpGroups;

    auto k_tile_iter = cute::make_coord_iterator(fusion_tile_count);
    int k_tile_count = 2 * fusion_tile_count;

    // K's and V's (batch, kv heads), and this CTA's place in them
    auto kv_size = kv_problem(problem_size, params.group);
    auto kv_coord = make_coord(get<0>(blk_coord), get<1>(blk_coord),
                               make_coord(get<2, 0>(blk_coord), get<2, 1>(blk_coord) / params.group));

    typename Base::LoadQ load_q{params.tma_load_q, pipeline_q, storage.smem_q};
    auto load_state_q =
        load_q.init_state(_0{}, problem_size, typename Base::TileShapeQK{}, blk_coord, Base::NumMmaWarpGroups);

    typename Base::LoadK load_k{params.tma_load_k, pipeline, storage.smem_k};
    auto load_state_k = load_k.init_state(block_rank_in_cluster, kv_size, typename Base::TileShapeQK{}, kv_coord,
                                          fusion_tile_count);

    typename Base::LoadV load_v{params.tma_load_v, pipeline, storage.smem_v};
    auto load_state_v = load_v.init_state(block_rank_in_cluster, kv_size, typename Base::TileShapePV{}, kv_coord,
                                          fusion_tile_count);

    if constexpr (kLoadQ) {
      load_q.step(q_tile_iter, load_state_q, smem_pipe_write_q, lane_predicate, q_tile_count);
    }

    load_k.template step<false>(k_tile_iter, load_state_k, smem_pipe_write, lane_predicate, k_tile_count, mcast_mask_b);

    if constexpr (kLoadQ) {
      load_q.step(q_tile_iter, load_state_q, smem_pipe_write_q, lane_predicate, q_tile_count);
    }

    if constexpr (!kLoadQ) {
      if (do_barrier) {
        load_warp_barrier.arrive();
        load_warp_barrier.wait(/*phase=*/0);
        do_barrier = false;
      }
    }

    load_v.template step<true>(k_tile_iter, load_state_v, smem_pipe_write, lane_predicate, k_tile_count, mcast_mask_b);

    if constexpr (kLoadQ) {
      while (q_tile_count > 0) {
        load_q.step(q_tile_iter, load_state_q, smem_pipe_write_q, lane_predicate, q_tile_count);
      }
    }

    CUTLASS_PRAGMA_NO_UNROLL
    while (k_tile_count > 0) {
      load_k.template step<false>(k_tile_iter, load_state_k, smem_pipe_write, lane_predicate, k_tile_count,
                                  mcast_mask_b);
      load_v.template step<true>(k_tile_iter, load_state_v, smem_pipe_write, lane_predicate, k_tile_count,
                                 mcast_mask_b);
    }
  }
};
"""

# The mainloop of a kernel without a bias: the example's, with RelaxMask.
PLAIN_MAINLOOP = Template(
    """\
using UngroupedMainloop = cutlass::fmha::collective::FmhaMainloopTmaWarpSpecialized<
    Element, float, float, TileShape, RowStride, RowStride, RowStride, RelaxMask<$causal>$options>;
using Mainloop = $mainloop;
"""
)
PLAIN_MAINLOOP_ARGS = """{static_cast<const Element*>(a->q), dq, static_cast<const Element*>(a->k), dk,
       static_cast<const Element*>(a->v), dv}"""

# A kernel with an additive bias on the scores (padding masks, position biases): the example's
# mainloop with three pieces of ours. Its softmax (CollectiveSoftmax, specialized for the
# RelaxBiasMask fusion) adds bias / scale to each raw q.k score before the example's online softmax
# (which scales the scores itself), reading the bias from global memory through the kernel's
# params, each key tile's bias loaded into registers while the tile before is computed;
# RelaxBiasMask sends every key tile through that step (the example's fusion runs on its
# masked tiles only); the mainloop's Arguments and Params carry the bias. The (batch, heads)
# modes of a CTA are its blockIdx.y and .z: the example's IndividualTileScheduler, which every bias
# kernel runs (SM90_BIAS_SCHEDULES).
# Masked scores: keys past the end and causally hidden ones as RelaxMask masks them, and -inf
# bias entries. A row whose every score is masked sums to 0, which the example's tail turns into
# zeros (masked_rows 1, torch's safe softmax); masked_rows 0 writes NaN there (the graph's 0/0);
# masked_rows 2 masks with a finite -2^100 instead of -inf, so such a row comes out uniform, the
# mean of the values (the swamping finite mask the graph held), and any other row is unchanged
# (exp2 of -2^100 below its maximum is 0). A power of two: the softmax computes
# exp2(fma(scale, s, -scale * max)), and scale * -2^100 is exact, so a row of masked scores gets
# exactly exp2(0); with -1e30 the product's rounding (up to 2^73) made it exp2(-2^73) = 0, a row of
# zeros instead of the mean (found on the H200 by a left-padded GPT-2 batch). A finite bias at or
# below -2^100 (a bfloat16 mask's minimum) gives the score -2^100 exactly for the same reason: its
# bias / scale at head dim 32 (1 / scale = 4 sqrt(2)) rounded, and the softmax's max subtraction
# then took exp2 of that rounding error (itself huge): a left-padded bfloat16 GPT-2 batch came out non-finite
# (found on the H200).
BIAS_MAINLOOP = Template(
    """\
struct RelaxBias {
  const Element* ptr;  // nullptr: no bias (a soft-capped kernel's call without one)
  int64_t stride_mode0, stride_mode1, stride_row;  // elements; the keys are contiguous
  float inv_scale;  // what the bias is multiplied by before the softmax scales the scores
  int masked_rows;  // the ABI's: 0 NaN, 1 zeros, 2 the mean of the values
  float softcap_scale;  // soft-capped kernels: the tanh's scale (the softmax's is then 1)
};

// kKeys: the keys per tile (the step between one key tile's scores and the next's).
template <int kCausal, int kKeys>
struct RelaxBiasMask : RelaxMask<kCausal> {
  template <class BlkCoord, class TileShape, class ProblemSize>
  CUTLASS_DEVICE int get_masked_trip_count(BlkCoord const& blk_coord, TileShape const& tile_shape,
                                           ProblemSize const& problem_size) {
    return this->get_trip_count(blk_coord, tile_shape, problem_size);
  }

  template <class BlkCoord, class TileShape, class ProblemSize>
  CUTLASS_DEVICE int get_unmasked_trip_count(BlkCoord const&, TileShape const&, ProblemSize const&) {
    return 0;
  }
};

template <class BaseParams>
struct RelaxBiasParams : BaseParams {
  RelaxBias bias;
};

using BaseMainloop = cutlass::fmha::collective::FmhaMainloopTmaWarpSpecialized<
    Element, float, float, TileShape, RowStride, RowStride, RowStride, RelaxBiasMask<$causal, $keys>$options>;

struct UngroupedMainloop : BaseMainloop {
  struct Arguments : BaseMainloop::Arguments {
    RelaxBias bias;
  };
  using Params = RelaxBiasParams<typename BaseMainloop::Params>;

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_size, Arguments const& args, void* workspace) {
    return Params{BaseMainloop::to_underlying_arguments(problem_size, args, workspace), args.bias};
  }
};
using Mainloop = $mainloop;
}  // namespace

namespace cutlass::fmha::collective {
template <class ElementAccumulator, int kCausal, int kKeys, class Params>
struct CollectiveSoftmax<ElementAccumulator, RelaxBiasMask<kCausal, kKeys>, Params>
    : CollectiveSoftmax<ElementAccumulator, DefaultFusion, Params> {
  using Base = CollectiveSoftmax<ElementAccumulator, DefaultFusion, Params>;
  using BaseParams = std::remove_cv_t<std::remove_reference_t<Params>>;
  // A consumer warp group's score tile is 64 query rows x kKeys keys over its 128 threads.
  static constexpr int kScores = 64 * kKeys / 128;
  // A finite bias at or below this swamps every score (a bfloat16 mask holds it for the float32
  // minimum, masks.BFLOAT16_SWAMPING_MASK): such scores are this value exactly, whatever the bias's
  // scaling rounded (bias / scale is not a power of two at most head dims), so a row of them stays
  // equal and comes out the mean of its values, as in the graph.
  static constexpr float kSwamping = -0x1p100f;

  // The bias of this thread's scores in the next key tile, loaded while this one is computed: two
  // 16-bit values a register (each in its own would spill).
  using Packed = cutlass::Array<Element, 2>;
  Packed next_[kScores / 2];

  CUTLASS_DEVICE CollectiveSoftmax(Params const& params) : Base(params) {}

  // The kernel's params are the bias mainloop's (RelaxBiasParams), seen here as its base's.
  CUTLASS_DEVICE RelaxBias const& bias() const {
    return static_cast<RelaxBiasParams<BaseParams> const&>(this->params).bias;
  }

  // The bias of this thread's scores `key_offset` keys after `index_qk`'s, from indices clamped
  // into the bias: no load is conditional, so they are all in flight at once. A null bias adds 0.
  template <class IndexQK, class ProblemShape>
  CUTLASS_DEVICE void load(Packed (&into)[kScores / 2], IndexQK const& index_qk, int key_offset,
                           ProblemShape const& problem_shape) {
    RelaxBias const& b = bias();
    if (b.ptr == nullptr) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kScores; i++) into[i / 2][i % 2] = Element(0.0f);
      return;
    }
    const int rows = cute::get<2>(problem_shape), keys = cute::get<3>(problem_shape);
    const Element* base = b.ptr + int64_t(blockIdx.y) * b.stride_mode0 + int64_t(blockIdx.z) * b.stride_mode1;
    if (b.stride_row == 0) {
      // One row for every query (a padding mask (B, 1, 1, T)): a thread's rows read the same keys,
      // so their loads are the same addresses, loaded once.
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kScores; i++) {
        into[i / 2][i % 2] = base[cute::min(int(cute::get<1>(index_qk(i))) + key_offset, keys - 1)];
      }
      return;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kScores; i++) {
      auto pos = index_qk(i);
      const int q = cute::min(int(cute::get<0>(pos)), rows - 1);
      const int k = cute::min(int(cute::get<1>(pos)) + key_offset, keys - 1);
      into[i / 2][i % 2] = base[q * b.stride_row + k];
    }
  }

  // Scores past the keys, causally hidden or with a -inf bias are masked; the others are
  // soft-capped (kSoftcap: kSoftcap * tanh(softcap_scale * q.k), the softmax's scale 1) and get
  // bias * inv_scale (bias / scale; the bias itself when soft-capped).
  template <class AccQK, class IndexQK, class ProblemShape>
  CUTLASS_DEVICE void add_bias(AccQK& acc_qk, Packed const (&values)[kScores / 2], IndexQK const& index_qk,
                               ProblemShape const& problem_shape) {
    static_assert(decltype(cute::size(acc_qk))::value == kScores, "a score tile of 64 x kKeys per warp group");
    RelaxBias const& b = bias();
    const int keys = cute::get<3>(problem_shape);
    const int diagonal = RelaxMask<kCausal>::offset(problem_shape);
    const float masked = b.masked_rows == 2 ? kSwamping : -INFINITY;
    const float inv_scale = b.inv_scale;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kScores; i++) {
      auto pos = index_qk(i);
      const int q = cute::get<0>(pos), k = cute::get<1>(pos);
      const float value = static_cast<float>(values[i / 2][i % 2]);
      const bool hidden = (kCausal != 0 && k > q + diagonal) || value == -INFINITY;
      float qk = acc_qk(i);
      if constexpr (kSoftcap != 0.0f) qk = kSoftcap * tanhf(qk * b.softcap_scale);
      // selects, not branches: every score takes the same instructions
      float score = fmaf(value, inv_scale, qk);
      score = value <= kSwamping ? kSwamping : score;
      score = hidden ? masked : score;
      acc_qk(i) = k >= keys ? -INFINITY : score;
    }
  }

  // The mainloop's first key tile: its bias loaded now, the next tile's prefetched.
  template <class AccQK, class TiledMmaQK, class CountQK, class State, class ProblemShape>
  CUTLASS_DEVICE auto step(AccQK& acc_qk, TiledMmaQK const& tiled_mma_qk, CountQK const& count_qk, State& state,
                           ProblemShape const& problem_shape) {
    Packed current[kScores / 2];
    load(current, count_qk, 0, problem_shape);
    load(next_, count_qk, kKeys, problem_shape);
    add_bias(acc_qk, current, count_qk, problem_shape);
    return Base::step(acc_qk, tiled_mma_qk, count_qk, state, problem_shape);
  }

  // Every later key tile (RelaxBiasMask sends them all here): the bias prefetched by the tile
  // before, the next tile's prefetched (past the last tile, clamped reads that are never used).
  template <bool kUseFusion = true, class AccQK, class TiledMmaQK, class CountQK, class State, class AccPV,
            class TiledMmaPV, class ProblemShape>
  CUTLASS_DEVICE auto step(AccQK& acc_qk, TiledMmaQK const& tiled_mma_qk, CountQK const& count_qk, State& state,
                           AccPV& acc_pv, TiledMmaPV const& tiled_mma_pv, ProblemShape const& problem_shape) {
    if constexpr (kUseFusion) {
      Packed current[kScores / 2];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kScores / 2; i++) current[i] = next_[i];
      load(next_, count_qk, kKeys, problem_shape);
      add_bias(acc_qk, current, count_qk, problem_shape);
    }
    return Base::template step<false>(acc_qk, tiled_mma_qk, count_qk, state, acc_pv, tiled_mma_pv, problem_shape);
  }

  template <class State, class AccPV, class TiledMmaPV>
  CUTLASS_DEVICE auto tail(State& state, AccPV& acc_pv, TiledMmaPV const& tiled_mma_pv) {
    auto lse = Base::tail(state, acc_pv, tiled_mma_pv);  // reduces the row sums in place
    if (bias().masked_rows == 0) {
      auto& a_sum = cute::get<1>(state);
      Tensor acc_mn = make_tensor(acc_pv.data(), layout_acc_mn(tiled_mma_pv, acc_pv.layout()));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<0>(acc_mn); i++) {
        if (a_sum(i) == 0.0f) {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size<1>(acc_mn); j++) acc_mn(i, j) = NAN;
        }
      }
    }
    return lse;
  }
};
}  // namespace cutlass::fmha::collective

namespace {
"""
)
# The bias mainloop's Arguments: the example's (the plain ones), then the bias.
BIAS_MAINLOOP_ARGS = (
    "{"
    + PLAIN_MAINLOOP_ARGS
    + """,
       RelaxBias{static_cast<const Element*>(a->bias), a->bias_stride_b, a->bias_stride_n, a->bias_stride_s,
                 kSoftmaxScaleIsOne ? 1.0f : 1.0f / a->scale, a->masked_rows,
                 a->scale}}"""
)
PLAIN_BIAS_CHECK = """\
  if (a->bias != nullptr) return "$name: the SM90 attention kernel takes no additive mask/bias";
"""
# (A null bias adds nothing: the profiler passes none, so where select.SM90_BIAS_FIRST makes bias
# kernels the heuristic's it times their schedules against each other without the bias's cost.)
BIAS_CHECK = """\
  if (a->masked_rows < 0 || a->masked_rows > 2) return "$name: masked_rows must be 0, 1 or 2";
"""
# A causal kernel's rows whose every key is masked by a finite mask (masked_rows 2, eager
# attention's finfo.min: the graph's softmax of such a row is uniform over all T keys) leave the
# kernel as the mean of the values of the keys its causal loop visited, which stops at the
# diagonal. With a mask that is one row of keys per (batch, head) (a padded batch's (B, 1, 1, T)),
# row i is such a row iff every key it sees (j <= i + offset) is masked, that is iff
# i + offset < f, f the row's first unmasked key (T where there is none): each CTA of a (batch,
# head) finds f and writes the mean of V over all T keys into those rows, after the kernel, on its
# stream (templates.MASKED_ROWS_MEAN; select.sm90_fixes_causal_mean_rows says where the heuristic
# relies on it).
# `relax_fully_masked_rows` is plain C++ (the CPU tests compile it with the host compiler and check
# it against every row's keys).
MEAN_ROWS_RULE = """\
// n, where rows 0 .. n - 1 of a (batch, head) are those whose every visible key (j <= i + offset) is
// masked, given the first unmasked key of its mask row (seq_kv: none, and every row is masked).
CUTLASS_HOST_DEVICE int64_t relax_fully_masked_rows(int64_t first, int64_t offset, int64_t seq_q, int64_t seq_kv) {
  if (first >= seq_kv || first - offset > seq_q) return seq_q;
  return first - offset > 0 ? first - offset : 0;
}
"""
MEAN_ROWS_FUNCTION = (
    MEAN_ROWS_RULE
    + MASKED_ROWS_MEAN
    + """\
template <typename T>
__global__ void __launch_bounds__(kFixThreads) FixCausalMeanRows(RelaxCutlassAttentionArgs a, int64_t offset) {
  const int64_t b = blockIdx.x / a.heads, n = blockIdx.x % a.heads;
  const T* bias = static_cast<const T*>(a.bias) + b * a.bias_stride_b + n * a.bias_stride_n;
  __shared__ int first;
  if (threadIdx.x == 0) first = static_cast<int>(a.seq_kv);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < a.seq_kv; j += blockDim.x) {
    if (static_cast<float>(bias[j]) > -0x1p100f) atomicMin(&first, static_cast<int>(j));  // not masked
  }
  __syncthreads();
  const int64_t masked = relax_fully_masked_rows(first, offset, a.seq_q, a.seq_kv);
  WriteMaskedRowsMean<T>(a, b, n, masked, [](int64_t) { return true; });
}
"""
)
MEAN_ROWS_CHECK = """\
  if (a->bias != nullptr && a->masked_rows == 2 && (a->bias_stride_s != 0 || a->batch * a->heads > INT32_MAX)) {
    return "$name: fully masked rows that give the mean of the values need a mask of one row of keys per "
           "(batch, head) beside the causal mask, and fewer than 2^31 (batch, head) pairs";
  }
"""
MEAN_ROWS_LAUNCH = """\
  if (a->bias != nullptr && a->masked_rows == 2) {
    const int64_t offset = kCausal == 2 ? (a->seq_q > a->seq_kv ? a->seq_q - a->seq_kv : a->seq_kv - a->seq_q) : 0;
    const dim3 blocks(static_cast<unsigned>(a->batch * a->heads),
                      static_cast<unsigned>((a->head_dim_value + kFixColumns - 1) / kFixColumns));
    FixCausalMeanRows<Element><<<blocks, kFixThreads, 0, stream>>>(*a, offset);
    if (cudaPeekAtLastError() != cudaSuccess) return Fail("masked-row fix-up launch");
  }
"""

# RelaxCausalTileScheduler's sections count a pair's keys and values as its own; the heads of a
# group share theirs, so a section of the L2 holds `group` times as many pairs.
SECTION_SHARING = """\
  if (g > 1) {
    const int64_t shared = int64_t(params.tile_scheduler.section) * g;
    const int64_t pairs = params.tile_scheduler.pairs;
    params.tile_scheduler.section = static_cast<int>(shared < pairs ? shared : pairs);
  }
"""


def sm90_fmha_dir():
    return package_dir("cutlass_library") / "source" / "examples" / "88_hopper_fmha"


def emit_sm90_attention_kernel(kernel: AttentionKernel) -> Source:
    options, scheduler = SM90_SCHEDULES[kernel.schedule]
    element = CUTLASS_ELEMENT[kernel.problem.element]
    grouped = kernel.problem.kv_group > 1
    causal = CAUSAL_CODE[kernel.problem.causal]
    causal_scheduler = section_sharing = ""
    if kernel.problem.modifies_scores:  # a bias, soft-capping or both: the score step on every key tile
        if kernel.schedule not in SM90_BIAS_SCHEDULES:
            raise ValueError(f"{kernel.name}: a bias or soft-capped kernel runs one of {SM90_BIAS_SCHEDULES}")
        fusion = f"RelaxBiasMask<{causal}, {kernel.keys_per_block}>"
        mainloop, mainloop_args = BIAS_MAINLOOP, BIAS_MAINLOOP_ARGS
        pieces = {"bias_check": BIAS_CHECK.replace("$name", kernel.name)}
        if kernel.problem.causal is not None:
            pieces["bias_check"] += MEAN_ROWS_CHECK.replace("$name", kernel.name)
            pieces |= {"mean_rows_function": MEAN_ROWS_FUNCTION, "mean_rows_launch": MEAN_ROWS_LAUNCH}
    else:
        if kernel.problem.causal is not None:
            scheduler = CAUSAL_SCHEDULERS[kernel.schedule]
            causal_scheduler = CAUSAL_SCHEDULER.substitute(order=CAUSAL_ORDER, element=element)
            section_sharing = SECTION_SHARING if grouped else ""
        fusion = f"RelaxMask<{causal}>"
        mainloop, mainloop_args = PLAIN_MAINLOOP, PLAIN_MAINLOOP_ARGS
        pieces = {"bias_check": PLAIN_BIAS_CHECK.replace("$name", kernel.name)}
    # A grouped kernel's mainloop arguments end with the group.
    pieces["mainloop"] = (GROUPED_MAINLOOP if grouped else "") + mainloop.substitute(
        causal=causal,
        keys=kernel.keys_per_block,
        options=options,
        mainloop=f"GroupedMainloop<UngroupedMainloop, {fusion}>" if grouped else "UngroupedMainloop",
    )
    pieces["mainloop_args"] = "{" + mainloop_args + ", g}" if grouped else mainloop_args
    pieces = {"mean_rows_function": "", "mean_rows_launch": ""} | pieces
    text = SM90_ATTENTION_TU.substitute(
        name=kernel.name,
        attention_args=ATTENTION_ARGS,
        element=element,
        causal_scheduler=causal_scheduler,
        queries=kernel.queries_per_block,
        keys=kernel.keys_per_block,
        head_dim=kernel.max_head_dim,
        causal=causal,
        options=options,
        scheduler=scheduler,
        grouped=str(grouped).lower(),
        section_sharing=section_sharing,
        check_device=check_device(kernel),
        smem_limit=smem_limit(kernel.target),
        softcap=cxx_float(kernel.problem.softcap or 0.0),
        **pieces,
    )
    return Source(kernel.name, text, "cuda", (f"-I{sm90_fmha_dir()}",), family="sm90")
