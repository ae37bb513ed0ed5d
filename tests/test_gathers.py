"""TakesAsSlices: the gathers torch.export writes for torch.roll and constant indexing, as the slices
they are, which TVM fuses with the copies around them.

Regression (torchvision's Swin-T in the zoo, H200, batch 32): its rolled windows were 24 take
kernels of their own, with its packed q/k/v takes 0.87 of 4.06 ms."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import relax_cutlass
from relax_cutlass.rewrites.gathers import MAX_RUNS, ascending_runs
from relax_cutlass.testing.harness import build_cpu, op_names, run_vm
from relax_cutlass.transform import TakesAsSlices

torch = pytest.importorskip("torch")


class ShiftedWindows(torch.nn.Module):
    """Swin's cyclic shift and window partition: roll by -shift on H and W, then (B*nW, w*w, C)."""

    def __init__(self, shift: tuple[int, int], window: int = 2):
        super().__init__()
        self.shift, self.window = shift, window

    def forward(self, x):
        b, h, w, c = x.shape
        x = torch.roll(x, shifts=(-self.shift[0], -self.shift[1]), dims=(1, 2))
        x = x.view(b, h // self.window, self.window, w // self.window, self.window, c)
        return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, self.window * self.window, c)


@settings(max_examples=8, deadline=None)
@given(shift_h=st.integers(-5, 5), shift_w=st.integers(-5, 5))
def test_a_roll_becomes_slices_with_the_same_values(shift_h, shift_w):
    x = torch.randn(2, 4, 6, 8)
    mod = relax_cutlass.from_torch(ShiftedWindows((shift_h, shift_w)), (x,))
    rewritten = TakesAsSlices()(mod)
    assert "relax.take" not in op_names(rewritten), rewritten
    want = run_vm(build_cpu(mod), [x.numpy()])
    np.testing.assert_array_equal(run_vm(build_cpu(rewritten), [x.numpy()]), want)
    np.testing.assert_allclose(want, ShiftedWindows((shift_h, shift_w))(x).numpy(), rtol=1e-3, atol=1e-3)


def test_a_constant_index_becomes_a_squeezed_slice():
    class Pick(torch.nn.Module):
        def forward(self, x):
            return x[:, 1] * 2.0 + x[:, -1]

    x = torch.randn(3, 4, 5)
    mod = relax_cutlass.from_torch(Pick(), (x,))
    rewritten = TakesAsSlices()(mod)
    assert "relax.take" in op_names(mod) and "relax.take" not in op_names(rewritten)
    np.testing.assert_array_equal(run_vm(build_cpu(rewritten), [x.numpy()]), run_vm(build_cpu(mod), [x.numpy()]))


def _take(indices: relax.Expr) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    params = [x] + ([indices] if isinstance(indices, relax.Var) else [])
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.op.take(x, indices, axis=1))
        bb.emit_func_output(out)
    return bb.get()


def test_gathers_that_are_no_few_runs_stay():
    """A shuffle of more than MAX_RUNS runs, and indices given at run time, stay takes."""
    shuffle = np.array([0, 2, 1, 3, 5, 4, 7, 6], "int64")
    assert ascending_runs(shuffle, 8) is None and len(np.nonzero(np.diff(shuffle) != 1)[0]) >= MAX_RUNS
    for mod in (_take(relax.const(shuffle)), _take(relax.Var("i", relax.TensorType((8,), "int64")))):
        assert op_names(TakesAsSlices()(mod)) == ["relax.take"]


@pytest.mark.parametrize(
    ("indices", "runs"),
    [
        ([3, 4, 5, 0, 1, 2], [(3, 6), (0, 3)]),
        ([2, 3], [(2, 4)]),
        ([5], [(5, 6)]),
        ([0, 0], [(0, 1), (0, 1)]),
        ([6], None),
    ],
)
def test_ascending_runs(indices, runs):
    assert ascending_runs(np.array(indices), 6) == runs


def test_the_pipeline_keeps_no_take_of_a_swin_block():
    """transformers' Swin (shifted windows: torch.roll both ways) offloaded on the CPU: no take is
    left in main, and the values are TVM's build of the original's."""
    import transformers

    from relax_cutlass.testing.errors import rel_error
    from relax_cutlass.testing.harness import offload_pipeline_on_cpu
    from relax_cutlass.testing.models.torch_transformers import tiny_input_model

    torch.manual_seed(0)
    model, shape = tiny_input_model("swin", torch, transformers)
    x = torch.randn(*shape)
    mod = relax_cutlass.from_torch(model, (x,))
    offloaded = offload_pipeline_on_cpu(mod, "sm_90a", profile="never")
    assert "relax.take" in op_names(mod) and "relax.take" not in op_names(offloaded)
    got, want = run_vm(build_cpu(offloaded), [x.numpy()]), run_vm(build_cpu(mod), [x.numpy()])
    assert rel_error(got, want) < 1e-2
