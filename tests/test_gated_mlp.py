"""The gated MLP's multiply, act(x @ W_gate) * (x @ W_up), fused into a GEMM epilogue:
one GEMM takes the other's product as its epilogue operand (Epilogue.residual_op "multiply"), so
the elementwise multiply kernel, which re-read both products, is gone. The residual-add forms are
unchanged; a multiply the epilogue cannot compute (a broadcast operand, another dtype) is refused
with the reason."""

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.epilogue import Epilogue
from relax_cutlass.kinds.gemm.emit import emit_gemm_kernel
from relax_cutlass.kinds.gemm.emit_sm90 import epilogue_tree
from relax_cutlass.kinds.gemm.patterns import all_gemm_specs
from relax_cutlass.kinds.gemm.records import GemmKernel, GemmProblem, TileConfig
from relax_cutlass.kinds.gemm.select import choose_kernel
from relax_cutlass.prepare import bind_weights
from relax_cutlass.testing.harness import compare_on_cpu, offload_for_cpu, op_names, random_inputs
from relax_cutlass.testing.models import dense_epilogue_model, gated_mlp_model, random_weights


def _gated(activation="silu", m=24, hidden=64, intermediate=96, **kwargs) -> tvm.IRModule:
    mod = gated_mlp_model(m, hidden, intermediate, activation=activation, **kwargs)
    return bind_weights(mod, random_weights(mod))


@pytest.mark.parametrize(
    "activation, arch",
    [("silu", "sm_90a"), ("silu", "sm_80"), ("gelu", "sm_90a"), ("gelu_tanh", "sm_80")],
)
def test_the_gated_multiply_fuses_into_a_gemm_epilogue(activation, arch):
    """Llama (silu), GPT-style (gelu) and Gemma (gelu_tanh) gated MLPs: the gate GEMM computes
    act(acc) * up in its epilogue; no multiply (and no activation) is left in TVM, and the result
    is the original's."""
    mod = _gated(activation)
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod), rtol=2e-3, arch=arch)
    report = relax_cutlass.offload_report(rewritten)
    assert sorted(r["epilogue"] for r in report.offloaded) == sorted(["none", "none", f"{activation}+residual_mul"])
    fused = next(r for r in report.offloaded if r["epilogue"].endswith("residual_mul"))
    assert fused["kernel"].endswith(f"_{activation}_residual_mul") and fused["kernel"].startswith(f"sm{arch[3:5]}_")
    assert not report.left_in_tvm and not report.not_fused
    assert "relax.multiply" not in op_names(rewritten) and f"relax.nn.{activation}" not in op_names(rewritten)


@pytest.mark.parametrize("up_first", [False, True])
def test_either_operand_order_and_a_symbolic_m_with_biases(up_first):
    """up * silu(gate + b) as well as silu(gate + b) * up, on a symbolic M."""
    mod = _gated("silu", m="m", bias=True, up_first=up_first)
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod, m=13), rtol=2e-3, arch="sm_90a")
    epilogues = sorted(r["epilogue"] for r in relax_cutlass.offload_report(rewritten).offloaded)
    assert epilogues == ["bias", "bias+silu+residual_mul", "none"]
    assert "relax.multiply" not in op_names(rewritten)


def test_residual_add_forms_are_unchanged():
    """The add's composite, kernel names and C++ are what they were: the multiply is a new form beside them."""
    mod = dense_epilogue_model(64, 32, 16, activation="gelu", residual=True, residual_relu=True)
    _, rewritten = offload_for_cpu(mod, arch="sm_90a")
    (row,) = relax_cutlass.offload_report(rewritten).offloaded
    assert row["epilogue"] == "bias+gelu+residual_add+relu" and row["kernel"].endswith("_bias_gelu_residual_add_relu")
    names = [s.name for s in all_gemm_specs() if s.residual_op == "add"]
    assert "relax_cutlass.dense_bias_silu_residual_add_relu_cast" in names and len(names) == 168
    muls = [s for s in all_gemm_specs() if s.residual_op == "multiply"]
    assert len(muls) == 56 and not any(s.residual_relu for s in muls)
    assert "relax_cutlass.matmul_silu_residual_mul" in {s.name for s in muls}
    problem = GemmProblem(64, 128, 64, True)
    for family, arch in (("sm80", 80), ("sm90", 90)):
        add = choose_kernel(problem, Epilogue(activation="silu", residual=True), arch, family=family)
        mul = choose_kernel(
            problem, Epilogue(activation="silu", residual=True, residual_op="multiply"), arch, family=family
        )
        add_src, mul_src = emit_gemm_kernel(add).text, emit_gemm_kernel(mul).text
        assert "cutlass::plus" in add_src and "cutlass::multiplies" not in add_src
        assert "cutlass::multiplies" in mul_src
        # the same C++ but for the functor and the name
        assert mul_src.replace("cutlass::multiplies", "cutlass::plus").replace("_mul", "_add") == add_src


def test_the_sm90_tree_multiplies_by_the_source():
    epi = Epilogue(bias=True, activation="silu", residual=True, residual_op="multiply")
    tree = epilogue_tree(GemmKernel(GemmProblem(None, 256, 128, True), epi, TileConfig((128, 128, 64)), arch=90))
    assert "Sm90Compute<cutlass::multiplies, float" in tree.type and "Sm90SrcFetch" in tree.type
    assert tree.type.count("Sm90EVT<") == 4 and tree.args.count("{") == tree.args.count("}")


def test_a_multiply_needs_a_residual():
    with pytest.raises(ValueError, match="needs a residual"):
        Epilogue(residual_op="multiply")
    with pytest.raises(ValueError, match="unknown residual op"):
        Epilogue(residual=True, residual_op="divide")


def _refused(rewritten) -> list[str]:
    report = relax_cutlass.offload_report(rewritten)
    return [reason for r in report.not_fused for refusal in r["refused"] for reason in refusal["reasons"]]


def _scaled_gemm(scale_shape, scale_dtype="float16", out_dtype="float16"):
    """main(x, s) = (x @ W) * s [cast], the GEMM's product multiplied by `s`."""
    rng = np.random.default_rng(0)
    w = (rng.uniform(-1, 1, (32, 48)) / 6).astype("float16")
    x = relax.Var("x", relax.TensorType((16, 32), "float16"))
    s = relax.Var("s", relax.TensorType(scale_shape, scale_dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, s]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(w), out_dtype=scale_dtype))
            y = bb.emit(relax.op.multiply(y, s))
            if out_dtype != scale_dtype:
                y = bb.emit(relax.op.astype(y, out_dtype))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_a_broadcast_multiply_is_refused_with_the_reason():
    mod = _scaled_gemm((48,))
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod), rtol=2e-3, arch="sm_90a")
    assert [r["epilogue"] for r in relax_cutlass.offload_report(rewritten).offloaded] == ["none"]
    assert "relax.multiply" in op_names(rewritten)
    (reason,) = _refused(rewritten)
    assert reason.startswith("multiply operand shape") and "(broadcast multiply operands are not fused)" in reason


def test_a_multiply_by_an_operand_of_another_dtype_is_refused_with_the_reason():
    """(x @ W) * s cast to float32 (Relax multiplies only equal dtypes, so a cast is the only way
    the operand's dtype can differ from the output's): the epilogue reads its operand as the
    output's element type, so the cast's form is refused, with the reason, and the multiply fuses
    without the cast."""
    mod = _scaled_gemm((16, 48), out_dtype="float32")
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod), rtol=2e-3, arch="sm_90a")
    report = relax_cutlass.offload_report(rewritten)
    assert [r["epilogue"] for r in report.offloaded] == ["residual_mul"]
    (refused,) = report.not_fused
    assert [r["pattern"] for r in refused["refused"]] == ["relax_cutlass.matmul_residual_mul_cast"]
    assert refused["refused"][0]["reasons"] == ["multiply operand dtype float16 differs from the output dtype float32"]
    assert op_names(rewritten) == ["relax.call_dps_packed", "relax.astype"]


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "family, arch, opcode", [("sm80", 80, "HMMA"), pytest.param("sm90", 90, "HGMMA", marks=pytest.mark.slow)]
)
def test_multiply_kernels_compile(family, arch, opcode):
    """The SM80 residual block with cutlass::multiplies and the SM90 EVT with a multiply node
    (bias + silu, then * the other product) through nvcc (no GPU: the SASS holds the family's
    tensor-core instructions, which compile_all's guard checked; about a minute for SM90)."""
    from relax_cutlass.stages.emit import emit_kernel
    from relax_cutlass.toolkit.compile import compile_all
    from relax_cutlass.toolkit.sass_check import mma_counts

    epilogue = Epilogue(bias=True, activation="silu", residual=True, residual_op="multiply")
    kernel = choose_kernel(GemmProblem(None, 1376, 256, True), epilogue, arch, family=family)
    assert f"sm{kernel.arch}" == family and kernel.name.endswith("_bias_silu_residual_mul")
    ((obj, _),) = compile_all([emit_kernel(kernel)], arch).values()
    counts, _, _ = mma_counts(obj, (opcode,))
    assert counts[opcode] > 0


def test_a_transformers_llama_fuses_the_multiply_of_every_layer():
    """The zoo's Llama form (transformers' LlamaModel through torch.export, as llama_gqa and
    llama_8b_2l): each layer's gate GEMM computes silu(acc) * up, on both kernel families."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    mod = relax_cutlass.from_torch(
        last_hidden_state(small_transformer("llama", layers=2)), (torch.randint(0, 512, (1, 64)),)
    )
    for arch, prefix in (("sm_90a", "sm90_"), ("sm_80", "sm80_")):
        report = relax_cutlass.offload_report(relax_cutlass.offload_pipeline(arch, profile="never", compile=False)(mod))
        fused = [r for r in report.offloaded if r["epilogue"] == "silu+residual_mul"]
        assert len(fused) == 2 and all(r["kernel"].startswith(prefix) for r in fused), str(report)
        assert not any(r["epilogue"] == "silu" for r in report.offloaded)


def test_the_profiler_reference_multiplies():
    """Stage 2 of the profiler checks a multiply epilogue's kernels against act(acc + bias) * operand."""
    from relax_cutlass.kinds.reference import with_epilogue

    acc, bias, operand = np.array([[1.0, -2.0]]), np.array([0.5, 0.5]), np.array([[3.0, 4.0]])
    epilogue = {"bias": True, "activation": "relu", "residual": True, "residual_op": "multiply"}
    np.testing.assert_allclose(with_epilogue(acc, epilogue, bias, operand), [[4.5, 0.0]])
    np.testing.assert_allclose(with_epilogue(acc, {**epilogue, "residual_op": "add"}, bias, operand), [[4.5, 4.0]])
