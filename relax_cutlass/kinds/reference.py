"""The float32 numpy references of the epilogues every kind's profiler check uses (numpy only:
the profile runner on a GPU host has just the TVM runtime)."""

from __future__ import annotations

import numpy as np


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.5e-7 (Abramowitz & Stegun 7.1.26): numpy has none, and the check's tolerance is 1e-2."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


# The epilogue activations (kernel_spec.ACTIVATIONS' built-in ones) in numpy, float32.
ACTIVATION_REFERENCE = {
    "identity": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
}


# Epilogue.residual_op -> how the residual combines with act(acc + bias) (RESIDUAL_OPS).
RESIDUAL_OP_REFERENCE = {"add": np.add, "multiply": np.multiply}


def with_epilogue(acc: np.ndarray, epilogue: dict, bias: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """D = post(act(acc + bias) (+ or *) residual), as kinds.epilogue.Epilogue defines it (float32)."""
    y = acc + bias.astype("float32") if epilogue.get("bias") else acc
    y = ACTIVATION_REFERENCE[epilogue.get("activation", "identity")](y)
    if epilogue.get("residual"):
        combined = RESIDUAL_OP_REFERENCE[epilogue.get("residual_op", "add")](y, residual.astype("float32"))
        y = ACTIVATION_REFERENCE[epilogue.get("residual_activation", "identity")](combined)
    return y


def torch_cuda():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def epilogue_problem(job: dict, rng, tvm, dev, inputs: tuple, acc, out_shape: tuple, call_args):
    """A kind's profiling problem from its main-loop `inputs` and float32 result `acc`: random
    bias and residual (stand-ins of one element unless the epilogue reads them), the reference
    with the epilogue, and `call(fn, out, split_k, iterations)` passing
    `call_args(tensors, out, split_k, iterations)` (tensors: inputs, bias, residual on `dev`)."""
    dtype = job["dtype"]
    epilogue = job.get("epilogue", {})
    bias = rng.uniform(-1, 1, size=out_shape[-1] if epilogue.get("bias") else 1).astype(dtype)
    residual = rng.uniform(-1, 1, size=out_shape if epilogue.get("residual") else 1).astype(dtype)
    want = with_epilogue(acc, epilogue, bias, residual)
    tensors = [tvm.runtime.tensor(v, dev) for v in (*inputs, bias, residual)]

    def call(fn, out, split_k, iterations):
        return fn(*call_args(tensors, out, split_k, iterations))

    return out_shape, want, call
