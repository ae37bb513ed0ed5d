"""The channel-affine kind (opt-in until its kernel runs on a GPU): DenseNet's pre-activation
batch norm and ReLU of a concatenation of earlier layers' outputs as one region, on the CPU (the
rewritten module against the original, regions served by their llvm-built composites), its
legality rules, and its kernel and glue through nvcc."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import relax_cutlass
from relax_cutlass import kinds
from relax_cutlass.kinds.channel_affine.kind import KIND
from relax_cutlass.kinds.channel_affine.patterns import ChannelAffineSpec
from relax_cutlass.kinds.channel_affine.records import ChannelAffineKernel, ChannelAffineProblem
from relax_cutlass.kinds.channel_affine.reference import reference
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing.channel_affine_graphs import dense_block_module
from relax_cutlass.testing.harness import compare_on_cpu, offload_for_cpu


def test_the_kind_is_registered_by_default():
    assert kinds.kind_named("channel_affine") is KIND and "channel_affine" not in kinds.OPT_IN


def _inputs(mod, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2, 2, [int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype)) for p in mod["main"].params]


@pytest.mark.parametrize("parts", [(64,), (64, 32), (64, 32, 32, 32, 32), (4096, 8)])
def test_a_concatenation_with_its_batch_norm_and_relu_is_one_region(parts):
    """One region per concatenation, its parts and the batch norm's four vectors its parameters;
    the rewritten module matches the original."""
    mod = dense_block_module(parts)
    partitioned, rewritten = offload_for_cpu(mod, arch="sm_90a")
    text = rewritten["main"].script()
    assert text.count("R.call_dps_packed") == 1 and "R.concat(" not in text and "R.nn.batch_norm" not in text
    compare_on_cpu(mod, _inputs(mod), arch="sm_90a")


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(parts_channels=(64, 36)), "multiple of 8"),
        (dict(training=True), "inference mode"),
        (dict(dtype="float32"), "16-bit float dtype"),
    ],
)
def test_what_the_kernel_cannot_take_stays_in_tvm(change, reason):
    from relax_cutlass.kinds.channel_affine.patterns import pattern, rules
    from relax_cutlass.kinds.ir import rules_at

    mod = dense_block_module(**change)
    spec = ChannelAffineSpec(len(change.get("parts_channels", (64, 32, 32))))
    body = mod["main"].body.blocks[0].bindings
    var2val = {b.var: b.value for b in body}
    problems = rules_at(pattern, rules, spec, body[-1].value, var2val)
    assert problems and any(reason in p for p in problems), problems
    partitioned, rewritten = offload_for_cpu(mod, arch="sm_90a")
    assert "R.call_dps_packed" not in rewritten["main"].script()


def test_a_densenet_offloads_every_pre_activation_norm():
    """torchvision's DenseNet written out, two small blocks: every layer's concatenation + batch
    norm + ReLU (and the transition's) is a channel-affine region, none left in TVM; the
    rewritten module matches the original."""
    from relax_cutlass.testing.models.torch_models import densenet

    torch = pytest.importorskip("torch")
    model = densenet(growth=16, blocks=(3, 2), init_features=32, num_classes=10)
    mod = relax_cutlass.from_torch(model, (torch.randn(2, 3, 32, 32),), dtype="float16")
    partitioned, rewritten = offload_for_cpu(mod, arch="sm_90a")
    report = relax_cutlass.offload_report(partitioned)
    affine = [r for r in report.offloaded if r["op"] == "channel_affine"]
    # block 1: layers 2, 3 on 2- and 3-part concatenations, the transition's on 4 parts; block 2:
    # layer 2 on 2 parts (the final norm feeds a pooling in float32: no cast, not this pattern);
    # the first layer of each block reads one tensor
    assert sorted(r["parts"] for r in affine) == [1, 1, 2, 2, 3, 4], str(report)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 32, 32)).astype("float32")
    compare_on_cpu(mod, [x], arch="sm_90a")


def test_the_reference_is_the_graphs_computation():
    rng = np.random.default_rng(0)
    parts = [rng.uniform(-1, 1, (3, 8)).astype("float16"), rng.uniform(-1, 1, (3, 16)).astype("float16")]
    gamma, beta, mean = (rng.uniform(0.5, 1.5, 24).astype("float32") for _ in range(3))
    var = rng.uniform(0.5, 2, 24).astype("float32")
    got = reference(parts, gamma, beta, mean, var, 1e-5)
    x = np.concatenate(parts, -1).astype("float64")
    want = np.maximum((x - mean) / np.sqrt(var.astype("float64") + 1e-5) * gamma + beta, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_one_kernel_per_dtype_and_activation():
    a = ChannelAffineKernel(ChannelAffineProblem(128, (64, 32), 1e-5))
    b = ChannelAffineKernel(ChannelAffineProblem(None, (64, 32, 32, 32), 1e-3))
    assert a.name == b.name == "sm80_channel_affine_f16_relu"
    assert emit_kernel(a).text == emit_kernel(b).text


@pytest.mark.nvcc
def test_a_dense_block_builds_for_a_gpu(tmp_path):
    """Kernel, glue and link through nvcc, for sm_80 (no GPU needed)."""
    mod = dense_block_module((64, 32, 32))
    offloaded = relax_cutlass.offload_pipeline("sm_80", profile="never")(mod)
    report = relax_cutlass.offload_report(offloaded)  # (a kernel that fails to compile goes back to TVM)
    assert [r["op"] for r in report.offloaded] == ["channel_affine"] and not report.left_in_tvm, str(report)
    ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm"))
    ex.export_library(str(tmp_path / "dense_block.so"))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    channels=st.lists(st.sampled_from([8, 16, 24, 32, 64, 12]), min_size=1, max_size=6),
    rows=st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 5)),
    dtype=st.sampled_from(["float16", "bfloat16"]),
)
def test_random_concatenations(channels, rows, dtype):
    """Any number of parts, channel counts and leading sizes: the concatenation is read by the kernel
    exactly when every part is whole 16-byte vectors of channels; else, where their sum is, the
    concatenation stays in TVM and the kernel normalizes it as one part; the rewritten module
    computes what the original does."""
    mod = dense_block_module(tuple(channels), dtype=dtype, rows=rows)
    partitioned, rewritten = offload_for_cpu(mod, arch="sm_90a")
    text = rewritten["main"].script()
    offloaded = "R.call_dps_packed" in text
    whole = all(c % 8 == 0 for c in channels)
    assert offloaded == (whole or sum(channels) % 8 == 0), channels
    assert ("R.concat(" in text) == (len(channels) > 1 and not whole), text
    if offloaded:
        compare_on_cpu(mod, _inputs(mod), rtol=2e-2 if dtype == "bfloat16" else 1e-2, arch="sm_90a")


def test_each_output_vector_is_read_from_its_part(tmp_path):
    """emit.CHANNEL_SOURCE, the kernel's index arithmetic, built with the host compiler: every output
    vector of random concatenations (1 to 7 parts, rows 1 to 5) is read from the part and vector
    numpy's concatenation takes it from, and normalized as its output channels."""
    import shutil
    import subprocess

    from relax_cutlass.kinds.channel_affine.emit import CHANNEL_SOURCE

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    rng = np.random.default_rng(0)
    cases = [(int(rng.integers(1, 6)), [8 * int(c) for c in rng.integers(1, 9, rng.integers(1, 8))]) for _ in range(40)]
    lines = []
    for k, (rows, channels) in enumerate(cases):
        lines.append(f"  const int64_t channels{k}[] = {{{', '.join(str(c) for c in channels)}}};")
        columns = sum(channels) // 8
        # as the kernel indexes: a column's source once, then row r's vector at vector + r * stride
        lines.append(
            f"  for (int64_t i = 0; i < {rows * columns}; ++i) {{"
            f" auto s = relax_channel_source(i % {columns}, channels{k}, {len(channels)}, 8);"
            f' std::printf("%d %lld %lld\\n", s.part, (long long)(s.vector + i / {columns} * s.stride),'
            " (long long)s.channel); }"
        )
    main = "#define RELAX_HOST_DEVICE inline\n#include <cstdint>\n#include <cstdio>\n" + CHANNEL_SOURCE
    main += "int main() {\n" + "\n".join(lines) + "\n}\n"
    (tmp_path / "source.cc").write_text(main)
    subprocess.run([cxx, "-O1", "-o", str(tmp_path / "source"), str(tmp_path / "source.cc")], check=True)
    out = subprocess.run([str(tmp_path / "source")], check=True, capture_output=True, text=True).stdout.split("\n")
    got = iter(tuple(int(x) for x in line.split()) for line in out if line)
    for rows, channels in cases:
        # tag every element with (part, its flat index in the part); the concatenation's vectors
        parts = [
            np.stack([np.full((rows, c), p), np.arange(rows * c).reshape(rows, c)], -1) for p, c in enumerate(channels)
        ]
        vectors = np.concatenate(parts, axis=1).reshape(-1, 8, 2)
        for i, vector in enumerate(vectors):
            part, index, channel = next(got)
            assert (vector[:, 0] == part).all() and (vector[:, 1] == index * 8 + np.arange(8)).all(), (channels, rows)
            assert channel == i * 8 % sum(channels), (channels, rows, i)
