"""Profiling fused attention: the tiles timed on a static problem, and the timing function of a
candidate kernel."""

from __future__ import annotations

import dataclasses
from string import Template

from ..profiling import ProfileJob
from .records import AttentionProblem, attention_key
from .select import (
    attention_family,
    attention_tiles,
    choose_attention_kernel,
    sm90_attention_kernels,
    sm90_unmeasured_kernels,
)


def attention_job(problem: AttentionProblem, arch: int, family: str = "auto") -> ProfileJob | None:
    """For a static problem: on the SM90 kernel (sm_90a, `attention_family`) every tile and
    schedule of `sm90_attention_kernels`; on the SM80 kernel the rule's tile, then the other one
    where there is a choice (head dims <= 64), then on sm_90a the SM90 kernels that run the head
    dim padded where the heuristic does not yet (`sm90_unmeasured_kernels`: 112 on the 128 kernel)."""
    if None in (problem.batch, problem.seq_q, problem.seq_kv):
        return None  # symbolic sizes: the rule (the report says so)
    if attention_family(problem, arch, family) == 90:
        candidates = tuple(
            (dataclasses.replace(k, selected_by="profiling"), 1) for k in sm90_attention_kernels(problem, arch)
        )
        return ProfileJob(attention_key(problem, arch, 90), problem, candidates)
    if problem.softcap is not None:
        return None  # no SM80 kernel soft-caps: the attention stays in TVM (select.soft_cap_refusal)
    unmeasured = sm90_unmeasured_kernels(problem, arch, family)
    if len(attention_tiles(problem)) < 2 and not unmeasured:
        return None  # one tile: the rule (the report says so)
    chosen = dataclasses.replace(
        choose_attention_kernel(problem, arch, family=family), selected_by="profiling", note=""
    )
    tiles = [(chosen.queries_per_block, chosen.keys_per_block)]
    tiles += [t for t in attention_tiles(problem) if t != tiles[0]]
    kernels = [dataclasses.replace(chosen, queries_per_block=q, keys_per_block=k) for q, k in tiles]
    kernels += [dataclasses.replace(k, selected_by="profiling") for k in unmeasured]
    return ProfileJob(attention_key(problem, arch), problem, tuple((k, 1) for k in kernels))


PROFILE_ATTENTION = Template("""\
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_relax_cutlass_profile_${index}(
    void*, const TVMFFIAny* ffi_args, int32_t num_args, TVMFFIAny* result) {
  const char* fn = "relax_cutlass_profile_${index}";
  TRY(CheckArgCount(fn, num_args, 9, "q, k, v, out, shape, scale, causal, kv_group, iterations"));
  const DLTensor *q, *k, *v, *out;
  const int64_t* shape;
  double scale;
  int64_t causal, kv_group, iterations;
  TRY(TensorArg(fn, ffi_args, 0, "q", &q));
  TRY(TensorArg(fn, ffi_args, 1, "k", &k));
  TRY(TensorArg(fn, ffi_args, 2, "v", &v));
  TRY(TensorArg(fn, ffi_args, 3, "out", &out));
  // shape: batch, seq_q, seq_kv, heads, head_dim, head_dim_value; q, k, v, out packed BSNH, k and v
  // with heads / kv_group heads
  TRY(ShapeArg(fn, ffi_args, 4, "shape", 6, &shape));
  TRY(FloatArg(fn, ffi_args, 5, "scale", &scale));
  TRY(IntArg(fn, ffi_args, 6, "causal", &causal));
  TRY(IntArg(fn, ffi_args, 7, "kv_group", &kv_group));
  TRY(IntArg(fn, ffi_args, 8, "iterations", &iterations));
  const int64_t b = shape[0], s = shape[1], t = shape[2], n = shape[3], h = shape[4], dv = shape[5];
  const int64_t nk = n / (kv_group > 1 ? kv_group : 1);
  RelaxCutlassAttentionArgs args{b, n, s, t, h, dv,
                                 Data(q), s * n * h, n * h, h,
                                 Data(k), t * nk * h, nk * h, h,
                                 Data(v), t * nk * dv, nk * dv, dv,
                                 const_cast<void*>(Data(out)), static_cast<float>(scale)};
  args.causal = static_cast<int32_t>(causal);  // records.CAUSAL_CODE
  args.kv_group = kv_group;
  return TimeLaunches(out, iterations, result, [&](void* stream) { return ${kernel}_run(&args, stream); });
}
""")
