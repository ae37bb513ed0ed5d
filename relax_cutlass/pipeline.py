"""offload_pipeline: the relax_cutlass passes in order, as one TVM pass."""

from __future__ import annotations

import tvm

from .arch import parse_arch
from .rewrites.broadcasts import MakeGemmBroadcastsExplicit
from .rewrites.canonicalize import AccumulateInFloat32
from .rewrites.gathers import TakesAsSlices
from .rewrites.reductions import FastTvmReductions
from .rewrites.token_order import CancelRowPermutations
from .stages.codegen import CutlassCodegen
from .stages.constants import LiftConstants
from .stages.partition import PartitionForCutlass, partition_as_offloaded, pre_partition_passes


def offload_pipeline(arch: str | int = "sm_80", convert_layout: bool = True, **options) -> tvm.transform.Pass:
    """FixTvmCudaForms -> FoldLinearReshapes -> NarrowFloat32Islands -> PatchifyConvs -> SinkTokenPermutes ->
    SplitPackedGatedProjections -> FuseParallelProjections ->
    [ConvertToNHWC ->]
    PartitionForCutlass -> LiftConstants -> CutlassCodegen -> CancelRowPermutations -> MakeGemmBroadcastsExplicit ->
    AccumulateInFloat32 -> TakesAsSlices -> FastTvmReductions.

    FixTvmCudaForms rewrites forms TVM 0.27's CUDA build gets wrong, values unchanged: cumsums over
    bool or 8/16-bit ints (it aborts the process on transformers' bool mask cumsum) and x ** c for
    small integer c (NaN for negative x: GPT-2's gelu, Llama's RMSNorm). `arch="auto"` detects
    the local GPU (and fails clearly without one). FoldLinearReshapes drops
    the flatten/unflatten torch.export puts around linear layers (so their epilogues fuse);
    NarrowFloat32Islands computes in 16 bits the float32 islands ToMixedPrecision leaves between
    16-bit values where that is exact or one rounding (MobileNetV3's hardswish and the residual add
    after it, Swin's window shuffles), so they fuse into the epilogues or move half the bytes;
    PatchifyConvs makes a patch embedding on 3 channels (ViT, Swin, ConvNeXt) the GEMM of its patches;
    SinkTokenPermutes moves nn.MultiheadAttention's (B, S) -> (S, B) transpose after the
    in-projection, where the attention reads q, k and v in place; SplitPackedGatedProjections makes a packed gate|up
    projection (Phi-3's gate_up_proj, chunked) two GEMMs, so the gated multiply fuses into the gate
    GEMM's epilogue as for Llama;
    FuseParallelProjections makes the separate q, k and v projections of one input (BERT, Llama)
    one GEMM on the concatenated weights, each projection a slice of it, which the attention reads
    in place where nothing comes between (BERT; Llama's rotary q and k are computed from theirs):
    BERT-large's 1024-wide projections had 64 output tiles each on a 132-SM H200, q|k|v has 192;
    `convert_layout` brings NCHW convolutions to NHWC (a no-op without conv2d). Options go to CutlassCodegen:
    accumulator, m_hint, jobs, compile, family, tile, tuning_db, profile (see docs/configuration.md).
    CancelRowPermutations lets a row-wise region (a GEMM, a layer norm) read its input's rows in the
    order the views after it restore, so the transposes on both sides go (ViT's out-projection).
    MakeGemmBroadcastsExplicit runs on what stays in TVM: a conv/matmul left there whose output
    a later op broadcasts (a squeeze-excitation scale) would otherwise fail TVM's CUDA build.
    AccumulateInFloat32 then makes the 16-bit matmuls left in TVM sum in float32, as the CUTLASS
    kernels do (TVM sums in a matmul's out_dtype; FoldLinearReshapes folded from_torch's explicit
    float32 accumulation back so that the epilogues fuse). TakesAsSlices writes the gathers of
    consecutive positions torch.export makes of torch.roll and constant indexing as slices, which
    TVM fuses with the copies around them (Swin's rolled windows). FastTvmReductions makes the average pools
    and float32 means of 16-bit tensors left in TVM forms its CUDA build runs fast (one fused
    elementwise kernel of window sums; one reduction that reads the 16-bit tensor): DenseNet-121's
    three transition pools took 5.0 of its 8.0 ms as TVM scheduled them.
    """
    sm = parse_arch(arch)
    return tvm.transform.Sequential(
        [
            *pre_partition_passes(convert_layout),
            PartitionForCutlass(sm),
            LiftConstants(),
            CutlassCodegen(sm, **options),
            *post_codegen_passes(),
        ],
        name="relax_cutlass.offload_pipeline",
    )


def post_codegen_passes() -> list[tvm.transform.Pass]:
    """The rewrites offload_pipeline runs after CutlassCodegen, on what stays in TVM, in its order:
    whatever stands in for the pipeline (the tests' CPU harness) runs exactly these, so that the
    ops left in TVM compute as in the user's build."""
    return [
        CancelRowPermutations(),
        MakeGemmBroadcastsExplicit(),
        AccumulateInFloat32(),
        TakesAsSlices(),
        FastTvmReductions(),
    ]


__all__ = ["offload_pipeline", "partition_as_offloaded", "post_codegen_passes", "pre_partition_passes"]
