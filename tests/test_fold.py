"""FoldWeightsInNumpy: the same constants TVM's FoldConstant computes, without compiling each op."""

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_cutlass.rewrites.fold import FoldWeightsInNumpy
from relax_cutlass.testing.harness import build_cpu, run_vm

torch_models = pytest.importorskip(
    "relax_cutlass.testing.models.torch_models", reason="needs the 'models' extra (torch)"
)


def _constants(mod):
    found = []
    relax.analysis.post_order_visit(
        mod["main"].body, lambda e: isinstance(e, tvm.ir.GenericConst) and found.append(e.value.numpy())
    )
    return found


@pytest.mark.parametrize("builder", ["resnet", pytest.param("vit", marks=pytest.mark.slow)])
def test_numpy_folding_gives_tvms_constants_bit_for_bit(builder, monkeypatch):
    """A bound model through bind_float16 (batch-norm folding, NHWC filters, fp16 casts, weight
    transposes) with the numpy folder and without it: the same constants, bit for bit, the same
    outputs, and no weight op left for FoldConstant to compile."""
    from relax_cutlass import prepare
    from relax_cutlass.rewrites import fold

    if builder == "resnet":
        mod, weights = torch_models.resnet50_module(batch=1, image=32, blocks=(1, 1, 1, 1), width=8)
    else:
        mod, weights = torch_models.vit_module(batch=2)
    with_numpy = prepare.bind_float16(mod, weights)
    monkeypatch.setattr(fold, "_NumpyFolder", lambda: _Identity())
    tvm_only = prepare.bind_float16(mod, weights)
    ours, theirs = _constants(with_numpy), _constants(tvm_only)
    assert len(ours) == len(theirs) > 10
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.atleast_1d(a).view(np.uint8), np.atleast_1d(b).view(np.uint8))
    x = np.random.default_rng(0).uniform(-1, 1, [int(d) for d in mod["main"].params[0].ty.shape.values])
    x = x.astype("float32")
    np.testing.assert_array_equal(run_vm(build_cpu(with_numpy), [x]), run_vm(build_cpu(tvm_only), [x]))


class _Identity:
    def visit_expr(self, expr):
        return expr


def test_only_constant_operands_are_folded():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    w = np.arange(32, dtype="float32").reshape(8, 4)
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(relax.const(w)))
            half = bb.emit(relax.op.astype(wt, "float16"))
            y = bb.emit(relax.op.add(relax.op.astype(x, "float16"), half))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    folded = FoldWeightsInNumpy()(bb.get())
    consts = _constants(folded)
    assert any(c.dtype == np.float16 and c.shape == (4, 8) for c in consts)
    names = []
    relax.analysis.post_order_visit(
        folded["main"].body, lambda e: isinstance(e, relax.Call) and names.append(getattr(e.op, "name", ""))
    )
    assert "relax.permute_dims" not in names and names.count("relax.astype") == 1  # x's cast stays


def test_scalar_constants_stay_scalars():
    """A folded 0-d constant must stay 0-d: R.full and the scalar epilogue literals need rank 0
    (numpy's ascontiguousarray would have made it shape (1,); BERT's SDPA mask broke on it)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            fill = bb.emit(relax.op.astype(relax.const(np.float32(-1.5)), "float16"))
            full = bb.emit(relax.op.full([4, 8], fill, "float16"))
            out = bb.emit_output(bb.emit(relax.op.add(x, full)))
        bb.emit_func_output(out)
    folded = FoldWeightsInNumpy()(bb.get())
    assert any(c.shape == () and c.dtype == np.float16 for c in _constants(folded))
    x = np.ones((4, 8), "float16")
    np.testing.assert_array_equal(run_vm(build_cpu(folded), [x]), x - 1.5)
