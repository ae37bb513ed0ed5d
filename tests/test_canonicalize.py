"""Rewrites that make frontend graphs buildable and offloadable without changing what they compute."""

import numpy as np
import pytest
import tvm
from tvm import relax

from relax_cutlass.rewrites.shapes import bound_symbolic_shapes
from relax_cutlass.testing.harness import build_cpu, run_vm
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


def _dims(ty) -> list:
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape.values]


def _bounded_function(params, body, bounds):
    """main(params) -> body(bb, *params), with torch.export's Dim ranges as TVM's torch frontend
    records them ({name: (min, max)})."""
    attrs = {
        "tir_var_lower_bound": {name: low for name, (low, _) in bounds.items()},
        "tir_var_upper_bound": {name: high for name, (_, high) in bounds.items()},
    }
    bb = relax.BlockBuilder()
    with bb.function("main", params, attrs=attrs):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _position_diff(bb, ids):
    """transformers' find_packed_sequence_indices as torch.export writes it: torch.diff of the
    position ids with their first value less one prepended."""
    s = ids.ty.shape.values[1]
    first = bb.emit(relax.op.strided_slice(ids, axes=[1], begin=[0], end=[1]))
    prepended = bb.emit(relax.op.concat([bb.emit(relax.op.subtract(first, relax.const(1, "int64"))), ids], axis=-1))
    later = bb.emit(relax.op.strided_slice(prepended, axes=[1], begin=[1], end=[s + 1]))
    earlier = bb.emit(relax.op.strided_slice(prepended, axes=[1], begin=[0], end=[s]))
    return relax.op.subtract(later, earlier)


def test_slices_of_a_symbolic_length_are_exact_under_the_dims_bounds():
    """Llama's and GPT-2's packed-sequence check with a symbolic sequence length s: TVM clamps the
    slices' lengths (min(1, s), then min(s, min(1, s) + s) and max(min(1, s) + s - 1, 0)), cannot
    prove the last two equal without the Dim's lower bound, and infers the subtract no shape, which
    it cannot legalize. With the bounds the slices are proven in bounds: (1, s), built, same values."""
    s = tvm.tirx.Var("s", "int64")
    mod = _bounded_function([relax.Var("ids", relax.TensorType((1, s), "int64"))], _position_diff, {"s": (2, 4096)})
    assert mod["main"].ret_ty.shape is None  # TVM alone: no shape, and no legalization of it
    with pytest.raises(Exception, match="cannot emit this Relax operator"):
        build_cpu(mod)
    fixed = FixTvmCudaForms()(mod)
    assert _dims(fixed["main"].ret_ty) == [1, "s"]
    assert bound_symbolic_shapes(fixed["main"]).same_as(fixed["main"])  # nothing left to prove
    vm = build_cpu(fixed)
    for n in (2, 9):
        ids = np.array([[3, 4, 5, 0, 1, 2, 3, 4, 5][:n]], dtype="int64")
        np.testing.assert_array_equal(run_vm(vm, [ids]), np.diff(ids, prepend=ids[:, :1] - 1))


def test_a_shape_clamped_by_a_position_table_is_exact_under_the_dims_bounds():
    """BERT's position ids with a symbolic sequence length s: a (1, 512) buffer sliced at [0:s],
    min(s, 512) long, a reshape to that clamped length, the embeddings of it added to the token
    embeddings (s long): no shape. With s <= 512 the slice and the reshape are s long."""
    s = tvm.tirx.Var("s", "int64")
    table = np.arange(512, dtype="int64").reshape(1, 512)
    weights = np.random.default_rng(0).standard_normal((512, 8)).astype("float32")

    def body(bb, ids):
        positions = bb.emit(relax.op.strided_slice(relax.const(table), axes=[1], begin=[0], end=[s]))
        flat = bb.emit(relax.op.reshape(positions, relax.ShapeExpr([tvm.tirx.min(s, 512)])))
        token = bb.emit(relax.op.take(relax.const(weights), relax.op.reshape(ids, [s]), axis=0))
        return relax.op.add(token, bb.emit(relax.op.take(relax.const(weights), flat, axis=0)))

    mod = _bounded_function([relax.Var("ids", relax.TensorType((1, s), "int64"))], body, {"s": (2, 512)})
    assert mod["main"].ret_ty.shape is None
    fixed = FixTvmCudaForms()(mod)
    assert _dims(fixed["main"].ret_ty) == ["s", 8]
    assert bound_symbolic_shapes(fixed["main"]).same_as(fixed["main"])
    vm = build_cpu(fixed)
    for n in (3, 512):
        ids = np.arange(n, dtype="int64").reshape(1, n) % 7
        np.testing.assert_allclose(run_vm(vm, [ids]), weights[ids[0]] + weights[:n], rtol=1e-6)


def test_a_slice_the_bounds_do_not_prove_in_bounds_is_left_clamped():
    """A slice of [0:8] on a length that may be 2 needs its clamp: FixTvmCudaForms leaves it."""
    s = tvm.tirx.Var("s", "int64")

    def body(bb, x):
        return relax.op.strided_slice(x, axes=[1], begin=[0], end=[8])

    mod = _bounded_function([relax.Var("x", relax.TensorType((1, s), "float32"))], body, {"s": (2, 4096)})
    tvm.ir.assert_structural_equal(FixTvmCudaForms()(mod), mod)


def test_from_torch_names_an_op_tvm_infers_no_shape_for():
    """Without the Dim's lower bound the packed-sequence check's subtract keeps no shape; from_torch
    then says which op and what to do, where TVM's build would fail on an unlowered operator."""
    from relax_cutlass.frontend import require_shapes

    s = tvm.tirx.Var("s", "int64")
    ids = relax.Var("ids", relax.TensorType((1, s), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [ids]):
        with bb.dataflow():
            out = bb.emit_output(_position_diff(bb, ids))
        bb.emit_func_output(out)
    fixed = FixTvmCudaForms()(bb.get())
    assert fixed["main"].ret_ty.shape is None
    with pytest.raises(RuntimeError) as raised:
        require_shapes(fixed, "from_torch")
    message = str(raised.value)
    assert message.startswith("from_torch: TVM infers no shape for 1 elementwise op(s)")
    assert "relax.subtract((1, max(min(1, s) + s - 1, 0)), (1, s))" in message and "min=2, max=" in message


def test_open_and_negative_slice_ends_are_resolved_under_the_dims_bounds():
    """x[:, 1:] - x[:, :-1] (torch.diff) as torch.export writes it: the open end is 2**63 - 1 and the
    other end -1. TVM's clamped lengths differ in form and the subtract gets no shape; under the
    Dim's lower bound both slices are s - 1 long."""
    s = tvm.tirx.Var("s", "int64")

    def body(bb, x):
        later = bb.emit(relax.op.strided_slice(x, axes=[1], begin=[1], end=[2**63 - 1], strides=[1]))
        earlier = bb.emit(relax.op.strided_slice(x, axes=[-1], begin=[0], end=[-1], strides=[1]))
        return relax.op.subtract(later, earlier)

    mod = _bounded_function([relax.Var("x", relax.TensorType((1, s), "float32"))], body, {"s": (2, 4096)})
    assert mod["main"].ret_ty.shape is None
    fixed = FixTvmCudaForms()(mod)
    one, length = fixed["main"].ret_ty.shape.values
    assert int(one) == 1 and tvm.sym.Analyzer().can_prove_equal(length, s - 1)
    vm = build_cpu(fixed)
    for n in (2, 11):
        x = np.random.default_rng(n).standard_normal((1, n)).astype("float32")
        np.testing.assert_array_equal(run_vm(vm, [x]), np.diff(x))


CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")


def _partial_rotary_module(rotary: int, head_dim: int = 32):
    """concat((rotated, x[..., rotary:]), -1) as transformers writes partial rotary embeddings,
    the pass-through cast to float32 as ToMixedPrecision leaves it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 16, head_dim], "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            rotated = bb.emit(relax.op.astype(relax.op.strided_slice(x, [3], [0], [rotary]), "float32"))
            rotated = bb.emit(relax.op.multiply(rotated, relax.const(2.0, "float32")))
            rest = bb.emit(relax.op.astype(relax.op.strided_slice(x, [3], [rotary], [2**63 - 1]), "float32"))
            out = bb.emit_output(relax.op.concat([rotated, rest], axis=-1))
        bb.emit_func_output(out)
    return bb.get()


def test_an_empty_concat_operand_is_dropped_so_tvm_builds_the_module():
    """Regression (the zoo's Phi-3 on the H100): with the rotary dim the whole head dim,
    the pass-through slice is empty, and TVM 0.27's CUDA build divides by zero scheduling the cast
    over it ("Check failed: pb->value != 0"): Phi-3 built neither offloaded nor in TVM. The empty
    operand and its producers go; a partial rotary (a real pass-through) keeps its concat."""
    mod = _partial_rotary_module(rotary=32)
    with pytest.raises(Exception, match="Divide by zero"):  # the premise, in TVM 0.27
        tvm.compile(mod, CUDA)
    fixed = FixTvmCudaForms()(mod)
    assert "relax.concat" not in _ops(fixed) and "relax.strided_slice" in _ops(fixed)
    assert _ops(fixed).count("relax.astype") == 1
    tvm.compile(fixed, CUDA)
    x = np.random.default_rng(0).standard_normal((1, 4, 16, 32)).astype("float16")
    want = x.astype("float32") * 2
    np.testing.assert_array_equal(run_vm(build_cpu(fixed), [x]), want)

    partial = _partial_rotary_module(rotary=16)
    assert FixTvmCudaForms()(partial)["main"].body.blocks[0].bindings[-1].value.op.name == "relax.concat"


def test_a_concat_of_one_tensor_is_that_tensor():
    """torch.onnx's TorchScript GPT-2 concatenates each key and value with its empty past, folded to
    concat((k,)): a copy TVM runs, between the projection and the attention's views."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 16, 32], "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.permute_dims(bb.emit(relax.op.concat([x], axis=-2)), [0, 2, 1, 3]))
        bb.emit_func_output(out)
    fixed = FixTvmCudaForms()(bb.get())
    assert _ops(fixed) == ["relax.permute_dims"], _ops(fixed)


def test_a_rewrite_with_the_weights_hidden_gives_the_rewrite_with_them_shown():
    """rewrite_call_weights_hidden: the same function as rewrite_call, the weights the very same
    constants (put back, not copied), scalars seen by the pattern as constants; nothing changed
    returns the function itself."""
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    from relax_cutlass.kinds.ir import rewrite_call_weights_hidden

    weight = relax.const(np.arange(12, dtype="float16").reshape(3, 4))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, weight))
            z = bb.emit(relax.op.power(y, relax.const(2.0, "float16")))
            out = bb.emit_output(relax.op.add(z, relax.const(np.ones(4, "float16"))))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    base, exponent = wildcard(), is_const()
    pattern = is_op("relax.power")(base, exponent)
    square = lambda orig, m: relax.op.multiply(m[base], m[base])  # noqa: E731
    hidden = rewrite_call_weights_hidden(pattern, square, func)
    shown = rewrite_call(pattern, square, func)
    tvm.ir.assert_structural_equal(hidden, shown)
    constants = []
    relax.analysis.post_order_visit(
        hidden.body, lambda e: constants.append(e) if isinstance(e, tvm.ir.GenericConst) else None
    )
    assert any(c.same_as(weight) for c in constants)
    untouched = rewrite_call_weights_hidden(is_op("relax.nn.conv2d")(wildcard(), wildcard()), square, func)
    tvm.ir.assert_structural_equal(untouched, func)
