"""1-D convolutions (speech encoders' stems) offloaded as conv2d of height 1 (rewrites.conv1d): the
rewritten module computes what the original does, the cast, bias and activation after each conv
fuse into its epilogue, and a conv1d that is not rewritten is a report row with the reason (they
used to stay in TVM unreported, outside the FLOP count)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tvm import relax

import relax_cutlass
from relax_cutlass.rewrites.conv1d import conv1d_as_conv2d
from relax_cutlass.testing.harness import compare_on_cpu


def _rows(mod, arch="sm_90a"):
    report = relax_cutlass.offload_report(mod, arch)
    return report, [r for r in report.offloaded if r["op"] == "conv2d"]


class _Stem(torch.nn.Module):
    """Conv1d layers as speech encoders write them: strided, padded, dilated, grouped, with and
    without bias, each followed by an activation."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv1d(16, 32, 3, padding=1)
        self.b = torch.nn.Conv1d(32, 32, 3, stride=2, padding=1, bias=False)
        self.c = torch.nn.Conv1d(32, 64, 5, padding=4, dilation=2, groups=4)

    def forward(self, x):
        return torch.nn.functional.silu(self.c(torch.relu(self.b(torch.nn.functional.gelu(self.a(x))))))


def test_conv1d_layers_are_offloaded_as_conv2d_and_match():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 40)
    mod = relax_cutlass.from_torch(_Stem().eval(), (x,))
    report, convs = _rows(mod)
    assert len(convs) == 3 and not report.left_in_tvm, str(report)
    assert [r["epilogue"] for r in convs].count("none") == 0, [r["epilogue"] for r in convs]
    compare_on_cpu(mod, [x.numpy()])


def test_whisper_encoder_stem_is_offloaded():
    """transformers' Whisper encoder: conv1d + gelu twice, then attention of scale exactly 1 (its q
    is scaled in the projection): the model whose build failed on the scale literal `1f`."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = transformers.WhisperConfig(
        d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=32, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128,
        vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = WhisperEncoder(config).eval()

        def forward(self, features):
            return self.encoder(features).last_hidden_state

    features = torch.randn(1, 16, 64)
    mod = relax_cutlass.from_torch(Encoder().eval(), (features,))
    report, convs = _rows(mod, "sm_80")
    assert [r["epilogue"] for r in convs] == ["bias+gelu", "bias+gelu"], str(report)
    attention = [r for r in report.offloaded if r["op"] == "attention"]
    assert attention and all(r["attention"]["scale"] == 1.0 for r in attention)
    assert not report.left_in_tvm and report.offloaded_flop_fraction == 1.0
    compare_on_cpu(mod, [features.numpy()], arch="sm_80")


def _conv1d_module(data_layout: str):
    bb = relax.BlockBuilder()
    shape = (1, 8, 32) if data_layout == "NCW" else (1, 32, 8)
    x = relax.Var("x", relax.TensorType(shape, "float16"))
    w = relax.const(np.ones((16, 8, 3), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv1d(x, w, padding=1, data_layout=data_layout)))
        bb.emit_func_output(out)
    return bb.get()


def test_a_conv1d_that_is_not_rewritten_is_reported():
    report = relax_cutlass.offload_report(_conv1d_module("NWC"), "sm_90a")
    (left,) = report.left_in_tvm
    assert left["op"] == "conv1d" and "data_layout NWC" in left["reasons"][0], left
    assert left["flops"] == 2 * 32 * 16 * 8 * 3


def test_the_rewrite_leaves_no_conv1d_and_keeps_values_elsewhere():
    mod = _conv1d_module("NCW")
    rewritten = conv1d_as_conv2d(mod["main"])
    assert "conv1d" not in rewritten.script() and "conv2d" in rewritten.script()
    assert conv1d_as_conv2d(rewritten).same_as(rewritten)  # nothing left to rewrite
    report, convs = _rows(mod)
    assert len(convs) == 1 and not report.left_in_tvm


@pytest.mark.parametrize("feature_norm", [pytest.param("group", marks=pytest.mark.slow), "layer"])
def test_wav2vec2_feature_encoder_is_offloaded(feature_norm):
    """transformers' Wav2Vec2: a seven-layer (here three) conv1d feature encoder over the raw audio
    (its first layer one input channel, padded to 8), group or layer norm, and a grouped conv1d as
    the positional embedding (16 taps, 4 groups)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Wav2Vec2Config(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, feat_extract_norm=feature_norm, do_stable_layer_norm=feature_norm == "layer",
    )  # fmt: skip
    torch.manual_seed(0)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = transformers.Wav2Vec2Model(config).eval()

        def forward(self, audio):
            return self.model(audio).last_hidden_state

    audio = torch.randn(1, 800)
    mod = relax_cutlass.from_torch(Encoder().eval(), (audio,))
    report, convs = _rows(mod)
    assert len(convs) == 4 and not report.left_in_tvm, str(report)
    compare_on_cpu(mod, [audio.numpy()])
