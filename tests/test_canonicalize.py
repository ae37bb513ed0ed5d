"""Rewrites that make frontend graphs buildable and offloadable without changing what they compute."""

import numpy as np
import pytest
import tvm
from harness import build_cpu, run_vm
from tvm import relax

from relax_cutlass.transform import FixTvmCudaForms


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
    widened = FixTvmCudaForms()(mod)
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
    widened = FixTvmCudaForms()(_cumsum_module("bool"))
    x = np.zeros((2, 512), bool)
    x[0, 7] = x[0, 9] = x[1, 511] = True
    got = run_vm(build_cpu(widened), [x])
    np.testing.assert_array_equal(got, np.cumsum(x, axis=-1) > 0)


def test_wide_cumsums_are_untouched():
    for dtype in ("int32", "int64", "float16", "float32"):
        mod = _cumsum_module(dtype)
        tvm.ir.assert_structural_equal(FixTvmCudaForms()(mod), mod)


def _calls(mod):
    calls = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: isinstance(e, relax.Call) and calls.append(e))
    return [c for c in calls if isinstance(c.op, tvm.ir.Op)]


@pytest.mark.parametrize("exponent", [2.0, 3.0, -1.0, 4.0])
def test_small_integer_powers_become_products(exponent):
    """TVM 0.27's CUDA power is NaN for a negative base (GPT-2's x ** 3 gelu, Llama's RMSNorm
    x ** 2 on the H100): integer exponents from -4 to 4 become products, exact for any sign."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 64], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.power(x, relax.const(exponent, "float32"))))
        bb.emit_func_output(y)
    mod = bb.get()
    fixed = FixTvmCudaForms()(mod)
    assert "relax.power" not in _ops(fixed)
    values = np.random.default_rng(0).uniform(-2, 2, (4, 64)).astype("float32")
    np.testing.assert_allclose(run_vm(build_cpu(fixed), [values]), values.astype("f8") ** exponent, rtol=1e-5)


def test_other_powers_are_untouched():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 64], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.power(x, relax.const(0.5, "float32"))))
        bb.emit_func_output(y)
    mod = bb.get()
    tvm.ir.assert_structural_equal(FixTvmCudaForms()(mod), mod)


def test_a_negative_slice_axis_with_a_symbolic_bound_builds():
    """TVM 0.27's strided_slice legalization fails on axis -1 with a symbolic end ("axis <
    src_tensor_dim (-1 vs. 2)"), as Hugging Face's decoders slice position ids when exported with
    a symbolic sequence length: FixTvmCudaForms gives the axis as rank - 1, same values."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((2, n), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.strided_slice(x, axes=[-1], begin=[1], end=[n], strides=[1]))
        bb.emit_func_output(out)
    mod = bb.get()
    with pytest.raises(Exception, match="src_tensor_dim"):
        relax.transform.LegalizeOps()(mod)
    fixed = FixTvmCudaForms()(mod)
    value = np.arange(14, dtype="float32").reshape(2, 7)
    np.testing.assert_array_equal(run_vm(build_cpu(fixed), [value]), value[:, 1:])
