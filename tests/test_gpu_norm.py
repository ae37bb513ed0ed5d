"""Norm kernels on the GPU, built in-process as a user on a GPU machine builds them: every form the
kind takes (ConvNeXt's fp16 LayerNorm, BERT's post-LN add + LN with the f32 norm as a second
output, GPT-2's pre-LN add + LN with the sum as a second output, Llama's decomposed RMSNorm,
R.nn.rms_norm, bf16), odd and large normalized sizes (warp-per-row and CTA-per-row kernels) and a
symbolic row count, against TVM's own CUDA build of the same module and a float64 numpy reference.
A module's extra outputs are concatenated into its one result (relax_cutlass/testing/norm_graphs.py), so both
outputs of a two-output region are checked."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import relax_cutlass  # noqa: E402
from relax_cutlass.kinds.norm.reference import norm_reference  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)
from relax_cutlass.testing.errors import rel_error  # noqa: E402
from relax_cutlass.testing.harness import random_inputs  # noqa: E402
from relax_cutlass.testing.norm_graphs import norm_module  # noqa: E402

CASES = [
    dict(form="layer_norm", rows=(4, 56, 56), n=96, dtype="float16", epsilon=1e-6),  # ConvNeXt stage 1
    dict(form="layer_norm", rows=(2, 7, 7), n=768, dtype="float16", epsilon=1e-6),  # ConvNeXt stage 4
    dict(form="layer_norm", residual="cast", cast="float16", leak=("norm",), n=1024, epsilon=1e-12),  # BERT
    dict(form="layer_norm", residual="cast", cast="float16", leak=("sum",), n=768),  # GPT-2
    dict(form="layer_norm", residual="add", cast="float16", leak=("sum", "norm"), n=1000),
    dict(form="rms_decomposed", residual="add", cast="float16", leak=("sum",), n=4096, epsilon=1e-6),  # Llama
    dict(form="rms_decomposed", residual="add", cast="float16", leak=("sum",), n=5120, epsilon=1e-5),
    dict(form="rms_norm", residual="cast_both", cast="float16", leak=("sum",), n=4096),
    dict(form="rms_norm", dtype="float16", n=97),  # no 16-byte access: scalar loads
    dict(form="layer_norm", residual="add", stream="float16", n=2048, leak=("sum",)),  # an fp16 stream
    dict(form="layer_norm", residual="cast", dtype="bfloat16", cast="bfloat16", leak=("sum",), n=4096),
    dict(form="rms_norm", dtype="bfloat16", n=8192, rows=(33,)),
]


def _target() -> tvm.target.Target:
    return gpu_convs.cuda_target()


def _run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, _target()), tvm.cuda(0))
    out = vm["main"](*[tvm.runtime.tensor(a, tvm.cuda(0)) for a in inputs])
    return out.numpy()


def _reference(case: dict, inputs: list[np.ndarray]) -> np.ndarray:
    """The module's result in float64 from norm_reference (outputs rounded as the graph rounds them:
    the cast output to its dtype; the leaked sum and norm times 2 and 3, as norm_graphs uses them)."""
    residual = case.get("residual", "none")
    x, rest = inputs[0], inputs[1:]
    r = rest.pop(0) if residual != "none" else None
    gamma = rest.pop(0)
    beta = rest.pop(0) if case["form"] == "layer_norm" else None
    norm = "layer_norm" if case["form"] == "layer_norm" else "rms_norm"
    s, y = norm_reference(x, r, gamma, beta, norm, case.get("epsilon", 1e-5))
    parts = [y]
    if "sum" in case.get("leak", ()):
        parts.append(2 * s)
    if "norm" in case.get("leak", ()):
        parts.append(3 * y)
    return np.concatenate(parts, axis=-1)


def _tolerance(case: dict) -> float:
    dtypes = {case.get("dtype", "float16"), case.get("cast") or case.get("stream", "float32")}
    return 2e-2 if "bfloat16" in dtypes else 3e-3


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['form']}-{c.get('residual', 'none')}-n{c['n']}")
def test_norm_kernel_matches_tvm_and_float64(case):
    mod = norm_module(**case, weights="param")
    inputs = random_inputs(mod, seed=1)
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    rows = [r for r in relax_cutlass.offload_report(offloaded).offloaded if r["op"] == "norm"]
    assert len(rows) == 1 and set(rows[0]["output_roles"]) == {"out", *case.get("leak", ())}, rows
    got = _run(offloaded, inputs)
    assert rel_error(got, _reference(case, inputs)) < _tolerance(case)
    if case.get("dtype") != "bfloat16" or case.get("residual", "none") != "none":
        # TVM's CUDA layer_norm takes no bfloat16 input
        want = _run(mod, inputs)
        assert got.dtype == want.dtype and rel_error(got, want) < _tolerance(case)


def test_symbolic_rows_from_one_library():
    case = dict(form="layer_norm", rows=("b", 128), residual="cast", cast="float16", leak=("sum", "norm"), n=768)
    mod = norm_module(**case, weights="param")
    offloaded = relax_cutlass.offload_pipeline("auto")(mod)
    vm = relax.VirtualMachine(tvm.compile(offloaded, _target()), tvm.cuda(0))
    for b in (1, 3, 40):
        inputs = random_inputs(mod, seed=b, b=b)
        got = vm["main"](*[tvm.runtime.tensor(a, tvm.cuda(0)) for a in inputs]).numpy()
        assert got.shape == (b, 128, 3 * 768)
        assert rel_error(got, _reference(case, inputs)) < 3e-3
