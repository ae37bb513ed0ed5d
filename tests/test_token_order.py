"""Token-axis transposes around row-wise kernels (`rewrites/token_order.py`).

Regression (torchvision's ViT-B/16 in the zoo, H200, batch 8): nn.MultiheadAttention's
sequence-first transposes, three per layer (before the in-projection, after the attention, after
the out-projection), took 0.15 of its 1.33 ms. SinkTokenPermutes moves the first past the
in-projection, where the attention reads q, k and v in place; CancelRowPermutations lets the
out-projection read the attention's rows in their own order."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import (
    build_cpu,
    offload_for_cpu,
    offload_pipeline_on_cpu,
    op_names,
    run_vm,
    serve_regions_on_cpu,
)
from relax_cutlass.transform import AccumulateInFloat32, SinkTokenPermutes

torch = pytest.importorskip("torch")


def test_vit_keeps_no_token_transpose():
    """torchvision-style ViT (nn.MultiheadAttention, batch_first): the only permutes left in main
    are the image's (to NHWC, then into patches: one TVM kernel), before the first offloaded call;
    every attention reads the packed projection in place; values as TVM's build of the original
    and torch's."""
    from relax_cutlass.testing.models.torch_models import vit

    torch.manual_seed(0)
    model = vit(image=32, patch=16, hidden=128, layers=2, heads=2)
    x = torch.randn(2, 3, 32, 32)
    mod = relax_cutlass.from_torch(model, (x,))
    offloaded = offload_pipeline_on_cpu(mod, "sm_90a", profile="never")
    names = op_names(offloaded)
    last_permute = len(names) - 1 - names[::-1].index("relax.permute_dims")
    assert last_permute < names.index("relax.call_dps_packed"), offloaded.script(show_meta=False)
    rows = [r for r in relax_cutlass.offload_report(offloaded).offloaded if r["op"] == "attention"]
    assert sum(r.get("calls", 1) for r in rows) == 2
    assert all(set(r["attention"]["packed"]) == {"query", "key", "value"} for r in rows), rows
    got = run_vm(build_cpu(offloaded), [x.numpy()])
    assert rel_error(got, run_vm(build_cpu(mod), [x.numpy()])) < 1e-2
    with torch.no_grad():
        assert rel_error(got, model(x).numpy()) < 2e-2


def _projection(restore: bool, residual: bool = False) -> tvm.IRModule:
    """(B, S, E) -> permute to (S, B, E) -> rows -> x W + b [+ r] -> (S, B, N) [-> permute back]."""
    b, s, e, n = 2, 8, 16, 24
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((b, s, e), "float16"))
    r = relax.Var("r", relax.TensorType((s * b, n), "float16"))
    w = relax.const(rng.uniform(-0.3, 0.3, (e, n)).astype("float16"))
    bias = relax.const(rng.uniform(-1, 1, (n,)).astype("float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, r] if residual else [x]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(x, [1, 0, 2])), (s * b, e)))
            y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(rows, w)), bias))
            if residual:
                y = bb.emit(relax.op.add(y, r))
            y = bb.emit(relax.op.reshape(y, (s, b, n)))
            out = bb.emit_output(relax.op.permute_dims(y, [1, 0, 2]) if restore else y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(("restore", "residual"), [(True, False), (False, False), (True, True)])
def test_row_permutations_cancel_only_around_a_row_wise_region(restore, residual):
    """Both transposes go where the views after the GEMM put its rows back and nothing else reads
    rows (a residual does); values as TVM's build of the original either way."""
    mod = _projection(restore, residual)
    partitioned, rewritten = offload_for_cpu(mod)
    cancelled = restore and not residual
    assert op_names(rewritten).count("relax.permute_dims") == (
        0 if cancelled else op_names(mod).count("relax.permute_dims")
    )
    serve_regions_on_cpu(partitioned)
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-1, 1, (2, 8, 16)).astype("float16")]
    inputs += [rng.uniform(-1, 1, (16, 24)).astype("float16")] if residual else []
    got, want = run_vm(build_cpu(rewritten), inputs), run_vm(build_cpu(AccumulateInFloat32()(mod)), inputs)
    assert rel_error(got, want) < 2e-3


def _in_projection(axes: list[int]) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((2, 8, 16), "float16"))
    rng = np.random.default_rng(0)
    w = relax.const(rng.uniform(-0.3, 0.3, (16 if axes[-1] == 2 else 8, 24)).astype("float16"))
    bias = relax.const(rng.uniform(-1, 1, (24,)).astype("float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(bb.emit(relax.op.permute_dims(x, axes)), w), bias))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("axes", [[1, 0, 2], [0, 2, 1]])
def test_a_token_permute_sinks_past_the_projection_only_if_it_keeps_the_features_last(axes):
    mod = _in_projection(axes)
    sunk = SinkTokenPermutes()(mod)
    names = op_names(sunk)
    assert (names[-1] == "relax.permute_dims") == (axes == [1, 0, 2]), names
    x = np.random.default_rng(1).uniform(-1, 1, (2, 8, 16)).astype("float16")
    np.testing.assert_array_equal(run_vm(build_cpu(sunk), [x]), run_vm(build_cpu(mod), [x]))
