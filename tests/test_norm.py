"""The norm kind: [residual add ->] LayerNorm / RMSNorm over the last axis [-> cast] as one CUDA
kernel, with the sum and the un-cast norm as extra outputs where the graph uses them. Semantics on
the CPU (regions served by their llvm-built composites, tuple-returning ones included), the forms
real models produce (BERT post-LN, GPT-2 pre-LN, Llama's decomposed RMSNorm, ConvNeXt), the
refusals with their reasons, and real nvcc builds."""

from __future__ import annotations

import numpy as np
import pytest

import relax_cutlass
from relax_cutlass.kinds.norm.records import NormKernel, NormProblem, row_layout
from relax_cutlass.testing.harness import compare_on_cpu, offload_for_cpu, random_inputs
from relax_cutlass.testing.norm_graphs import norm_module


def _norm_rows(mod):
    return [r for r in relax_cutlass.offload_report(mod).offloaded if r["op"] == "norm"]


def _check(mod, rtol=2e-3, **dims):
    inputs = random_inputs(mod, **dims)
    _, _, rewritten = compare_on_cpu(mod, inputs, rtol=rtol)
    return _norm_rows(rewritten)


FORMS = [
    # ConvNeXt: fp16 NHWC layer norm over C
    dict(form="layer_norm", rows=(2, 7, 7), n=96, dtype="float16", epsilon=1e-6),
    # BERT post-LN: add(astype(gemm_out), r) -> layer_norm (f32) -> astype; the f32 norm is the
    # next residual
    dict(form="layer_norm", residual="cast", cast="float16", leak=("norm",), epsilon=1e-12),
    # GPT-2 / ViT pre-LN: the sum continues as the residual
    dict(form="layer_norm", residual="cast", cast="float16", leak=("sum",)),
    dict(form="layer_norm", residual="add", cast="float16", leak=("sum",)),
    # Llama: add(r, gemm_out_f32) -> decomposed RMSNorm -> astype; the sum continues
    dict(form="rms_decomposed", residual="add", cast="float16", leak=("sum",), epsilon=1e-6),
    dict(form="rms_decomposed", cast="float16"),
    # torch.onnx's Llama: 1 / sqrt for rsqrt (ONNX has no Rsqrt)
    dict(form="rms_reciprocal", residual="add", cast="float16", leak=("sum",), epsilon=1e-6),
    dict(form="rms_norm", residual="cast_both", cast="float16", leak=("sum", "norm")),
    dict(form="rms_norm", dtype="float16"),
    # bf16, weights as parameters, odd sizes, both extra outputs
    dict(form="rms_norm", dtype="bfloat16", n=1000, weights="param"),  # TVM has no bf16 layer_norm on CPU
    dict(form="layer_norm", residual="cast", dtype="bfloat16", cast="bfloat16", leak=("sum", "norm"), n=40),
    dict(form="layer_norm", residual="add", stream="float16", n=2048, leak=("sum",)),
]


@pytest.mark.parametrize("case", FORMS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_norm_forms_are_offloaded_and_compute_the_original(case):
    (row,) = _check(norm_module(**case))
    leak = case.get("leak", ())
    expected = {"out", *leak}
    assert set(row["output_roles"]) == expected
    assert row["residual"] == (case.get("residual", "none") != "none")
    assert row["norm"] == ("layer_norm" if case["form"] == "layer_norm" else "rms_norm")


def test_a_reciprocal_of_another_numerator_is_no_rmsnorm():
    """2 / sqrt(mean(x * x) + eps) is not RMSNorm's 1 / sqrt: it stays in TVM, saying why."""
    _, rewritten = offload_for_cpu(norm_module("rms_reciprocal", cast="float16", numerator=2.0))
    assert not _norm_rows(rewritten)
    report = str(relax_cutlass.offload_report(rewritten))
    assert "divides something else than 1 by the root mean square" in report, report


def test_symbolic_rows():
    mod = norm_module("layer_norm", rows=("b", 16), residual="cast", cast="float16", leak=("sum",))
    (row,) = _check(mod, b=3)
    assert row["mnk"][0] == "dynamic"
    text = str(relax_cutlass.offload_report(offload_for_cpu(mod)[1]))
    assert "[offloaded] norm layer_norm rows=dynamic n=64" in text and "outputs=" in text


@pytest.mark.parametrize(
    "case, reason",
    [
        (dict(axis=0, rows=(64,)), "the kernel normalizes the last axis only"),
        (dict(n=20000, rows=(2,)), "normalized size 20000 > 16384"),
    ],
)
def test_refused_norms_stay_in_tvm_with_the_reason(case, reason):
    mod = norm_module("layer_norm", **case)
    _, rewritten = offload_for_cpu(mod)
    report = relax_cutlass.offload_report(rewritten)
    assert not _norm_rows(rewritten)
    assert reason in str(report), str(report)


def test_a_narrowing_cast_before_the_add_keeps_the_add_in_tvm():
    """astype(x_f32, f16) + r_f16 rounds x before the add, which the kernel (adding operands as
    stored, in float32) would not: the cast is refused with the reason and stays in TVM; the add
    and the norm are offloaded (on the cast's f16 result)."""
    mod = norm_module("layer_norm", residual="cast", dtype="float32", stream="float16")
    (row,) = _check(mod)
    assert row["residual"] and row["composite"] == "relax_cutlass.norm_layer_norm_add"
    assert row["dtypes"]["data"] == "float16"
    report = str(relax_cutlass.offload_report(offload_for_cpu(mod)[0]))
    assert "cast from float32 to float16 before the add (a narrowing cast)" in report, report


def test_an_intermediate_of_a_decomposed_rmsnorm_used_outside_refuses_the_fusion():
    """Only the sum and the un-cast norm may leave the region (the kernel writes them); the mean
    of x * x also used elsewhere keeps the RMSNorm in TVM, with the reason, as for every kind."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType([8, 64], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            mean = bb.emit(relax.op.mean(bb.emit(relax.op.multiply(x, x)), axis=[-1], keepdims=True))
            rstd = bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(mean, relax.const(1e-6, "float32")))))
            w = relax.const(np.linspace(0.5, 1.5, 64).astype("float32"))
            y = bb.emit(relax.op.multiply(w, bb.emit(relax.op.multiply(x, rstd))))
            gv = bb.emit_output(relax.op.add(y, mean))
        bb.emit_func_output(gv)
    mod = bb.get()
    _, rewritten = offload_for_cpu(mod)
    assert not _norm_rows(rewritten)
    assert "region (mean) is also used outside it" in str(relax_cutlass.offload_report(offload_for_cpu(mod)[0]))


def test_other_kinds_still_refuse_a_leaking_intermediate():
    """extra_outputs is the norm kind's: a GEMM whose bias-add result is used outside is still not
    fused with its activation."""
    from relax_cutlass.kinds import kinds

    assert {k.name: k.extra_outputs for k in kinds()} == {
        "gemm": (),
        "conv2d": (),
        "attention": (),
        "depthwise_conv2d": (),
        "norm": ("sum", "norm"),
        "channel_affine": (),
    }


def test_real_models_norm_regions():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    ids = torch.randint(0, 512, (2, 16))
    counts = {}
    for family in ("bert", "gpt2", "llama"):
        mod = relax_cutlass.from_torch(last_hidden_state(small_transformer(family, layers=1)), (ids,))
        _, _, rewritten = compare_on_cpu(mod, [ids.numpy()], rtol=2e-2)
        counts[family] = sorted(
            (r["norm"], r["residual"], tuple(sorted(r["output_roles"]))) for r in _norm_rows(rewritten)
        )
    assert counts == EXPECTED_MODEL_NORMS, counts


# (norm, residual add fused, outputs) per norm region of a 1-layer model
EXPECTED_MODEL_NORMS = {
    # embeddings LN (its add of the broadcast position embeddings stays in TVM; the f32 norm is the
    # layer's residual, its cast the Q/K/V GEMMs' input), the attention block's add + LN (f32 norm
    # and its cast), the FFN's add + LN (the model's f32 output)
    "bert": [
        ("layer_norm", False, ("norm", "out")),
        ("layer_norm", True, ("norm", "out")),
        ("layer_norm", True, ("out",)),
    ],
    # ln_1 on the embeddings (broadcast add in TVM), ln_2 with the attention's residual add (the sum
    # continues), ln_f with the MLP's residual add (f32 output)
    "gpt2": [
        ("layer_norm", False, ("out",)),
        ("layer_norm", True, ("out",)),
        ("layer_norm", True, ("out", "sum")),
    ],
    # decomposed RMSNorms: input_layernorm, post_attention_layernorm (+ residual add, the sum
    # continues), the final norm (+ residual add, f32 output)
    "llama": [
        ("rms_norm", False, ("out",)),
        ("rms_norm", True, ("out",)),
        ("rms_norm", True, ("out", "sum")),
    ],
}


def test_convnext_blocks_layer_norms():
    """ConvNeXt's channels-last layer norms (fp16 throughout, eps 1e-6): the stem's and the
    downsampling LayerNorm2d (permute -> LN -> permute) and each block's LN after the depthwise conv
    (torchvision's blocks, `torch_models.convnext`; the classifier's LayerNorm2d on the pooled map)."""
    torch = pytest.importorskip("torch")
    from relax_cutlass.testing.models import torch_models

    model = torch_models.convnext(num_classes=10, stages=((96, 192, 1), (192, None, 1)))
    x = torch.randn(2, 3, 32, 32)
    mod = relax_cutlass.from_torch(model, (x,))
    _, _, rewritten = compare_on_cpu(mod, [x.numpy()], rtol=2e-2)
    rows = _norm_rows(rewritten)
    # one function per shape: n = 96 called 3 times (stem, block, downsampling), n = 192 once in
    # the block and once in float32 in the classifier (after the float32 pooling ToMixedPrecision keeps)
    assert sorted((r["mnk"][1], r["dtypes"]["data"], r["epsilon"], r.get("calls", 1)) for r in rows) == [
        (96, "float16", 1e-6, 3),
        (192, "float16", 1e-6, 1),
        (192, "float32", 1e-6, 1),
    ], rows


def test_kernel_layout_and_name():
    def kernel(n, dtype="float16"):
        p = NormProblem(None, n, "layer_norm", 1e-5, dtype, dtype, dtype, dtype, gamma_dtype=dtype, beta_dtype=dtype)
        return NormKernel(p)

    assert row_layout(kernel(768).problem) == row_layout(
        NormProblem(8, 768, "rms_norm", 1e-6, "float32", "float32", "float32", "float16")
    )
    assert kernel(96).layout.row_threads == 32 and kernel(96).layout.vec == 8
    assert kernel(1000).layout.vectors == 4  # 125 vectors of 8 over 32 lanes
    big = kernel(4096).layout
    assert big.row_threads == 256 and big.vec * big.vectors * big.row_threads >= 4096
    assert kernel(5120).layout.row_threads == 320
    assert kernel(97).layout.vec == 1
    assert "eps1em05" in kernel(96).name


def test_sm90_norm_kernels_launch_as_programmatic_dependents():
    """On sm_90 the norm kernel sits between PDL-launched SM90 GEMMs (BERT-large: 49 norms, 4.4 us
    each on the H100): it is launched with the PDL attribute too, waits for the kernel before it
    ahead of its first load and lets the next one be scheduled once its row is in registers.
    Below sm_90 it launches plainly (the instructions are compiled out)."""
    from relax_cutlass.kinds.norm.emit import emit_kernel

    p = NormProblem(
        None, 1024, "layer_norm", 1e-5, "float16", "float16", "float16", "float16", "float16", "float16", "float16"
    )
    sm90 = emit_kernel(NormKernel(p, target=90)).text
    body = sm90[sm90.index("NormKernel(RelaxCutlassNormArgs a) {") :]
    assert (
        body.index("PdlWaitForPrerequisites();") < body.index("Load<TData>") < body.index("PdlLetDependentsLaunch();")
    )
    assert "constexpr bool kPdl = true;" in sm90 and "cudaLaunchAttributeProgrammaticStreamSerialization" in sm90
    assert "config.numAttrs = kPdl && LaunchWithPdl(config.stream) ? 1 : 0;" in sm90  # not in graph capture
    assert "constexpr bool kPdl = false;" in emit_kernel(NormKernel(p, target=80)).text


def test_reference_matches_numpy_layer_norm():
    from relax_cutlass.kinds.norm.reference import norm_reference

    rng = np.random.default_rng(0)
    x, r, g, b = (
        rng.standard_normal((3, 8, 32)),
        rng.standard_normal((3, 8, 32)),
        rng.standard_normal(32),
        rng.standard_normal(32),
    )
    s, y = norm_reference(x, r, g, b, "layer_norm", 1e-5)
    want = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(y, want, rtol=1e-12)
    _, y = norm_reference(x, None, g, None, "rms_norm", 1e-6)
    np.testing.assert_allclose(y, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g, rtol=1e-12)


def test_glue_checks_shapes_and_passes_both_outputs():
    from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
    from relax_cutlass.stages.constants import offloaded_functions
    from relax_cutlass.stages.emit import emit_glue

    mod = norm_module("layer_norm", residual="cast", cast="float16", leak=("sum", "norm"))
    partitioned, _ = offload_for_cpu(mod)
    regions = plan_regions(
        [f for _, f in offloaded_functions(partitioned)], CodegenOptions.create("sm_80", compile=False)
    )
    glue = emit_glue(regions, "m").text
    assert 'CheckDim(fn, "residual size", Numel(residual), Numel(data), residual)' in glue
    assert 'CheckDim(fn, "gamma size", Numel(gamma), 64, gamma)' in glue
    for role in ("sum", "norm", "out"):
        assert "TensorArg(fn, ffi_args, " in glue and f'"{role}", &{role}' in glue
    assert "const_cast<void*>(Data(sum)), const_cast<void*>(Data(norm))" in glue


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", [80, pytest.param(90, marks=pytest.mark.slow)])
def test_norm_kernels_compile(arch):
    """A warp-per-row and a CTA-per-row kernel, fp16/bf16/fp32, with the residual and both extra
    outputs, for sm_80 and sm_90a, with a module's glue (built and loaded as a static library)."""
    from relax_cutlass.stages.codegen import CodegenOptions, build_regions, plan_regions
    from relax_cutlass.stages.constants import offloaded_functions

    options = CodegenOptions.create("sm_90a" if arch == 90 else "sm_80")
    for i, case in enumerate(
        [
            dict(form="layer_norm", residual="cast", cast="float16", leak=("sum", "norm"), n=768),
            dict(form="rms_decomposed", residual="add", cast="bfloat16", leak=("sum",), n=5120, rows=("s",)),
            dict(form="layer_norm", dtype="bfloat16", n=1000),
            dict(form="rms_norm", dtype="float16", n=97),
        ]
    ):
        partitioned, _ = offload_for_cpu(norm_module(**case))
        regions = plan_regions([f for _, f in offloaded_functions(partitioned)], options)
        assert [r.kernel.problem.n for r in regions] == [case["n"]]
        build_regions(regions, options, f"norm_test_{arch}_{i}")


def _two_norms_of_one_sum():
    """x16 -> astype(x16) + r (float32) read by two layer norms, each cast to float16 (GPT-NeoX's
    parallel residual: the attention's and the MLP's norms of one hidden state)."""
    from tvm import relax

    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((2, 8, 64), "float16"))
    r = relax.Var("r", relax.TensorType((2, 8, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, r]):
        with bb.dataflow():
            total = bb.emit(relax.op.add(bb.emit(relax.op.astype(x, "float32")), r))
            outs = []
            for _ in range(2):
                gamma, beta = (relax.const(rng.uniform(0.5, 1.5, (64,)).astype("float32")) for _ in range(2))
                norm = bb.emit(relax.op.nn.layer_norm(total, gamma, beta, axes=[-1]))
                outs.append(bb.emit(relax.op.astype(norm, "float16")))
            out = bb.emit_output(relax.op.add(outs[0], outs[1]))
        bb.emit_func_output(out)
    return bb.get()


def test_two_norms_of_one_residual_sum_are_both_offloaded():
    """Regression (GPT-NeoX in the zoo and the transformers sweep: one layer norm per layer was
    "offloaded, then returned to TVM at codegen" because its region, what the other norm's region
    left of the same pattern, kept that pattern's name): the first norm takes the add, the second
    is offloaded as the plain norm it is; values as the original's."""
    mod = _two_norms_of_one_sum()
    rows = _check(mod)
    assert sorted(r["composite"] for r in rows) == [
        "relax_cutlass.norm_layer_norm_add_cast_one_cast",
        "relax_cutlass.norm_layer_norm_cast",
    ], rows
    _, rewritten = offload_for_cpu(mod)
    assert not relax_cutlass.offload_report(rewritten).left_in_tvm
