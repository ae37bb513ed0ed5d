"""C++ of the channel-affine kind: a grid-stride CUDA kernel behind the `_run` C ABI (16-byte
vectors of 8 channels: each finds its part, reads it there, normalizes and activates in float32,
and writes the concatenated layout), and the glue function of a region."""

from __future__ import annotations

from string import Template

from ...toolkit.compile import Source
from ...toolkit.glue import check_device, launch_call, operand_arrays, tensor_checks, unpack_args
from ...toolkit.literals import cxx_float
from ...toolkit.templates import GLUE_FUNCTION_HEAD, GLUE_FUNCTION_TAIL
from .patterns import part_role
from .records import MAX_CHANNELS, MAX_PARTS, VECTOR, ChannelAffineKernel, ChannelAffineRegion

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

# Where output vector i (kVector channels of the concatenation, row-major) comes from: its part, the
# vector's index there and its first output channel, given the parts' first output channels
# (`first`, parts + 1 entries, the last the output's channels). Plain C++ (a CPU test builds it with
# the host compiler and checks it against numpy's concatenation).
CHANNEL_SOURCE = """\
struct RelaxChannelSource {
  int part;
  int64_t vector;
  int64_t channel;
};
RELAX_HOST_DEVICE RelaxChannelSource relax_channel_source(int64_t i, const int64_t* first, int parts, int vector) {
  const int64_t per_row = first[parts] / vector;
  const int64_t row = i / per_row, c = i % per_row * vector;
  int p = 0;
  while (p + 1 < parts && c >= first[p + 1]) ++p;
  return {p, (row * (first[p + 1] - first[p]) + c - first[p]) / vector, c};
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
using T = $element_t;

struct alignas(16) Vector {
  T x[kVector];
};

// Each CTA first puts in shared memory the parts' first output channels (the last entry: the
// output's channels) and each channel's batch norm as y = x * scale + shift.
__global__ void __launch_bounds__(256) Kernel(RelaxCutlassChannelAffineArgs a) {
  __shared__ int64_t first[$max_parts + 1];
  __shared__ float scale[$max_channels], shift[$max_channels];
  if (threadIdx.x == 0) {
    first[0] = 0;
    for (int p = 0; p < a.parts; ++p) first[p + 1] = first[p] + a.channels[p];
  }
  __syncthreads();
  const int64_t channels = first[a.parts];
  for (int64_t k = threadIdx.x; k < channels; k += blockDim.x) {
    const float s = a.gamma[k] * rsqrtf(a.var[k] + a.epsilon);
    scale[k] = s;
    shift[k] = a.beta[k] - a.mean[k] * s;
  }
  __syncthreads();
  const int64_t vectors = a.rows * (channels / kVector);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors; i += int64_t(gridDim.x) * blockDim.x) {
    // (the threads of a warp read one or two parts: no divergence to speak of)
    const RelaxChannelSource from = relax_channel_source(i, first, a.parts, kVector);
    const Vector in = reinterpret_cast<const Vector*>(a.part[from.part])[from.vector];
    Vector out;
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      const float v = fmaf($to_float(in.x[j]), scale[from.channel + j], shift[from.channel + j]);
      out.x[j] = $from_float($activation);
    }
    reinterpret_cast<Vector*>(a.out)[i] = out;
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
  if (channels > $max_channels) return "$name: the output has more than $max_channels channels";
  const int64_t vectors = a->rows * (channels / kVector);
  if (vectors == 0) return nullptr;
  // (each CTA computes the channels' scale and shift once: a few per SM, striding over the vectors)
  const int blocks = static_cast<int>((vectors + 255) / 256 < 1024 ? (vectors + 255) / 256 : 1024);
  Kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(*a);
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
        max_channels=MAX_CHANNELS,
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
