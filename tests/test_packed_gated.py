"""SplitPackedGatedProjections (rewrites/gated.py): a packed gate|up projection, chunked in two
and read only elementwise (Phi-3's gate_up_proj), becomes two GEMMs, so act(gate) * up fuses
into one GEMM epilogue; packed projections that feed attention heads, and anything else, stay."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.rewrites.gated import split_packed_gated_projections
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import build_cpu, compare_on_cpu, op_names, random_inputs, run_vm


def _packed_mlp(m=24, hidden=64, inter=96, *, form="split", bias=False, act="silu", head_split=False):
    """x @ W_gu [+ b] -> (gate, up) by split or two strided_slices -> act(gate) * up -> @ W_down."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, m, hidden), "float16"))
    w = relax.const(rng.uniform(-0.2, 0.2, (hidden, 2 * inter)).astype("float16"))
    w_down = relax.const(rng.uniform(-0.2, 0.2, (inter, hidden)).astype("float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w, out_dtype="float16"))
            if bias:
                y = bb.emit(relax.op.add(y, relax.const(rng.uniform(-1, 1, (2 * inter,)).astype("float16"))))
            if form == "split":
                parts = bb.emit(relax.op.split(y, [inter], axis=-1))
                gate, up = bb.emit(relax.TupleGetItem(parts, 0)), bb.emit(relax.TupleGetItem(parts, 1))
            else:
                gate = bb.emit(relax.op.strided_slice(y, axes=[2], begin=[0], end=[inter]))
                up = bb.emit(relax.op.strided_slice(y, axes=[2], begin=[inter], end=[2 * inter]))
            if head_split:  # a consumer that is no elementwise op: the packed GEMM stays
                up = bb.emit(relax.op.reshape(relax.op.reshape(up, (1, m, 4, inter // 4)), (1, m, inter)))
            activated = {
                "silu": lambda t: relax.op.multiply(t, relax.op.sigmoid(t)),  # Phi-3's decomposed SiLU
                "gelu": relax.op.nn.gelu,
            }[act](gate)
            h = bb.emit(relax.op.multiply(up, bb.emit(activated)))
            out = bb.emit_output(relax.op.matmul(h, w_down, out_dtype="float16"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "form, bias, act", [("split", False, "silu"), ("slices", True, "silu"), ("split", True, "gelu")]
)
def test_a_packed_gate_up_projection_fuses_as_a_gated_mlp(form, bias, act):
    mod = _packed_mlp(form=form, bias=bias, act=act)
    split = split_packed_gated_projections(mod["main"])
    assert op_names(tvm.IRModule({"main": split})).count("relax.matmul") == 3
    assert "relax.split" not in op_names(tvm.IRModule({"main": split}))
    _, _, rewritten = compare_on_cpu(mod, random_inputs(mod), rtol=2e-3, arch="sm_90a")
    report = relax_cutlass.offload_report(rewritten)
    epilogues = sorted(r["epilogue"] for r in report.offloaded)
    gated = f"{'bias+' if bias else ''}{act}+residual_mul"
    assert gated in epilogues and len(epilogues) == 3, epilogues
    assert "relax.multiply" not in op_names(rewritten) and not report.left_in_tvm


def test_a_packed_projection_read_by_anything_else_stays():
    mod = _packed_mlp(head_split=True)
    assert split_packed_gated_projections(mod["main"]).same_as(mod["main"])


def test_phi3_gated_mlp_fuses_and_matches_torch():
    """A transformers Phi-3 (packed gate_up_proj, decomposed SiLU): without the split, every MLP
    multiply stays in TVM with the activation. TVM's CUDA build of the imported module works too
    (the empty pass-through of its full-width rotary embedding, which TVM cannot build, is
    dropped)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from relax_cutlass.testing.harness import offload_pipeline_on_cpu
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    config = transformers.Phi3Config(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
        vocab_size=512, pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = last_hidden_state(transformers.Phi3Model(config).eval())
    ids = torch.randint(0, 512, (1, 24))
    mod = relax_cutlass.from_torch(model, (ids,))
    offloaded = offload_pipeline_on_cpu(mod, "sm_90a", profile="never")
    report = relax_cutlass.offload_report(offloaded)
    assert "silu+residual_mul" in [r["epilogue"] for r in report.offloaded], str(report)
    assert [r["op"] for r in report.offloaded].count("attention") == 1
    got, want = run_vm(build_cpu(offloaded), [ids.numpy()]), run_vm(build_cpu(mod), [ids.numpy()])
    with torch.no_grad():
        expected = model(ids).numpy()
    assert rel_error(got, want) < 1e-2 and rel_error(got, expected) < 1e-2
    tvm.compile(mod, tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm"))
