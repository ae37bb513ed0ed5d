"""The GPU suite's correctness cases, as data: every epilogue and odd shape of the dense kind, the
conv2d cases, a fixed sample of the property tests' random graphs, the fused-attention cases and
the real-model frontends. Each is checked on the GPU (tests/test_gpu_suite.py) against TVM's own
CUDA build of the same model and a float64 torch reference, on two input seeds per shape.

Importable without a GPU (the tables are checked on the CPU by tests/test_gpu_cases.py); building a
case's module needs TVM's compiler.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import tvm

from .gpu_build import SuiteCase
from .models import conv2d_epilogue_model, dense_epilogue_model


def register_quick_gelu() -> None:
    """The custom activation of tutorial 02 (relax_cutlass.extend), for the custom-epilogue cases."""
    from tvm.relax.dpl import is_op

    from relax_cutlass.extend import register_activation, registered_activations

    if "quick_gelu" not in registered_activations():
        mul, sigmoid = is_op("relax.multiply"), is_op("relax.sigmoid")
        register_activation(
            "quick_gelu", lambda x, const: mul(x, sigmoid(mul(x, const(1.702)))), "x / (1.0f + expf(-1.702f * x))"
        )


# Dense cases: (name, model kwargs, codegen options)
TEST_M, TEST_N, TEST_K = 1000, 256, 384
SPLIT_K = {"tile": "tb128x128x64_c1x2x1_cooperative_splitk"}  # an SM90 configuration: no sm80 build
TEST_CASES = [
    ("dense", dict(bias=False), {}),
    ("dense_bias", dict(), {}),
    ("dense_bias_relu", dict(activation="relu"), {}),
    ("dense_bias_gelu", dict(activation="gelu"), {}),
    ("dense_bias_gelu_tanh", dict(activation="gelu_tanh"), {}),
    ("dense_bias_gelu_decomposed", dict(activation="gelu_decomposed"), {}),
    ("dense_bias_silu", dict(activation="silu"), {}),
    ("dense_bias_sigmoid", dict(activation="sigmoid"), {}),
    ("dense_bias_hardswish", dict(activation="hardswish"), {}),
    ("dense_bias_quick_gelu_custom", dict(activation="quick_gelu"), {}),
    ("dense_bias_quick_gelu_custom_res_relu", dict(activation="quick_gelu", residual=True, residual_relu=True), {}),
    ("dense_bias_residual", dict(residual=True), {}),
    ("dense_bias_residual_relu", dict(residual=True, residual_relu=True), {}),
    ("dense_bias_gelu_residual", dict(activation="gelu", residual=True), {}),
    # A second library holding exactly the kernel of dense_bias_residual: per-kernel CUTLASS state
    # must not leak between libraries loaded in one process.
    ("dense_bias_residual_second_library", dict(residual=True), {}),
    ("matmul_kn_bias_relu", dict(activation="relu", transposed=False), {}),
    ("dense_bias_cast_fp32", dict(out_cast="float32"), {}),
    ("dense_bias_gelu_f16acc", dict(activation="gelu"), dict(accumulator="float16")),
    ("dense_bias_relu_align2", dict(activation="relu", n=130, k=66), {}),
    ("dense_bias_gelu_symbolic_m", dict(activation="gelu", m="m"), {}),
    # x @ I + 0 with every finite fp16 value in x (gpu_checks.check_gelu_every_fp16): the 16-bit
    # GELU through real kernels, against the correctly rounded gelu.
    ("dense_bias_gelu_every_fp16", dict(activation="gelu", m=63488 // 8, n=8, k=8, bind=False), {}),
    ("dense_bias_silu_batched3d", dict(activation="silu", m=50, batch=(4,)), {}),
    ("dense_bias_gelu_bf16", dict(activation="gelu", dtype="bfloat16"), {}),
    (
        "dense_bias_residual_relu_bf16_unbound",
        dict(residual=True, residual_relu=True, dtype="bfloat16", bind=False),
        {},
    ),
    # K not a multiple of the 64-deep K tile, N not a multiple of the N tile.
    ("dense_bias_gelu_k328_n264", dict(activation="gelu", k=328, n=264), {}),
    # Weights left as parameters: B stays an (N, K) "dense" weight (column-major B kernels).
    ("dense_nk_bias_gelu_unbound", dict(activation="gelu", bind=False), {}),
    ("dense_nk_bias_residual_relu_unbound", dict(residual=True, residual_relu=True, bind=False), {}),
    ("dense_nk_bias_gelu_symbolic_m_unbound", dict(activation="gelu", m="m", bind=False), {}),
    # SM90 split-K (a profiling candidate, pinned here): slices reduced before the epilogue.
    ("dense_bias_gelu_splitk_m128_k4096", dict(activation="gelu", m=128, n=1024, k=4096), SPLIT_K),
    ("dense_bias_residual_relu_splitk_m128", dict(residual=True, residual_relu=True, m=128, n=1024, k=4096), SPLIT_K),
    # The slice count follows the call's M: 16 slices at m=1, none at m=4096.
    ("dense_bias_silu_splitk_symbolic_m", dict(activation="silu", m="m", n=1024, k=2048), SPLIT_K),
]
SYMBOLIC_RUNS = [{"m": 1}, {"m": 777}, {"m": 4096}]
# Symbolic M dispatching among tuned M buckets at run time: a case only with a tuning database.
TUNED_CASE = ("dense_nk_bias_gelu_symbolic_m_tuned", dict(activation="gelu", m="m", n=4096, k=1024, bind=False))
FAMILIES = ("auto", "sm80")  # the target's native kernels, and CUTLASS 2.x's on the same GPU

# conv2d cases: NCHW models as the PyTorch frontend writes them (offload_pipeline converts them to
# NHWC), checked against TVM's build of the same NCHW model and float64 torch.
CONV_BASE = dict(n=4, h=20, w=20, c=32, k=64)
CONV_TEST_CASES = [
    ("conv2d", dict(bias=False), {}),
    ("conv2d_bias", dict(), {}),
    ("conv2d_bias_relu", dict(activation="relu"), {}),
    ("conv2d_bias_silu", dict(activation="silu"), {}),
    ("conv2d_bias_sigmoid", dict(activation="sigmoid"), {}),
    ("conv2d_bias_hardswish", dict(activation="hardswish"), {}),
    ("conv2d_bias_gelu", dict(activation="gelu"), {}),
    ("conv2d_bias_quick_gelu_custom", dict(activation="quick_gelu"), {}),
    ("conv2d_bias_residual", dict(residual=True), {}),
    ("conv2d_bias_residual_relu", dict(residual=True, residual_relu=True), {}),
    ("conv2d_bias_silu_residual_relu", dict(activation="silu", residual=True, residual_relu=True), {}),
    ("conv2d_7x7_s2_bias_relu", dict(kernel=7, stride=2, padding=3), {}),
    ("conv2d_1x1_bias_relu", dict(kernel=1, padding=0, activation="relu"), {}),
    ("conv2d_1x1_s2_bias", dict(kernel=1, stride=2, padding=0), {}),
    ("conv2d_dilation2_bias_relu", dict(dilation=2, padding=2, activation="relu"), {}),
    ("conv2d_asym_pad_bias_relu", dict(padding=(1, 0, 2, 1), activation="relu"), {}),
    ("conv2d_c12_k20_align4_bias_relu", dict(c=12, k=20, activation="relu"), {}),
    ("conv2d_c6_k10_align2_bias_relu", dict(c=6, k=10, activation="relu"), {}),
    ("conv2d_c3_stem_stays_in_tvm", dict(c=3, kernel=7, stride=2, padding=3, activation="relu"), {}),
    ("conv2d_splitk_n1_7x7_c512_bias_relu", dict(n=1, h=7, w=7, c=512, k=512, activation="relu"), {}),
    ("conv2d_symbolic_n_bias_relu", dict(n="n", activation="relu"), {}),
    ("conv2d_bias_residual_relu_unbound", dict(residual=True, residual_relu=True, bind=False), {}),
    ("conv2d_bias_relu_f16acc", dict(activation="relu"), dict(accumulator="float16")),
]
CONV_SYMBOLIC_RUNS = [{"n": 1}, {"n": 5}]


def _register_custom_activation(kwargs: dict) -> None:
    """A custom-epilogue case registers its activation when its model is built (the offload that
    follows needs it), not when the case tables are read: registering is global, and the CPU tests
    of relax_cutlass.extend (collected in the same session) expect a clean registry."""
    if kwargs.get("activation") == "quick_gelu":
        register_quick_gelu()


def dense_case_model(kwargs: dict) -> tuple[tvm.IRModule, bool]:
    """A dense case's module (TEST_M x TEST_N x TEST_K unless it says otherwise), and whether its
    weights are bound."""
    kw = dict(m=TEST_M, n=TEST_N, k=TEST_K) | kwargs
    _register_custom_activation(kw)
    bind_weights = kw.pop("bind", True)
    return dense_epilogue_model(kw.pop("m"), kw.pop("n"), kw.pop("k"), **kw), bind_weights


def conv_case_model(kwargs: dict) -> tuple[tvm.IRModule, bool]:
    kw = CONV_BASE | kwargs
    _register_custom_activation(kw)
    bind_weights = kw.pop("bind", True)
    return conv2d_epilogue_model(kw.pop("n"), kw.pop("h"), kw.pop("w"), kw.pop("c"), kw.pop("k"), **kw), bind_weights


def graph_cases() -> list[tuple[str, tvm.IRModule, bool, list[dict]]]:
    """A fixed sample of the property tests' random graphs (relax_cutlass/testing/graphs.py), for the GPU: from a
    derandomized draw, the examples that together cover the most offloadable layer kinds, epilogues,
    residual diamonds, batch kinds and weight bindings. -> (name, module, bind weights, runs)."""
    from .graphs import CONV_GRAPH, GEMM_GRAPH, conv_features, conv_graph, diverse_sample, gemm_features, gemm_graph

    cases = []
    for i, ex in enumerate(diverse_sample(GEMM_GRAPH, gemm_features, 10)):
        runs = [{"b": 1}, {"b": 3}] if ex["batch"] == "b" else [{}]
        mod = gemm_graph(ex["batch"], ex["rows"], ex["features"], ex["layers"])
        cases.append((f"graph_gemm_{i}", mod, ex["bind"], runs))
    for i, ex in enumerate(diverse_sample(CONV_GRAPH, conv_features, 5)):
        runs = [{"n": 1}, {"n": 2}] if ex["batch"] == "n" else [{}]
        mod = conv_graph(ex["batch"], ex["size"], ex["channels"], ex["layers"])
        cases.append((f"graph_conv_{i}", mod, False, runs))
    return cases


def attention_cases() -> list[tuple[str, tvm.IRModule, list[dict], dict]]:
    """Fused attention: BERT-large's shape, odd and single-query sequence lengths, cross attention,
    every tile and alignment class of head dim, symbolic batch, bf16, R.nn.attention, a divided
    scale without casts. -> (name, module, runs, spec for the float64 reference; "bench": also a
    benchmark case of bench/gpu_suite.py)."""
    from .attention import op_attention, torch_export_attention

    def export(name, runs=({},), bench=False, **kw):
        b, s, n, h = (kw.get(key, d) for key, d in (("b", 2), ("s", 128), ("n", 8), ("h", 64)))
        spec = {"attention": "export", "heads": n, "head_dim": h, "scale": 1 / math.sqrt(h), "bench": bench}
        spec |= {"dtype": kw["dtype"]} if "dtype" in kw else {}
        return (name, torch_export_attention(**({"b": b, "s": s, "n": n, "h": h} | kw)), list(runs), spec)

    return [
        export("attention_bert_b8_s128", b=8, n=16, bench=True),
        export("attention_bert_b1_s128", b=1, n=16, bench=True),  # under-filled: 32-query tiles
        # The same at batch 1 with the batch symbolic: the 64-query tiles (the rule needs the size).
        export("attention_bert_bsym_s128", runs=({"batch": 1},), n=16, symbolic_batch=True, bench=True),
        export("attention_s77", s=77, n=12),
        export("attention_cross_s100_t333", s=100, t=333),
        export("attention_s1_t200", s=1, t=200),
        export("attention_s1024", s=1024, n=16),
        export("attention_h128", h=128),
        export("attention_h80", h=80),
        export("attention_h36_unaligned", h=36),
        export("attention_symbolic_batch", runs=({"batch": 1}, {"batch": 5}), symbolic_batch=True),
        export("attention_bf16", dtype="bfloat16"),
        export("attention_divide_no_cast", scale_op="divide", cast=False),
        (
            "attention_op_bsnh",
            op_attention(b=2, s=64, n=8, h=64),
            [{}],
            {"attention": "op", "heads": 8, "head_dim": 64, "scale": 1 / 8},
        ),
    ]


def frontend_cases() -> list[tuple[str, Callable[[], tvm.IRModule]]]:
    """The real models of the CPU tests that have no benchmark of their own, at realistic sizes:
    a LLaMA-7B-sized gated MLP through torch.export, and the ONNX model through the ONNX frontend.
    -> (name, module factory): exporting the MLP takes a while, so only a build of it does."""
    from relax_cutlass.prepare import to_float16

    from .gpu_build import shippable
    from .models import onnx_conv_mlp
    from .models.torch_transformers import llama_mlp_module

    return [
        (
            "llama_mlp_t512_h4096_i11008",
            lambda: shippable(*llama_mlp_module(tokens=512, hidden=4096, intermediate=11008)),
        ),
        ("onnx_conv_mlp", lambda: to_float16(onnx_conv_mlp()[0])),  # weights stay bound: a few KB
    ]


def correctness_cases(tuning_db: str = "") -> list[SuiteCase]:
    """Every correctness case, in the suite's order; with a tuning database, also TUNED_CASE."""
    dense = list(TEST_CASES) + ([(*TUNED_CASE, {"tuning_db": tuning_db})] if tuning_db else [])
    cases = [
        SuiteCase(
            "tests", name, lambda kw=kwargs: dense_case_model(kw), options,
            families=("auto",) if "tile" in options else FAMILIES,
            runs=tuple(SYMBOLIC_RUNS if kwargs.get("m") == "m" else [{}]),
            spec={k: v for k, v in kwargs.items() if k not in ("batch", "bind")} | {"options": options},
        )
        for name, kwargs, options in dense
    ]  # fmt: skip
    cases += [
        SuiteCase(
            "conv", name, lambda kw=kwargs: conv_case_model(kw), options,
            runs=tuple(CONV_SYMBOLIC_RUNS if kwargs.get("n") == "n" else [{}]),
            spec=CONV_BASE | {k: v for k, v in kwargs.items() if k != "bind"} | {"options": options},
        )
        for name, kwargs, options in CONV_TEST_CASES
    ]  # fmt: skip
    cases += [
        SuiteCase("graphs", name, lambda m=mod, b=bind: (m, b), runs=tuple(runs))
        for name, mod, bind, runs in graph_cases()
    ]
    cases += [
        SuiteCase("frontends", name, functools.cache(lambda f=factory: (f(), False)))
        for name, factory in frontend_cases()
    ]
    cases += [
        SuiteCase("attention", name, lambda m=mod: (m, False), runs=tuple(runs), spec=spec)
        for name, mod, runs, spec in attention_cases()
    ]
    return cases
