"""C++ of the channel-affine kind: a CUDA kernel behind the `_run` C ABI (a thread per column of
16-byte vectors of 8 channels and a set of rows: it finds its part and its channels' batch norm
once, then reads each row's vector there, normalizes and activates it in float32, and writes the
concatenated layout), and the glue function of a region."""

from __future__ import annotations

from string import Template

from ...toolkit.compile import Source
from ...toolkit.glue import check_device, launch_call, operand_arrays, tensor_checks, unpack_args
from ...toolkit.literals import cxx_float
from ...toolkit.templates import GLUE_FUNCTION_HEAD, GLUE_FUNCTION_TAIL
from .patterns import part_role
from .records import MAX_PARTS, VECTOR, ChannelAffineKernel, ChannelAffineRegion

ARGS_TYPE = "RelaxCutlassChannelAffineArgs"
ARGS = f"""\
struct RelaxCutlassChannelAffineArgs {{
  int64_t rows;  // the product of the leading axes
  int32_t parts;  // 1 .. {MAX_PARTS}
  int64_t channels[{MAX_PARTS}];  // each part's (a multiple of {VECTOR}); the output has their sum
  const void* part[{MAX_PARTS}];
  const float* gamma; const float* beta; const float* mean; const float* var;  // one per output channel
  float epsilon;
  void* out;
}};
"""
ACTIVATIONS = {"relu": "v > 0.f ? v : 0.f"}
CTYPES = {
    "float16": ("__half", "__float2half_rn", "__half2float"),
    "bfloat16": ("__nv_bfloat16", "__float2bfloat16_rn", "__bfloat162float"),
}

# Where output column vector `column` (kVector channels of the concatenation, from channel
# column * vector) comes from in every row: its part, the vector's index there in row 0, the part's
# vectors per row (row r's vector is vector + r * stride) and the first output channel. Plain C++ (a
# CPU test builds it with the host compiler and checks it against numpy's concatenation).
CHANNEL_SOURCE = """\
struct RelaxChannelSource {
  int part;
  int64_t vector;
  int64_t stride;
  int64_t channel;
};
RELAX_HOST_DEVICE RelaxChannelSource relax_channel_source(int64_t column, const int64_t* channels, int parts,
                                                          int vector) {
  const int64_t c = column * vector;
  int64_t first = 0;
  int p = 0;
  while (p + 1 < parts && c >= first + channels[p]) first += channels[p++];
  return {p, (c - first) / vector, channels[p] / vector, c};
}
"""

KERNEL_TU = Template(
    """\
// relax_cutlass generated kernel: $name
#include <cstdint>
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

$args
namespace {
$check_device
#define RELAX_HOST_DEVICE __host__ __device__ inline
$channel_source
constexpr int kVector = $vector;  // channels a thread reads and writes at once: 16 bytes
constexpr int kUnroll = 4;  // rows whose loads a thread has in flight at once
constexpr int kThreads = 256;
using T = $element_t;

struct alignas(16) Vector {
  T x[kVector];
};

// Thread g owns output column vector g % columns in rows g / columns, + lanes, + 2 lanes, ...: its
// part, and its channels' batch norm as y = x * scale + shift, are found once, and every row's
// access is one 16-byte load and store (a warp's threads are consecutive columns: coalesced).
__global__ void __launch_bounds__(kThreads)
    Kernel(const __grid_constant__ RelaxCutlassChannelAffineArgs a, int64_t columns, int64_t lanes) {
  const int64_t g = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (g >= columns * lanes) return;
  const int64_t column = g % columns;
  const RelaxChannelSource from = relax_channel_source(column, a.channels, a.parts, kVector);
  float scale[kVector], shift[kVector];
#pragma unroll
  for (int j = 0; j < kVector; ++j) {
    const int64_t k = from.channel + j;
    scale[j] = a.gamma[k] * rsqrtf(a.var[k] + a.epsilon);
    shift[j] = a.beta[k] - a.mean[k] * scale[j];
  }
  const Vector* __restrict__ in = reinterpret_cast<const Vector*>(a.part[from.part]) + from.vector;
  Vector* __restrict__ out = reinterpret_cast<Vector*>(a.out) + column;
  for (int64_t r = g / columns; r < a.rows; r += kUnroll * lanes) {
    Vector loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r + u * lanes < a.rows) loaded[u] = in[(r + u * lanes) * from.stride];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r + u * lanes >= a.rows) break;
      Vector o;
#pragma unroll
      for (int j = 0; j < kVector; ++j) {
        const float v = fmaf($to_float(loaded[u].x[j]), scale[j], shift[j]);
        o.x[j] = $from_float($activation);
      }
      out[(r + u * lanes) * columns] = o;
    }
  }
}
}  // namespace

extern "C" __attribute__((visibility("default"))) const char* ${name}_run(const ${args_type}* a, void* stream) {
  if (const char* error = CheckDevice()) return error;
  if (a->parts < 1 || a->parts > $max_parts) return "$name: the parts must number 1 to $max_parts";
  int64_t channels = 0;
  for (int p = 0; p < a->parts; ++p) {
    if (a->channels[p] <= 0 || a->channels[p] % kVector != 0) {
      return "$name: a part's channels are no multiple of $vector";
    }
    if (reinterpret_cast<uintptr_t>(a->part[p]) % 16 != 0) return "$name: a part is not 16-byte aligned";
    channels += a->channels[p];
  }
  if (reinterpret_cast<uintptr_t>(a->out) % 16 != 0) return "$name: the output is not 16-byte aligned";
  if (a->rows <= 0) return nullptr;
  // as many row lanes as fill every SM twice over (each thread then loops over its rows), at most
  // one per row
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return "$name: cannot query the device's multiprocessors";
  }
  const int64_t columns = channels / kVector;
  const int64_t wanted = (int64_t(sms) * 2048 + columns - 1) / columns;
  const int64_t lanes = wanted < a->rows ? wanted : a->rows;
  const int64_t blocks = (columns * lanes + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return "$name: too many rows for one launch";
  Kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(*a, columns, lanes);
  return cudaPeekAtLastError() == cudaSuccess ? nullptr : "$name: kernel launch failed";
}
"""
)

GLUE_FUNCTION = Template(
    GLUE_FUNCTION_HEAD
    + """\
$shape_checks
  ${args_type} args{};
  args.rows = Numel(part0) / $channels0;
  args.parts = $parts;
$fill
  args.gamma = static_cast<const float*>(Data(gamma));
  args.beta = static_cast<const float*>(Data(beta));
  args.mean = static_cast<const float*>(Data(mean));
  args.var = static_cast<const float*>(Data(var));
  args.epsilon = $epsilon;
  args.out = const_cast<void*>(Data(out));
"""
    + GLUE_FUNCTION_TAIL
)


def emit_kernel(kernel: ChannelAffineKernel) -> Source:
    element_t, from_float, to_float = CTYPES[kernel.problem.element]
    text = KERNEL_TU.substitute(
        name=kernel.name,
        args=ARGS,
        args_type=ARGS_TYPE,
        check_device=check_device(kernel),
        vector=VECTOR,
        max_parts=MAX_PARTS,
        element_t=element_t,
        from_float=from_float,
        to_float=to_float,
        activation=ACTIVATIONS[kernel.problem.activation],
        channel_source=CHANNEL_SOURCE,
    )
    return Source(kernel.name, text, "cuda")  # no tensor-core family: no SASS check


def glue_function(region: ChannelAffineRegion) -> str:
    p = region.kernel.problem
    total = sum(p.channels)
    parts = [part_role(i) for i in range(len(p.channels))]
    # every part holds the rows of part0 (its leading axes are the same in the graph), the output all channels
    checks = [
        f'  TRY(CheckDim(fn, "{r} channels", {r}->ndim ? {r}->shape[{r}->ndim - 1] : 0, {c}, {r}));'
        f'\n  TRY(CheckDim(fn, "{r} size", Numel({r}), Numel(part0) / {p.channels[0]} * {c}, {r}));'
        for r, c in zip(parts, p.channels, strict=True)
    ]
    checks += [f'  TRY(CheckDim(fn, "{r} size", Numel({r}), {total}, {r}));' for r in ("gamma", "beta", "mean", "var")]
    checks.append(f'  TRY(CheckDim(fn, "output size", Numel(out), Numel(part0) / {p.channels[0]} * {total}, out));')
    fill = "\n".join(
        f"  args.channels[{i}] = {c};\n  args.part[{i}] = Data({r});"
        for i, (r, c) in enumerate(zip(parts, p.channels, strict=True))
    )
    return GLUE_FUNCTION.substitute(
        symbol=region.symbol,
        unpack=unpack_args(region),
        checks=tensor_checks(region, (), {r: 16 for r in (*parts, "out")}),
        shape_checks="\n".join(checks),
        args_type=ARGS_TYPE,
        channels0=p.channels[0],
        parts=len(p.channels),
        fill=fill,
        epsilon=cxx_float(p.epsilon),
        launch=launch_call(region.kernel),
        operand_arrays=operand_arrays(region),
    )
