"""Random Relax graphs for the property tests (tests/test_graphs.py, CPU) and their fixed GPU sample
(gpu_cases.py, checked by tests/test_gpu_suite.py): chains and diamonds of dense / matmul / conv2d
layers with random epilogues, aligned and unaligned widths, static or symbolic batch."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tvm import relax

from relax_cutlass.kinds.epilogue_patterns import FUSED_ACTIVATIONS

from .models import ACTIVATION_BUILDERS

# quick_gelu is not built in: unregistered, it must stay in TVM untouched.
ACTIVATIONS = ["identity", *FUSED_ACTIVATIONS, "gelu_decomposed", "quick_gelu"]
WIDTHS = [8, 12, 16, 24, 32, 7, 13]  # odd widths must stay in TVM, with a reason

LAYER = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["dense", "matmul"]),
        "width": st.sampled_from(WIDTHS),
        "bias": st.booleans(),
        "activation": st.sampled_from(ACTIVATIONS),
        "residual": st.integers(-1, 3),  # index of an earlier node of the same shape, -1: none
        "residual_relu": st.booleans(),
    }
)


def gemm_graph(batch, rows: int, features: int, layers: list[dict]) -> tvm.IRModule:
    """x -> layer -> layer ... where a layer may add an earlier node (a diamond) after its epilogue."""
    b = tvm.tirx.Var("b", "int64") if batch == "b" else batch
    x = relax.Var("x", relax.TensorType([b, rows, features], "float16"))
    weights, params = [], [x]
    width = features
    for i, layer in enumerate(layers):
        shape = [layer["width"], width] if layer["kind"] == "dense" else [width, layer["width"]]
        weights.append(relax.Var(f"l{i}_w", relax.TensorType(shape, "float16")))
        params.append(weights[-1])
        if layer["bias"]:
            params.append(relax.Var(f"l{i}_b", relax.TensorType([layer["width"]], "float16")))
        width = layer["width"]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            nodes, width, cursor = [x], features, 1
            for layer in layers:
                w = params[cursor]
                cursor += 1
                y = nodes[-1]
                wt = bb.emit(relax.op.permute_dims(w)) if layer["kind"] == "dense" else w
                y = bb.emit(relax.op.matmul(y, wt))
                if layer["bias"]:
                    y = bb.emit(relax.op.add(y, params[cursor]))
                    cursor += 1
                y = ACTIVATION_BUILDERS[layer["activation"]](bb, y)
                same = [n for n in nodes if int(n.ty.shape.values[-1]) == layer["width"]]
                if layer["residual"] >= 0 and same:
                    y = bb.emit(relax.op.add(y, same[layer["residual"] % len(same)]))
                    if layer["residual_relu"]:
                        y = bb.emit(relax.op.nn.relu(y))
                nodes.append(y)
                width = layer["width"]
            out = bb.emit_output(nodes[-1])
        bb.emit_func_output(out)
    return bb.get()


CONV_LAYER = st.fixed_dictionaries(
    {
        "channels": st.sampled_from([8, 16, 12, 6, 5]),
        "kernel": st.sampled_from([1, 3]),
        "stride": st.sampled_from([1, 1, 2]),
        "bias": st.booleans(),
        "activation": st.sampled_from([a for a in ACTIVATIONS if a != "gelu_decomposed"]),
        "residual": st.booleans(),  # add the block input when shapes allow (a ResNet diamond)
    }
)


def conv_graph(batch, size: int, channels: int, layers: list[dict]) -> tvm.IRModule:
    """An NCHW chain of conv blocks, as the PyTorch frontend writes them, with residual diamonds."""
    n = tvm.tirx.Var("n", "int64") if batch == "n" else batch
    x = relax.Var("x", relax.TensorType([n, channels, size, size], "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y, c, hw = x, channels, size
            for i, layer in enumerate(layers):
                k, r, stride = layer["channels"], layer["kernel"], layer["stride"]
                w = relax.const(random_weights_array((k, c, r, r), i), "float16")
                out = bb.emit(relax.op.nn.conv2d(y, w, strides=stride, padding=r // 2))
                if layer["bias"]:
                    b = relax.const(random_weights_array((1, k, 1, 1), 100 + i), "float16")
                    out = bb.emit(relax.op.add(out, b))
                out = ACTIVATION_BUILDERS[layer["activation"]](bb, out)
                new_hw = (hw + 2 * (r // 2) - r) // stride + 1
                if layer["residual"] and (k, new_hw) == (c, hw):
                    out = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(out, y))))
                y, c, hw = out, k, new_hw
            result = bb.emit_output(y)
        bb.emit_func_output(result)
    return bb.get()


def random_weights_array(shape, seed):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return (np.random.default_rng(seed).uniform(-1, 1, size=shape) / np.sqrt(fan_in)).astype("float16")


GEMM_GRAPH = dict(
    batch=st.one_of(st.integers(1, 3), st.just("b")),
    rows=st.integers(1, 9),
    features=st.sampled_from([8, 16, 10, 9]),
    layers=st.lists(LAYER, min_size=1, max_size=4),
    bind=st.booleans(),
)
CONV_GRAPH = dict(
    batch=st.one_of(st.integers(1, 2), st.just("n")),
    size=st.integers(4, 9),
    channels=st.sampled_from([8, 16, 6, 3]),
    layers=st.lists(CONV_LAYER, min_size=1, max_size=3),
)


def fixed_sample(strategies: dict, count: int) -> list[dict]:
    """`count` examples of `strategies`, the same on every run (derandomized generation only)."""
    found: list[dict] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(**strategies)
    def collect(**example):
        found.append(example)

    collect()
    return found[:count]


def gemm_features(example: dict) -> set:
    """What a GEMM graph exercises: the offloadable layers' (kind, bias, activation, residual) and
    the graph's batch kind and weight binding."""
    features, width = {("symbolic" if example["batch"] == "b" else "static", example["bind"])}, example["features"]
    for layer in example["layers"]:
        if width % 2 == 0 and layer["width"] % 2 == 0:
            residual = layer["residual"] >= 0 and (layer["residual_relu"] and "relu" or "add")
            features.add((layer["kind"], layer["bias"], layer["activation"], residual))
        width = layer["width"]
    return features


def conv_features(example: dict) -> set:
    features, channels = {"symbolic" if example["batch"] == "n" else "static"}, example["channels"]
    for layer in example["layers"]:
        if channels % 2 == 0 and layer["channels"] % 2 == 0:
            features.add((layer["kernel"], layer["stride"], layer["bias"], layer["activation"], layer["residual"]))
        channels = layer["channels"]
    return features


def diverse_sample(strategies: dict, features, count: int, pool: int = 300) -> list[dict]:
    """`count` examples from a fixed draw of `pool`, picked greedily to cover the most features."""
    candidates, chosen, covered = fixed_sample(strategies, pool), [], set()
    for _ in range(count):
        best = max(candidates, key=lambda e: len(features(e) - covered))
        chosen.append(best)
        covered |= features(best)
        candidates.remove(best)
    return chosen
