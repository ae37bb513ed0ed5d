"""Rewrites that make frontend graphs buildable and offloadable without changing what they compute."""

import numpy as np
import pytest
import tvm
from harness import build_cpu, run_vm
from tvm import relax

from relax_cutlass.transform import WidenNarrowCumsums


def _cumsum_module(dtype: str, out_dtype: str | None = None):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 512], dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.cumsum(x, axis=-1, dtype=out_dtype)))
        bb.emit_func_output(y)
    return bb.get()


def _ops(mod):
    names = []
    relax.analysis.post_order_visit(
        mod["main"].body, lambda e: isinstance(e, relax.Call) and names.append(getattr(e.op, "name", ""))
    )
    return names


@pytest.mark.parametrize(
    ("dtype", "out_dtype"), [("int8", None), ("uint8", None), ("int16", None), ("bool", "int64"), ("int8", "int32")]
)
def test_narrow_integer_cumsums_are_computed_in_a_dtype_tvm_builds(dtype, out_dtype):
    """TVM 0.27's CUDA cumsum aborts the process on a bool input (a misaligned shared-memory write
    in gpu_2d_continuous_cumsum, seen on the H100 in GPT-2 and Llama via transformers' mask code)
    and cannot compile int8: the sums are taken in int32 (or the wider result dtype) and narrowed
    exactly as the original's result type narrows them."""
    mod = _cumsum_module(dtype, out_dtype)
    widened = WidenNarrowCumsums()(mod)
    assert "relax.astype" in _ops(widened)
    (cumsum,) = [c for c in _calls(widened) if c.op.name == "relax.cumsum"]
    assert str(cumsum.args[0].ty.dtype) in ("int32", "int64")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, (2, 512)).astype(dtype)
    expected = np.cumsum(x.astype("int64"), axis=-1).astype(out_dtype or dtype)
    got = run_vm(build_cpu(widened), [x])
    np.testing.assert_array_equal(got, expected)


def test_bool_cumsum_is_any_so_far():
    """A bool cumsum (the Relax op on a bool input with no dtype) narrows counts back to bool: True
    from the first True on, which is what its CUDA code computes where it runs at all."""
    widened = WidenNarrowCumsums()(_cumsum_module("bool"))
    x = np.zeros((2, 512), bool)
    x[0, 7] = x[0, 9] = x[1, 511] = True
    got = run_vm(build_cpu(widened), [x])
    np.testing.assert_array_equal(got, np.cumsum(x, axis=-1) > 0)


def test_wide_cumsums_are_untouched():
    for dtype in ("int32", "int64", "float16", "float32"):
        mod = _cumsum_module(dtype)
        tvm.ir.assert_structural_equal(WidenNarrowCumsums()(mod), mod)


def _calls(mod):
    calls = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: isinstance(e, relax.Call) and calls.append(e))
    return [c for c in calls if isinstance(c.op, tvm.ir.Op)]
