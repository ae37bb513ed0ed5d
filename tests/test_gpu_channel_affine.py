"""The channel-affine kind's kernel on the GPU: DenseNet's
concatenations with their pre-activation batch norm and ReLU, built in-process as a user on the
GPU host builds them, against the same computation in float64 and against torch.

    pytest -m gpu tests/test_gpu_channel_affine.py   (on the GPU host; skipped without a GPU)
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

import relax_cutlass  # noqa: E402
from relax_cutlass.arch import local_gpu_arch  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)
from relax_cutlass.testing.channel_affine_graphs import dense_block_module, dense_block_parameters  # noqa: E402
from relax_cutlass.testing.errors import rel_error  # noqa: E402

torch, tvm, relax = gpu_convs.torch, gpu_convs.tvm, gpu_convs.relax


def _arch() -> str:
    sm = local_gpu_arch()
    return f"sm_{sm}{'a' if sm == 90 else ''}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("parts", [(64,), (64, 32), (64, 32, 32, 32, 32, 32, 32, 32)])
def test_a_concatenation_with_its_batch_norm_matches_float64(dtype, parts):
    mod = dense_block_module(parts, dtype=dtype, rows=(4, 13, 13))
    offloaded = relax_cutlass.offload_pipeline(_arch(), profile="never")(mod)
    (row,) = relax_cutlass.offload_report(offloaded).offloaded
    assert row["op"] == "channel_affine" and row["parts"] == len(parts), row
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), dev)
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-2, 2, (4, 13, 13, c)).astype(dtype) for c in parts]  # ml_dtypes' bfloat16
    got = vm["main"](*[tvm.runtime.tensor(x, dev) for x in inputs]).numpy().astype("float64")
    gamma, beta, mean, var = (p.astype("float64") for p in dense_block_parameters(sum(parts)))
    x = np.concatenate([p.astype("float64") for p in inputs], -1)
    want = np.maximum((x - mean) / np.sqrt(var + 1e-5) * gamma + beta, 0)
    assert rel_error(got, want) < (1e-2 if dtype == "bfloat16" else 2e-3)


def test_a_densenet_matches_torch():
    """torchvision's DenseNet written out (two small blocks), fp16, against torch float32."""
    from relax_cutlass.testing.models.torch_models import densenet

    model = densenet(growth=32, blocks=(4, 3), init_features=64, num_classes=10).to(torch.float16).float()
    x = torch.randn(8, 3, 64, 64)
    with torch.no_grad():
        want = model(x).double().numpy()
    mod = relax_cutlass.from_torch(model, (x,), dtype="float16")
    offloaded = relax_cutlass.offload_pipeline(_arch(), profile="never")(mod)
    report = relax_cutlass.offload_report(offloaded)
    assert len([r for r in report.offloaded if r["op"] == "channel_affine"]) == 8, str(report)
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), dev)
    out = vm["main"](tvm.runtime.tensor(x.numpy(), dev))
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype("float64")
    assert rel_error(got, want) < 2e-2
