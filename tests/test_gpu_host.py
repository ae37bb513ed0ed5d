"""GPU tests that build in-process, as a user on a GPU machine does (the GPU host with the full TVM
bundle: `source .gpufull/rest/enter.sh && python3 -m pytest -m gpu tests/test_gpu_host.py`).

Skipped without a GPU or without TVM's compiler.
"""

import shutil
import subprocess

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _gpu_available() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


if not _gpu_available():
    pytest.skip("no NVIDIA GPU visible", allow_module_level=True)

tvm = pytest.importorskip("tvm")
relax = pytest.importorskip("tvm.relax")

import relax_cutlass  # noqa: E402
from relax_cutlass.arch import local_gpu_arch  # noqa: E402
from relax_cutlass.testing.models import dense_epilogue_model  # noqa: E402


def _dense_bias_build(tmp_path):
    """A dense + bias region (weights as parameters) offloaded, built, exported with the host's
    default toolchain and loaded: (vm, the region's function)."""
    mod = dense_epilogue_model(m=64, n=256, k=128)
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    (region,) = relax_cutlass.offload_report(offloaded).offloaded
    assert region["shapes"] == {"lhs": [64, 128], "rhs": [256, 128], "bias": [256]}  # in any order
    sm = local_gpu_arch()
    target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{sm}{'a' if sm == 90 else ''}"}, host="llvm")
    tvm.compile(offloaded, target).export_library(str(tmp_path / "dense.so"))
    lib = tvm.runtime.load_module(str(tmp_path / "dense.so"))
    fn = lib.get_function(region["symbol"], query_imports=True)
    return relax.VirtualMachine(lib, tvm.cuda(0)), fn, list(region["shapes"])


def test_bad_operands_raise_and_the_process_goes_on(tmp_path):
    """An offloaded call given a misaligned view, a wrong shape or a host tensor raises an exception
    that names the region and the problem, before anything is launched; the same function and the
    whole model then still compute the right result in this process."""
    vm, fn, roles = _dense_bias_build(tmp_path)
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (64, 128)).astype("float16")
    w = (rng.uniform(-1, 1, (256, 128)) / 8).astype("float16")
    b = rng.uniform(-1, 1, 256).astype("float16")
    expected = x.astype("float32") @ w.astype("float32").T + b

    def call(lhs):
        out = tvm.runtime.tensor(np.zeros((64, 256), "float16"), dev)
        args = {"lhs": lhs, "rhs": tvm.runtime.tensor(w, dev), "bias": tvm.runtime.tensor(b, dev)}
        fn(*(args[role] for role in roles), out)  # the region's own parameter order
        return out.numpy().astype("float32")

    padded = tvm.runtime.tensor(np.concatenate([np.zeros(1, "float16"), x.reshape(-1)]), dev)
    misaligned = padded._create_view((64, 128), "float16", 2)  # one element in: 2-byte aligned
    with pytest.raises(Exception, match="aligned") as err:
        call(misaligned)
    assert "fused_" in str(err.value)  # the region's symbol
    with pytest.raises(Exception, match="inner dim K"):
        call(tvm.runtime.tensor(rng.uniform(-1, 1, (64, 136)).astype("float16"), dev))
    with pytest.raises(Exception, match="CUDA device"):
        call(tvm.runtime.tensor(x, tvm.cpu()))
    assert np.abs(call(tvm.runtime.tensor(x, dev)) - expected).max() < 2e-2
    args = [tvm.runtime.tensor(a, dev) for a in (x, w, b)]
    assert np.abs(vm["main"](*args).numpy().astype("float32") - expected).max() < 2e-2
