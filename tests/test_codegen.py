"""CutlassCodegen structure, options, emitted C++ and the offload report (no nvcc run; the host glue
is compiled with the host compiler)."""

import json
import os

import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.epilogue import ACTIVATIONS
from relax_cutlass.prepare import bind_weights
from relax_cutlass.stages.codegen import REGIONS_ATTR, CodegenOptions, plan_regions
from relax_cutlass.stages.constants import offloaded_functions
from relax_cutlass.stages.emit import emit_glue, emit_kernel
from relax_cutlass.testing.models import bert_encoder_layer, dense_epilogue_model, random_weights
from relax_cutlass.transform import CutlassCodegen, LiftConstants, PartitionForCutlass


def regions_of(mod, **options):
    mod = LiftConstants()(PartitionForCutlass()(mod))
    return plan_regions([f for _, f in offloaded_functions(mod)], CodegenOptions.create("sm_80", **options))


def extern_calls(func):
    calls = []
    relax.analysis.post_order_visit(
        func.body,
        lambda e: (
            calls.append(e)
            if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_dps_packed"
            else None
        ),
    )
    return calls


def test_pipeline_rewrites_regions_into_extern_calls():
    mod = dense_epilogue_model("m", 64, 32, activation="gelu", residual=True)
    mod = bind_weights(mod, random_weights(mod))
    out = tvm.transform.Sequential(
        [PartitionForCutlass("sm_80"), LiftConstants(), CutlassCodegen("sm_80", compile=False)]
    )(mod)
    assert not list(offloaded_functions(out))
    calls = extern_calls(out["main"])
    assert len(calls) == 1
    assert isinstance(calls[0].args[0], relax.ExternFunc)
    rows = json.loads(str(out.attrs[REGIONS_ATTR]))
    assert rows[0]["symbol"] == calls[0].args[0].global_symbol
    assert rows[0]["epilogue"] == "bias+gelu+residual_add"
    assert rows[0]["mnk"] == ["dynamic", 64, 32]


def test_offload_pipeline_is_a_tvm_pass_usable_in_sequential():
    p = relax_cutlass.offload_pipeline("sm_90a", compile=False)
    assert isinstance(p, tvm.transform.Pass)
    seq = tvm.transform.Sequential([relax.transform.FoldConstant(), p, relax.transform.DeadCodeElimination()])
    out = seq(dense_epilogue_model(128, 64, 32, activation="relu"))
    assert len(extern_calls(out["main"])) == 1


def test_report_before_and_after_offload_agree():
    mod = bert_encoder_layer(batch=2, seq=16, hidden=64, ffn=256, heads=4)
    mod = bind_weights(mod, random_weights(mod))
    before = relax_cutlass.offload_report(mod)
    after = relax_cutlass.offload_report(relax_cutlass.offload_pipeline("sm_80", compile=False)(mod))
    # six dense layers (q, k and v as one: FuseParallelProjections), the attention, and the two
    # residual add + layer norms (the norm kind)
    assert len(before.offloaded) == len(after.offloaded) == 7
    assert [r["op"] for r in after.offloaded].count("norm") == 2
    assert [r["kernel"] for r in before.offloaded] == [r["kernel"] for r in after.offloaded]
    assert [r["op"] for r in after.offloaded].count("attention") == 1
    assert not after.left_in_tvm  # the two batched attention matmuls are inside the attention region
    text = str(after)
    assert "7 call(s) of 7 offloaded function(s)" in text and "bias+gelu" in text
    assert "[offloaded] attention B=2 N=4 S=16 S_kv=16 H=16/16" in text


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(accumulator="float64"), ValueError, "accumulator"),
        (dict(tiles="big"), TypeError, "unknown relax_cutlass option"),
    ],
)
def test_bad_options_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        CutlassCodegen("sm_80", **kwargs)


@pytest.mark.parametrize("arch,match", [("sm_70", "not supported"), ("volta", "not understood")])
def test_bad_arch_is_named(arch, match):
    with pytest.raises(ValueError, match=match):
        relax_cutlass.offload_pipeline(arch)


def test_auto_arch_without_gpu_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="needs a visible NVIDIA GPU"):
        relax_cutlass.offload_pipeline("auto")


def test_arch_parsing():
    from relax_cutlass.arch import parse_arch

    assert [parse_arch(a) for a in ("sm_80", "sm_90a", "90", 86, "SM_89")] == [80, 90, 90, 86, 89]


@pytest.mark.parametrize("activation", sorted(set(ACTIVATIONS) - {"identity"}))
def test_kernel_source_uses_the_activation_functor(activation):
    (region,) = regions_of(dense_epilogue_model(256, 128, 64, activation=activation))
    text = emit_kernel(region.kernel).text
    assert ACTIVATIONS[activation].for_output("float16").functor in text
    assert "GemmUniversalAdapter" in text and "transposed_problem" in text


def test_residual_kernel_uses_broadcast_epilogue():
    (region,) = regions_of(dense_epilogue_model(256, 128, 64, activation="gelu", residual=True, residual_relu=True))
    text = emit_kernel(region.kernel).text
    assert "GemmUniversalWithBroadcast" in text
    assert "LinearCombinationResidualBlock" in text
    assert "RelaxCutlassGelu16, cutlass::plus, cutlass::epilogue::thread::ReLu" in text  # fp16 output


def test_layouts_follow_the_weight():
    (dense,) = regions_of(dense_epilogue_model(256, 128, 64))
    (mm,) = regions_of(dense_epilogue_model(256, 128, 64, transposed=False))
    assert dense.kernel.problem.b_transposed and not mm.kernel.problem.b_transposed
    assert dense.kernel.name != mm.kernel.name


def test_alignment_and_accumulator_reach_the_kernel():
    (r8,) = regions_of(dense_epilogue_model(256, 128, 64))
    (r2,) = regions_of(dense_epilogue_model(256, 130, 66), accumulator="float16")
    assert r8.kernel.problem.alignment == 8 and r2.kernel.problem.alignment == 2
    assert "_a2_" in r2.kernel.name and "f16acc" in r2.kernel.name
    assert "cutlass::ComplexTransform::kNone, 2" in emit_kernel(r2.kernel).text


def test_glue_checks_every_argument():
    mod = dense_epilogue_model("m", 128, 64, activation="relu", residual=True)
    regions = regions_of(mod)
    glue = emit_glue(regions, "mod").text
    (r,) = regions
    assert f"int __tvm_ffi_{r.symbol}(" in glue  # tvm-ffi's C ABI (tests/test_link.py calls it)
    for role in r.arg_roles + ("out",):
        assert f'CheckTensor(fn, "{role}"' in glue
    assert "TVMFFIEnvGetStream(kDLCUDA" in glue
    assert '"bias size"' in glue and '"residual dim"' in glue


def _residual_is_lhs_model(shape, conv: bool) -> tvm.IRModule:
    """y = relu(op(x) + b) + x: the block input is both the op's input and the residual."""
    x = relax.Var("x", relax.TensorType(shape, "float16"))
    c = shape[-1]
    w = relax.Var("w", relax.TensorType([c, 3, 3, c] if conv else [c, c], "float16"))
    b = relax.Var("b", relax.TensorType([c], "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            if conv:
                y = relax.op.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="OHWI")
            else:
                y = relax.op.matmul(x, bb.emit(relax.op.permute_dims(w)))
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(y), b))))
            out = bb.emit_output(bb.emit(relax.op.add(y, x)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("conv", [False, True], ids=["gemm", "conv2d"])
def test_glue_compiles_when_the_residual_is_the_input(conv):
    """A diamond whose residual is the op's own input: one parameter in two roles (found by the GPU
    suite's random graphs, where the glue did not compile)."""
    from relax_cutlass.toolkit.compile import compile_all

    mod = _residual_is_lhs_model([2, 8, 8, 16] if conv else [64, 32], conv)
    (region,) = regions_of(mod)
    assert region.role_aliases == (("residual", "data" if conv else "lhs"),)
    assert region.kernel.epilogue.describe() == "bias+relu+residual_add"
    glue = emit_glue([region], "aliased")
    assert "const DLTensor* residual = " in glue.text
    ((_, cached),) = compile_all([glue], 80).values()  # the host compiler; raises CompileError


def test_compile_errors_carry_log_and_source(tmp_path, monkeypatch):
    from relax_cutlass.toolkit.compile import CompileError, Source, compile_all

    monkeypatch.setenv("RELAX_CUTLASS_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompileError) as info:
        compile_all([Source("broken", "this is not C++;", "host")], 80)
    assert os.path.exists(info.value.source_path)
    assert "this is not C++" in info.value.source_path.read_text()
    assert "error" in info.value.log


def test_regions_are_planned_once_per_build(monkeypatch):
    """CutlassCodegen plans the regions (for the report and the build checks) and RunCodegen's
    callback takes that plan instead of planning the same functions again."""
    from relax_cutlass.stages import codegen

    calls = []
    plan = codegen.plan_regions
    monkeypatch.setattr(codegen, "plan_regions", lambda *args, **kw: (calls.append(1), plan(*args, **kw))[1])
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "float16"))
    w1, w2 = (relax.Var(name, relax.TensorType((32, 32), "float16")) for name in ("w1", "w2"))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, w1)))
            out = bb.emit_output(relax.op.matmul(h, w2))
        bb.emit_func_output(out)
    rewritten = relax_cutlass.offload_pipeline("sm_80", compile=False)(bb.get())
    assert len(calls) == 1 and len(relax_cutlass.offload_report(rewritten).offloaded) == 2
