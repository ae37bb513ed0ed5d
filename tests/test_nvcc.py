"""Real nvcc builds (no GPU needed): the seed scenario end to end, caching, residual kernels.

About 10-20 s per distinct kernel on 2 cores; objects are cached under RELAX_CUTLASS_CACHE_DIR.
"""

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import tvm

import relax_cutlass
from relax_cutlass.prepare import bind_weights
from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
from relax_cutlass.stages.constants import offloaded_functions
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing.models import conv2d_epilogue_model, dense_epilogue_model, random_weights
from relax_cutlass.toolkit.compile import cache_dir, compile_all, compile_command, portable_command
from relax_cutlass.toolkit.toolchain import package_dir, toolchain
from relax_cutlass.transform import LiftConstants, PartitionForCutlass

pytestmark = pytest.mark.nvcc


MMA_OPCODES = ("HMMA", "HGMMA", "UTCHMMA")


@pytest.mark.parametrize(
    "family,arch,opcode",
    [
        ("sm80", 80, "HMMA"),
        ("sm90", 90, "HGMMA"),
        pytest.param("sm100", 100, "UTCHMMA", marks=pytest.mark.slow),
        pytest.param("sm100", 103, "UTCHMMA", marks=pytest.mark.slow),
        pytest.param("sm100", 110, "UTCHMMA", marks=pytest.mark.slow),
        pytest.param("sm80", 100, "HMMA", marks=pytest.mark.slow),
        pytest.param("sm80", 120, "HMMA", marks=pytest.mark.slow),
    ],
)
def test_kernel_sass_holds_its_family_mma_instructions(family, arch, opcode):
    """One small GEMM per (family, target) as offload_pipeline builds it: its SASS is for the
    target and holds the family's tensor-core instructions and no other family's (wgmma's HGMMA on
    sm_90a, tcgen05's UTCHMMA on sm_100a / sm_103a / sm_110a, mma.sync's HMMA elsewhere and where
    family='sm80' asks for it), which compile_all's guard checked."""
    from relax_cutlass.arch import arch_name
    from relax_cutlass.kinds.epilogue import Epilogue
    from relax_cutlass.kinds.gemm.records import GemmProblem
    from relax_cutlass.kinds.gemm.select import choose_kernel
    from relax_cutlass.toolkit.sass_check import mma_counts

    kernel = choose_kernel(GemmProblem(128, 128, 128, True), Epilogue(), arch, family=family)
    assert f"sm{kernel.arch}" == family and kernel.target == arch
    ((obj, _),) = compile_all([emit_kernel(kernel)], arch).values()
    counts, sass, _ = mma_counts(obj, MMA_OPCODES)
    print(f"{kernel.name} for {arch_name(arch)}: {counts}")
    assert sass == [arch_name(arch)] and counts[opcode] > 0
    assert all(n == 0 for op, n in counts.items() if op != opcode)


@pytest.mark.slow
def test_sm100_epilogues_and_schedules_compile_to_tcgen05():
    """The SM100 forms beyond the plain GEMM: a 2-SM MMA with the bias + gelu EVT (row broadcast
    tiled by the CTA's half of the MMA tile) and a 1-SM stream-K kernel with a residual add + relu
    (the source fetch), compiled for sm_100a and checked by the guard (tcgen05's UTCHMMA)."""
    from relax_cutlass.kinds.epilogue import Epilogue
    from relax_cutlass.kinds.gemm.records import GemmProblem
    from relax_cutlass.kinds.gemm.select import choose_kernel
    from relax_cutlass.toolkit.sass_check import mma_counts

    problem = GemmProblem(1024, 4096, 1024, True)
    kernels = [
        choose_kernel(problem, Epilogue(bias=True, activation="gelu"), 100),
        choose_kernel(
            problem, Epilogue(bias=True, residual=True, residual_activation="relu"), 100,
            tile="tb128x256x64_c1x1x1_1sm_streamk",
        ),
    ]  # fmt: skip
    assert [k.tile.schedule for k in kernels] == ["2sm", "1sm"]
    objects = compile_all([emit_kernel(k) for k in kernels], 100)
    for kernel in kernels:
        counts, _, _ = mma_counts(objects[kernel.name][0], MMA_OPCODES)
        print(f"{kernel.name}: {counts}")
        assert counts["UTCHMMA"] > 0 and counts["HMMA"] == counts["HGMMA"] == 0


@pytest.mark.slow
def test_sm90_small_tiles_compile_to_wgmma():
    """The SM90 CTA tiles below 128x128 (select.SM90_SMALL_TILES, cutlass_library's level 1112): a
    64x128 ping-pong kernel with the bias EVT (its row broadcast tiled 64x128) and a 128x64
    cooperative one (two consumer warp groups of 64x64), compiled for sm_90a and checked by the
    guard (wgmma's HGMMA)."""
    from relax_cutlass.kinds.epilogue import Epilogue
    from relax_cutlass.kinds.gemm.records import GemmProblem
    from relax_cutlass.kinds.gemm.select import choose_kernel
    from relax_cutlass.toolkit.sass_check import mma_counts

    problem = GemmProblem(1024, 1024, 1024, True)
    kernels = [
        choose_kernel(problem, Epilogue(bias=True), 90, tile="tb64x128x64_c2x1x1_pingpong"),
        choose_kernel(problem, Epilogue(), 90, tile="tb128x64x64_c1x2x1_cooperative"),
    ]
    assert [k.tile.schedule for k in kernels] == ["pingpong", "cooperative"]
    objects = compile_all([emit_kernel(k) for k in kernels], 90)
    for kernel in kernels:
        counts, sass, _ = mma_counts(objects[kernel.name][0], MMA_OPCODES)
        print(f"{kernel.name}: {counts}")
        assert sass == ["sm_90a"] and counts["HGMMA"] > 0 and counts["HMMA"] == counts["UTCHMMA"] == 0


@pytest.mark.slow
def test_sm100_conv_compiles_to_tcgen05():
    """A CUTLASS 3.x SM100 conv (TMA im2col + tcgen05, a 2-SM MMA) with the bias + residual + relu
    EVT, as offload_pipeline picks it for sm_100a, compiled and checked by the guard (UTCHMMA)."""
    from relax_cutlass.kinds.conv2d.records import Conv2dProblem
    from relax_cutlass.kinds.conv2d.select import choose_conv2d_kernel
    from relax_cutlass.kinds.epilogue import Epilogue
    from relax_cutlass.toolkit.sass_check import mma_counts

    problem = Conv2dProblem(None, 28, 28, 128, 128, 3, 3, 28, 28, (1, 1))
    kernel, _ = choose_conv2d_kernel(problem, Epilogue(bias=True, residual=True, residual_activation="relu"), 100)
    assert kernel.arch == 100 and kernel.tile.schedule == "2sm"
    ((obj, _),) = compile_all([emit_kernel(kernel)], 100).values()
    counts, _, _ = mma_counts(obj, MMA_OPCODES)
    print(f"{kernel.name}: {counts}")
    assert counts["UTCHMMA"] > 0 and counts["HMMA"] == counts["HGMMA"] == 0


@pytest.mark.slow
def test_guard_rejects_a_stub_sm100_kernel_built_for_sm_90a(monkeypatch):
    """The other direction of the stub bug: a tcgen05 kernel compiled for Hopper is a stub too."""
    import dataclasses

    import relax_cutlass.toolkit.compile
    from relax_cutlass.kinds.epilogue import Epilogue
    from relax_cutlass.kinds.gemm.records import GemmProblem
    from relax_cutlass.kinds.gemm.select import choose_kernel
    from relax_cutlass.toolkit.sass_check import StubKernelError

    kernel = dataclasses.replace(choose_kernel(GemmProblem(128, 128, 128, True), Epilogue(), 100), target=90)
    monkeypatch.setattr(
        relax_cutlass.toolkit.compile, "nvcc_gencode", lambda _: ["-gencode=arch=compute_90a,code=sm_90a"]
    )
    with pytest.raises(StubKernelError, match=r"sm100_gemm_\S+ is a CUTLASS 3.x SM100 .* \(sm_90a\) has UTCHMMA x0"):
        compile_all([emit_kernel(kernel)], 90)


@pytest.mark.slow
def test_guard_rejects_a_stub_sm90_kernel_built_for_sm_100a(monkeypatch):
    """The stub bug, planted: an SM90 wgmma kernel compiled for sm_100a (as offload_pipeline
    used to) compiles without complaint into a stub; the guard refuses it, and again from the cache."""
    import dataclasses

    import relax_cutlass.toolkit.compile
    from relax_cutlass.kinds.epilogue import Epilogue
    from relax_cutlass.kinds.gemm.records import GemmProblem
    from relax_cutlass.kinds.gemm.select import choose_kernel
    from relax_cutlass.toolkit.sass_check import StubKernelError

    kernel = dataclasses.replace(choose_kernel(GemmProblem(128, 128, 128, True), Epilogue(), 90), target=100)
    monkeypatch.setattr(
        relax_cutlass.toolkit.compile, "nvcc_gencode", lambda _: ["-gencode=arch=compute_100a,code=sm_100a"]
    )
    for _ in range(2):
        with pytest.raises(StubKernelError, match=r"sm90_gemm_\S+ is a CUTLASS 3.x SM90 .* \(sm_100a\) has HGMMA x0"):
            compile_all([emit_kernel(kernel)], 100)


def test_seed_scenario_bert_large_ffn_exports(tmp_path):
    """dense + bias + gelu at BERT-large FFN shapes, weights bound and folded (fp16 bias), offloaded,
    compiled for sm_80 with tvm.compile and shipped with export_library."""
    mod = dense_epilogue_model(1024, 4096, 1024, activation="gelu")
    weights = random_weights(mod)
    mod = bind_weights(mod, weights)
    offloaded = relax_cutlass.offload_pipeline("sm_80")(mod)
    report = relax_cutlass.offload_report(offloaded)
    assert [r["epilogue"] for r in report.offloaded] == ["bias+gelu"]
    assert offloaded.attrs["external_mods"]
    ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm"))
    lib = tmp_path / "ffn.so"
    ex.export_library(str(lib))
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert f"__tvm_ffi_{report.offloaded[0]['symbol']}" in symbols
    assert "cudaLaunchKernel" not in symbols  # the static CUDA runtime stays private
    # CUTLASS keeps per-kernel device state in template statics; exported, they would be shared
    # with (and left uninitialized for) another library holding the same kernel.
    assert "GemmUniversalBase" not in symbols


def _gelu_dense_kernel_source():
    mod = dense_epilogue_model("m", 768, 256, activation="gelu_tanh")
    mod = LiftConstants()(PartitionForCutlass()(bind_weights(mod, random_weights(mod))))
    (region,) = plan_regions([f for _, f in offloaded_functions(mod)], CodegenOptions())
    return emit_kernel(region.kernel)


def test_object_cache_makes_rebuilds_free():
    source = _gelu_dense_kernel_source()
    compile_all([source], 80)
    t0 = time.time()
    ((_, cached),) = compile_all([source], 80).values()
    assert cached and time.time() - t0 < 1.0


def test_a_moved_object_cache_still_hits(tmp_path, monkeypatch):
    """Objects are keyed by content, not by where the cache, nvidia-cutlass or tvm-ffi sit: a copy
    of the cache at another path (a cache carried to another machine, a fresh clone's virtual
    environment) hits. The key once held the cache's own path (the no-throw overlay's -I) and the
    packages' paths, so every object of a moved cache was compiled again."""
    source = _gelu_dense_kernel_source()
    ((obj, _),) = compile_all([source], 80).values()
    moved = tmp_path / "moved-cache"
    moved.mkdir()
    shutil.copy(obj, moved / obj.name)
    for overlay in cache_dir().glob("include-nothrow-*"):
        shutil.copytree(overlay, moved / overlay.name)
    monkeypatch.setenv("RELAX_CUTLASS_CACHE_DIR", str(moved))
    ((hit, cached),) = compile_all([source], 80).values()
    assert cached and hit == moved / obj.name
    key_command = " ".join(portable_command(compile_command(toolchain(), source, 80, Path("SRC"), Path("OBJ"))))
    for folder in (moved, package_dir("cutlass_library"), package_dir("tvm_ffi")):
        assert str(folder) not in key_command


@pytest.mark.parametrize("family,prefix", [pytest.param("auto", "sm90_", marks=pytest.mark.slow), ("sm80", "sm80_")])
def test_residual_block_kernel_exports_for_sm90a(tmp_path, family, prefix):
    """A residual-block epilogue as a CUTLASS 3.x EVT kernel (about a minute) and as a 2.x kernel."""
    mod = dense_epilogue_model(512, 256, 128, activation="silu", residual=True, residual_relu=True)
    offloaded = relax_cutlass.offload_pipeline("sm_90a", family=family)(mod)
    (row,) = relax_cutlass.offload_report(offloaded).offloaded
    assert row["kernel"].startswith(prefix)
    ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm"))
    lib = tmp_path / "residual.so"
    ex.export_library(str(lib))
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert "GemmUniversalBase" not in symbols and "GemmWithFusedEpilogue" not in symbols


@pytest.mark.parametrize("arch,family", [("sm_80", "sm80"), pytest.param("sm_90a", "sm90", marks=pytest.mark.slow)])
def test_conv2d_residual_block_exports(tmp_path, arch, family):
    """An NCHW conv + bias + residual + relu block (the ResNet bottleneck's last conv) offloaded as
    one implicit-GEMM kernel with a fused residual (sm_90a: a CUTLASS 3.x TMA im2col + wgmma kernel
    with the EVT, about a minute; compile_all's guard checked its SASS for HGMMA), built with
    tvm.compile and exported."""
    mod = conv2d_epilogue_model(2, 14, 14, 128, 128, kernel=1, padding=0, residual=True, residual_relu=True)
    offloaded = relax_cutlass.offload_pipeline(arch)(bind_weights(mod, random_weights(mod)))
    (row,) = relax_cutlass.offload_report(offloaded).offloaded
    assert row["op"] == "conv2d" and row["epilogue"] == "bias+residual_add+relu" and row["family"] == family
    ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm"))
    lib = tmp_path / "conv.so"
    ex.export_library(str(lib))
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert f"__tvm_ffi_{row['symbol']}" in symbols
    assert "ImplicitGemmConvolution" not in symbols and "ConvUniversal" not in symbols


def test_profiler_library_exports_callable_timing_functions(tmp_path):
    """A GEMM candidate with its epilogue (stage 2), a conv2d one without (stage 1) and a fused
    attention one built into a profiler; its functions take the runner's arguments (tensors, bias
    and residual, sizes, a Shape of conv or attention sizes) and, with no GPU here, fail with the
    kernel's own clear error rather than a type or symbol error."""
    import dataclasses
    import json

    import numpy as np
    import tvm_ffi

    from relax_cutlass.kinds.attention.records import AttentionProblem
    from relax_cutlass.kinds.conv2d.records import Conv2dProblem
    from relax_cutlass.kinds.epilogue import Epilogue
    from relax_cutlass.kinds.gemm.records import GemmProblem
    from relax_cutlass.stages.profile import ProfileJob, build_profiler, plan_jobs

    conv = Conv2dProblem(n=1, h=8, w=8, c=16, k=16, r=3, s=3, p=8, q=8, pad=(1, 1))
    attention = AttentionProblem(batch=2, heads=4, seq_q=64, seq_kv=64, head_dim=64, head_dim_value=64, scale=0.125)
    gemm, conv_job, attention_job = plan_jobs(
        [GemmProblem(m=128, n=64, k=64, b_transposed=True), conv, attention], 80, limit=1
    )
    attention_job = dataclasses.replace(attention_job, candidates=attention_job.candidates[:1])
    gelu = Epilogue(bias=True, activation="gelu")
    (kernel, split), *_ = gemm.candidates
    fused = ProfileJob(
        dataclasses.replace(gemm.key, epilogue="bias+gelu"),
        gemm.problem,
        ((dataclasses.replace(kernel, epilogue=gelu), split),),
        gelu,
    )
    library = build_profiler([fused, conv_job, attention_job], 80, tmp_path)
    manifest = json.loads((tmp_path / "profile.json").read_text())
    assert [j["op"] for j in manifest["jobs"]] == ["gemm", "conv2d", "attention"]
    assert manifest["jobs"][0]["epilogue"] == dataclasses.asdict(gelu)
    assert manifest["jobs"][0]["key"]["epilogue"] == "bias+gelu"
    lib = tvm.runtime.load_module(str(library))

    def tensor(*shape):
        return tvm.runtime.tensor(np.ones(shape, "float16"))

    gemm_fn = lib.get_function(manifest["jobs"][0]["candidates"][0]["function"])
    with pytest.raises(Exception, match="no usable CUDA device|built for sm_80"):
        gemm_fn(tensor(128, 64), tensor(64, 64), tensor(64), tensor(1), tensor(128, 64), 128, 64, 64, True, 1)
    conv_fn = lib.get_function(manifest["jobs"][1]["candidates"][0]["function"])
    x, w, y = tensor(1, 8, 8, 16), tensor(16, 3, 3, 16), tensor(1, 8, 8, 16)
    with pytest.raises(Exception, match="no usable CUDA device|built for sm_80"):
        conv_fn(x, w, tensor(1), tensor(1), y, tvm_ffi.Shape(manifest["jobs"][1]["conv"]), 1, 1)
    attention_fn = lib.get_function(manifest["jobs"][2]["candidates"][0]["function"])
    q, out = tensor(2, 64, 4, 64), tensor(2, 64, 4, 64)
    with pytest.raises(Exception, match="no usable CUDA device|built for sm_80"):
        # scale, causal, kv_group, iterations
        attention_fn(q, q, q, out, tvm_ffi.Shape(manifest["jobs"][2]["attention"]), 0.125, 0, 1, 1)


@pytest.mark.parametrize(
    "arch,kernel",
    [("sm_80", "sm80_fmha_f16_aligned_q64_k64_maxk64"), ("sm_90a", "sm90_fmha_f16_pingpong_q128_k128_h64")],
)
def test_fused_attention_exports(tmp_path, arch, kernel):
    """softmax(q k^T * scale) v, as torch.export writes it and with a symbolic batch, through
    nvcc (CUTLASS's fused attention kernel is a few seconds; examples/88's Hopper kernel on sm_90a
    about a minute) into an exported library."""

    from relax_cutlass.testing.attention import torch_export_attention

    mod = torch_export_attention(b=2, s=16, n=4, h=64, symbolic_batch=True)
    offloaded = relax_cutlass.offload_pipeline(arch)(mod)
    (row,) = relax_cutlass.offload_report(offloaded).offloaded
    assert row["op"] == "attention" and row["kernel"] == kernel
    ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm"))
    lib = tmp_path / "attention.so"
    ex.export_library(str(lib))
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert f"__tvm_ffi_{row['symbol']}" in symbols
    assert "attention_kernel_batched_impl" not in symbols  # the kernel stays private to the library


@pytest.mark.slow
def test_head_dim_256_sm90_attention_exports(tmp_path):
    """Gemma's head dim 256 on examples/88's 128 x 64 tile (forced: not yet the heuristic's), causal,
    through nvcc into an exported library."""
    from tvm import relax

    from relax_cutlass.kinds.attention.select import sm90_candidate_first

    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(name, relax.TensorType((1, 256, 4, 256), "float16")) for name in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.attention(q, k, v, causal_mask="TopLeft"))
        bb.emit_func_output(out)
    with sm90_candidate_first("cooperative", measured_head_dims=[256]):
        offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="never")(bb.get())
    (row,) = relax_cutlass.offload_report(offloaded).offloaded
    assert row["kernel"] == "sm90_fmha_f16_cooperative_q128_k64_h256_causal_tl", row
    ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm"))
    ex.export_library(str(tmp_path / "attention_h256.so"))


@pytest.mark.slow
def test_an_sm90_attention_kernel_over_the_shared_memory_limit_fails_in_nvcc():
    """Head dim 256's ping-pong kernel needs more shared memory than an H100/H200 CTA may opt in
    to (it failed at launch on the H200): its static_assert stops nvcc with the kernel's name,
    while the cooperative kernel of the same tile compiles."""
    import dataclasses

    from relax_cutlass.kinds.attention.records import AttentionProblem
    from relax_cutlass.kinds.attention.select import sm90_attention_kernels, sm90_candidate_first
    from relax_cutlass.toolkit.compile import compile_all

    problem = AttentionProblem(2, 4, 333, 333, 256, 256, 0.0625)
    with sm90_candidate_first("cooperative", measured_head_dims=[256]):
        (cooperative,) = [k for k in sm90_attention_kernels(problem, 90) if k.schedule == "cooperative"]
    pingpong = dataclasses.replace(cooperative, schedule="pingpong")
    failures: dict[str, Exception] = {}
    built = compile_all([emit_kernel(pingpong), emit_kernel(cooperative)], 90, failures=failures)
    assert list(built) == [cooperative.name]
    assert f"{pingpong.name} needs more shared memory than a CTA may opt in to (232448 bytes)" in str(
        failures[pingpong.name]
    )


def test_fused_attention_with_a_mask_exports(tmp_path):
    """transformers' sdpa attention (padding mask, safe softmax): the kernel built with CUTLASS's
    attention bias and the fix-up of fully masked rows, through nvcc into an exported library."""

    from relax_cutlass.testing.attention import sdpa_attention

    mod = sdpa_attention(b=2, s=16, n=4, h=64)
    offloaded = relax_cutlass.offload_pipeline("sm_80")(mod)
    (row,) = relax_cutlass.offload_report(offloaded).offloaded
    assert row["kernel"].endswith("_bias") and row["attention"]["masked_rows"] == "zero"
    ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm"))
    lib = tmp_path / "masked_attention.so"
    ex.export_library(str(lib))
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert f"__tvm_ffi_{row['symbol']}" in symbols
