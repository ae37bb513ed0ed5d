"""Profiling fused attention: the tiles timed on a static problem, and the timing function of a
candidate kernel."""

from __future__ import annotations

import dataclasses
from string import Template

from ...stages.profile import ProfileJob
from .records import AttentionProblem, attention_key
from .select import attention_tiles, choose_attention_kernel


def attention_job(problem: AttentionProblem, arch: int) -> ProfileJob | None:
    """The rule's tile, then the other one, for a static problem with a choice (head dims <= 64)."""
    if None in (problem.batch, problem.seq_q, problem.seq_kv) or len(attention_tiles(problem)) < 2:
        return None  # symbolic sizes, or one tile: the rule (the report says so)
    chosen = dataclasses.replace(choose_attention_kernel(problem, arch), selected_by="profiling", note="")
    tiles = [(chosen.queries_per_block, chosen.keys_per_block)]
    tiles += [t for t in attention_tiles(problem) if t != tiles[0]]
    candidates = tuple((dataclasses.replace(chosen, queries_per_block=q, keys_per_block=k), 1) for q, k in tiles)
    return ProfileJob(attention_key(problem, arch), problem, candidates)


PROFILE_ATTENTION = Template("""\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_relax_cutlass_profile_${index}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny* result) {
  const char* fn = "relax_cutlass_profile_${index}";
  TRY(CheckArgCount(fn, num_args, 7, "q, k, v, out, shape, scale, iterations"));
  const DLTensor *q, *k, *v, *out;
  const int64_t* shape;
  double scale;
  int64_t iterations;
  TRY(TensorArg(fn, ffi_args, 0, "q", &q));
  TRY(TensorArg(fn, ffi_args, 1, "k", &k));
  TRY(TensorArg(fn, ffi_args, 2, "v", &v));
  TRY(TensorArg(fn, ffi_args, 3, "out", &out));
  // shape: batch, seq_q, seq_kv, heads, head_dim, head_dim_value; q, k, v, out packed BSNH
  TRY(ShapeArg(fn, ffi_args, 4, "shape", 6, &shape));
  TRY(FloatArg(fn, ffi_args, 5, "scale", &scale));
  TRY(IntArg(fn, ffi_args, 6, "iterations", &iterations));
  const int64_t b = shape[0], s = shape[1], t = shape[2], n = shape[3], h = shape[4], dv = shape[5];
  RelaxCutlassAttentionArgs args{b, n, s, t, h, dv,
                                 Data(q), s * n * h, n * h, h,
                                 Data(k), t * n * h, n * h, h,
                                 Data(v), t * n * dv, n * dv, dv,
                                 const_cast<void*>(Data(out)), static_cast<float>(scale)};
  return TimeLaunches(out, iterations, result, [&](void* stream) { return ${kernel}_run(&args, stream); });
}
""")
