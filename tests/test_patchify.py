"""PatchifyConvs: patch embeddings on 3 channels as GEMMs of their patches.

Regression (torchvision's ViT-B/16 in the zoo, H200, batch 8): its 16 x 16 / 16 patch embedding
ran as an SM80 convolution on channels padded from 3 to 8, 0.15 of 1.33 ms for 0.4% of the FLOPs."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import relax_cutlass
from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.harness import build_cpu, compare_on_cpu, op_names, run_vm
from relax_cutlass.transform import PatchifyConvs

torch = pytest.importorskip("torch")


class Stem(torch.nn.Module):
    """conv2d -> flatten to tokens, as ViT embeds its patches."""

    def __init__(self, channels: int, kernel: int, stride: int, padding: int = 0):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, 32, kernel, stride=stride, padding=padding)

    def forward(self, x):
        return self.conv(x).flatten(2).transpose(1, 2)


@pytest.mark.parametrize(
    ("channels", "kernel", "stride", "padding", "patchified"),
    [
        (3, 4, 4, 0, True),
        (3, 8, 8, 0, True),
        (1, 8, 8, 0, True),
        (3, 4, 2, 0, False),
        (3, 4, 4, 1, False),
        (8, 4, 4, 0, False),
    ],
)
def test_a_patch_embedding_is_a_gemm_of_its_patches(channels, kernel, stride, padding, patchified):
    """Through from_torch and the pipeline on the CPU: a kernel-is-stride conv on fewer than 8
    channels is an offloaded matmul with its bias, read through one transpose, and the flatten to
    tokens after it a reshape; other convs stay convs. Values as torch's."""
    torch.manual_seed(0)
    model = Stem(channels, kernel, stride, padding).eval()
    x = np.random.default_rng(0).uniform(-1, 1, (2, channels, 16, 16)).astype("float32")
    mod = relax_cutlass.from_torch(model, (torch.from_numpy(x),))
    _, got, rewritten = compare_on_cpu(mod, [x])
    rows = relax_cutlass.offload_report(rewritten).offloaded
    assert [r["op"] for r in rows] == (["matmul"] if patchified else ["conv2d"]), rows
    if patchified:
        assert rows[0]["epilogue"] == "bias" and rows[0]["mnk"][2] == channels * kernel * kernel
        assert op_names(rewritten).count("relax.permute_dims") <= 2  # the image to NHWC, into patches
    with torch.no_grad():
        assert rel_error(got.astype("float32"), model(torch.from_numpy(x)).numpy()) < 1e-2


def test_an_nchw_patch_embedding_is_rewritten_exactly_in_float32():
    """The pass on an NCHW / OIHW conv (as a hand-built module has it): a matmul and a permute back
    to NCHW, with the same values up to float32 rounding."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((2, 3, 8, 12), "float32"))
    w = relax.const(rng.uniform(-1, 1, (5, 3, 4, 4)).astype("float32"))
    b = relax.const(rng.uniform(-1, 1, (1, 5, 1, 1)).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(bb.emit(relax.op.nn.conv2d(x, w, strides=4)), b))
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = PatchifyConvs()(mod)
    names = op_names(rewritten)
    assert "relax.nn.conv2d" not in names and names[-1] == "relax.permute_dims", names
    data = rng.uniform(-1, 1, (2, 3, 8, 12)).astype("float32")
    np.testing.assert_allclose(
        run_vm(build_cpu(rewritten), [data]), run_vm(build_cpu(mod), [data]), rtol=1e-5, atol=1e-5
    )
