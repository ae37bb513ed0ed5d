"""The gated MLP's multiply fused into a GEMM epilogue (act(x @ W_gate + b) * (x @ W_up + b), issue
20) on the GPU, built in-process as a user on the GPU host builds it, against torch float64 on the
same fp16 inputs: the SM80 residual block with cutlass::multiplies on any SM80+ GPU, the SM90 EVT
with a multiply node on Hopper; odd M (1, 37), N = 1374 (2-element rows), K = 200, a symbolic M,
silu / gelu / gelu_tanh, either operand order, with and without the down projection."""

from __future__ import annotations

import numpy as np
import pytest

from relax_cutlass.testing.harness import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available():
    pytest.skip("no NVIDIA GPU visible", allow_module_level=True)

torch = pytest.importorskip("torch")
tvm = pytest.importorskip("tvm")
relax = pytest.importorskip("tvm.relax")

import relax_cutlass  # noqa: E402
from relax_cutlass.arch import arch_name, local_gpu_arch  # noqa: E402
from relax_cutlass.testing.errors import rel_error  # noqa: E402
from relax_cutlass.testing.models import gated_mlp_model, random_weights  # noqa: E402

SM = local_gpu_arch()
ARCH = arch_name(SM)
TORCH_ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
}
# family -> the kernel name prefix it must give (sm90: Hopper only)
FAMILIES = [("sm80", "sm80_"), pytest.param("auto", "sm90_", marks=pytest.mark.skipif(SM != 90, reason="Hopper"))]

# (M, hidden K, intermediate N, activation, bias, up_first, down)
CASES = [
    (37, 200, 1374, "silu", False, False, False),  # odd M, 2-element N rows
    (1, 256, 1376, "gelu", True, True, False),  # one token, biases, up * gelu(gate)
    (512, 4096, 1376, "silu", False, False, True),  # Llama-like K, with the down projection
    (130, 512, 2048, "gelu_tanh", True, False, True),
]


def _reference(x, w, activation, bias, up_first, down):
    t = {k: torch.from_numpy(v).double() for k, v in w.items()}
    xt = torch.from_numpy(x).double()
    gate = xt @ t["w_gate"].T + (t["b_gate"] if bias else 0)
    up = xt @ t["w_up"].T + (t["b_up"] if bias else 0)
    act = TORCH_ACTIVATIONS[activation](gate)
    y = up * act if up_first else act * up
    return (y @ t["w_down"].T if down else y).numpy()


def _run(mod, family, m, hidden, weights):
    offloaded = relax_cutlass.offload_pipeline(ARCH, family=family, profile="never")(mod)
    report = relax_cutlass.offload_report(offloaded)
    assert not report.left_in_tvm, str(report)
    target = tvm.target.Target({"kind": "cuda", "arch": ARCH}, host="llvm")
    vm = relax.VirtualMachine(tvm.compile(offloaded, target), tvm.cuda(0))
    x = np.random.default_rng(1).uniform(-1, 1, (m, hidden)).astype("float16")
    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(x, dev)] + [
        tvm.runtime.tensor(weights[p.name], dev) for p in mod["main"].params if p.name != "x"
    ]
    return report, x, vm["main"](*args).numpy()


@pytest.mark.parametrize("family, prefix", FAMILIES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"m{c[0]}_k{c[1]}_n{c[2]}_{c[3]}")
def test_gated_mlp_multiply_epilogue_matches_torch_float64(family, prefix, case):
    m, hidden, inter, activation, bias, up_first, down = case
    mod = gated_mlp_model(m, hidden, inter, activation=activation, bias=bias, up_first=up_first, down=down)
    weights = random_weights(mod)
    report, x, got = _run(mod, family, m, hidden, weights)
    fused = [r for r in report.offloaded if r["epilogue"].endswith("residual_mul")]
    # 2-element rows (N = 1374) cannot be read by TMA: the SM80 kernel, on Hopper too
    assert len(fused) == 1 and fused[0]["kernel"].startswith(prefix if inter % 8 == 0 else "sm80_"), str(report)
    assert rel_error(got, _reference(x, weights, activation, bias, up_first, down)) < 5e-3


@pytest.mark.parametrize("family, prefix", FAMILIES)
def test_gated_mlp_with_a_symbolic_m(family, prefix):
    mod = gated_mlp_model("m", 256, 1376, activation="silu", down=False)
    weights = random_weights(mod)
    offloaded = relax_cutlass.offload_pipeline(ARCH, family=family, profile="never")(mod)
    (fused,) = [r for r in relax_cutlass.offload_report(offloaded).offloaded if r["epilogue"] == "silu+residual_mul"]
    assert fused["kernel"].startswith(prefix)
    target = tvm.target.Target({"kind": "cuda", "arch": ARCH}, host="llvm")
    vm = relax.VirtualMachine(tvm.compile(offloaded, target), tvm.cuda(0))
    dev = tvm.cuda(0)
    for m in (3, 77, 1024):
        x = np.random.default_rng(m).uniform(-1, 1, (m, 256)).astype("float16")
        args = [tvm.runtime.tensor(x, dev)] + [
            tvm.runtime.tensor(weights[p.name], dev) for p in mod["main"].params if p.name != "x"
        ]
        got = vm["main"](*args).numpy()
        assert rel_error(got, _reference(x, weights, "silu", False, False, False)) < 5e-3
