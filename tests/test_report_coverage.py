"""Nothing the patterns know stays in TVM unreported: every root op of every registered kind's
patterns has a `left_in_tvm` report row (R.nn.attention given a bias was once skipped, and the
report said "0 candidate(s) left in TVM"), and a module where each such op stays in TVM is a row
with the kind's own reason."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import pattern as dpl

import relax_cutlass
from relax_cutlass.kinds import kinds
from relax_cutlass.stages.report import NOT_MATCHED
from relax_cutlass.testing.channel_affine_graphs import dense_block_module

# The decomposed RMSNorm's root is the multiply by its weight: a multiply is an RMSNorm only
# where the whole pattern matches, and then the norm kind offloads it or reports the refusal
# (`not_fused`, report_refused), so a multiply alone is no op to report.
NOT_ROOT_OPS = {"relax.multiply"}


def _ops(pattern) -> set[str]:
    if isinstance(pattern, dpl.OrPattern):
        return _ops(pattern.left) | _ops(pattern.right)
    if isinstance(pattern, dpl.CallPattern) and isinstance(getattr(pattern.op, "expr", None), tvm.ir.Op):
        return {pattern.op.expr.name}
    raise AssertionError(f"a root pattern of an unexpected form: {pattern}")


def test_every_root_op_of_every_kind_has_a_report_row():
    roots = {op for kind in kinds() for spec in kind.specs() for op in _ops(kind.pattern(spec)[1]["root"])}
    reported = {op for kind in kinds() for op in kind.left_in_tvm}
    assert roots - NOT_ROOT_OPS <= reported, sorted(roots - NOT_ROOT_OPS - reported)
    assert {"relax.nn.attention", "relax.nn.attention_bias", "relax.nn.layer_norm", "relax.nn.rms_norm"} <= roots


def _module(params: dict[str, tuple], body, dataflow: bool = True) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, dtype)) for name, (shape, dtype) in params.items()]
    with bb.function("main", args):
        if dataflow:
            with bb.dataflow():
                out = bb.emit_output(bb.emit(body(*args)))
        else:
            out = bb.emit(body(*args))
        bb.emit_func_output(out)
    return bb.get()


F16, F64 = "float16", "float64"
BSNH = ((2, 16, 4, 16), F16)
nn = relax.op.nn

# (op as the report names it, a module where it stays in TVM, the kind's reason)
CASES = {
    "matmul": (
        "matmul",
        _module({"x": ((8, 16), F64), "w": ((16, 8), F64)}, relax.op.matmul),
        "dtype",
    ),
    "conv2d": (
        "conv2d",
        _module(
            {"x": ((1, 8, 8, 16), F64), "w": ((16, 3, 3, 16), F64)},
            lambda x, w: nn.conv2d(x, w, data_layout="NHWC", kernel_layout="OHWI"),
        ),
        "float64",
    ),
    "attention": (
        "attention op",
        _module({"q": ((2, 16, 4, 6), F16), "k": ((2, 16, 4, 6), F16), "v": ((2, 16, 4, 6), F16)}, nn.attention),
        "head dims 6/6 must be multiples of 4",
    ),
    "attention_bias": (
        "attention op",
        _module({"q": BSNH, "k": BSNH, "v": BSNH, "bias": ((2, 4, 16, 16), "float32")}, nn.attention),
        "the additive mask/bias is float32",
    ),
    "layer_norm": (
        "layer_norm",
        _module(
            {"x": ((4, 16), F64), "g": ((16,), F64), "b": ((16,), F64)}, lambda x, g, b: nn.layer_norm(x, g, b, -1)
        ),
        "float64 tensors: the norm kernel takes",
    ),
    "channel_affine": (
        "batch_norm_relu",
        dense_block_module((64, 36)),
        "multiple of 8",
    ),
    "rms_norm": (
        "rms_norm",
        _module({"x": ((16, 16), F16), "g": ((16,), F16)}, lambda x, g: nn.rms_norm(x, g, axes=[0])),
        "the kernel normalizes the last axis only",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_op_left_in_tvm_is_a_row_with_the_kinds_reason(name):
    op, mod, reason = CASES[name]
    report = relax_cutlass.offload_report(mod, "sm_90a")
    assert not report.offloaded
    (left,) = report.left_in_tvm
    assert left["op"] == op and any(reason in r for r in left["reasons"]), left
    assert "1 candidate(s) left in TVM" in str(report)


def test_an_op_outside_a_dataflow_block_is_a_row_too():
    """No pattern is tried outside a dataflow block: the row says so."""
    mod = _module({"q": BSNH, "k": BSNH, "v": BSNH, "bias": ((2, 4, 16, 16), F16)}, nn.attention, dataflow=False)
    (left,) = relax_cutlass.offload_report(mod, "sm_90a").left_in_tvm
    assert left["op"] == "attention op" and left["reasons"] == [NOT_MATCHED]
