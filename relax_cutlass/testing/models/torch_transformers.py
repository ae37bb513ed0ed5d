"""Transformer models from Hugging Face `transformers` and PyTorch (BERT encoders, a LLaMA-style
gated MLP), imported with `torch.export` + `from_exported_program` as in torch_models."""

from __future__ import annotations

import numpy as np
import tvm

from .torch_models import import_exported, import_torch


def bert_encoder(layers: int = 2, hidden: int = 1024, heads: int = 16, ffn: int = 4096, seed: int = 0):
    """A Hugging Face `transformers` BERT encoder stack (random init, no hub download; eval mode,
    eager attention so torch.export sees the matmuls). Input: hidden states (batch, seq, hidden)."""
    torch = import_torch()
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        attn_implementation="eager",
    )
    encoder = BertModel(config, add_pooling_layer=False).encoder.eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, hidden_states):
            return self.encoder(hidden_states).last_hidden_state

    return Encoder().eval()


def bert_encoder_torch(
    layers: int = 24, hidden: int = 1024, heads: int = 16, ffn: int = 4096, attention: str = "sdpa", seed: int = 0
):
    """Hugging Face's BertEncoder (eval) written in plain PyTorch, with the same parameter names, so
    `load_state_dict(bert_encoder(...).encoder.state_dict())` carries a transformers model over.

    The torch peer of the BERT benchmark on the GPU host, which has torch but not transformers.
    attention="sdpa" is transformers' default (`F.scaled_dot_product_attention`, flash attention
    in fp16 on a GPU); "eager" spells out softmax(q k^T / sqrt(d)) v as the exported graph does.
    """
    torch = import_torch()
    nn, F = torch.nn, torch.nn.functional
    head_dim = hidden // heads

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = (p(x).view(b, s, heads, head_dim).transpose(1, 2) for p in (self.query, self.key, self.value))
            if attention == "sdpa":
                ctx = F.scaled_dot_product_attention(q, k, v)
            else:
                ctx = torch.softmax(q @ k.transpose(-1, -2) / head_dim**0.5, dim=-1) @ v
            return ctx.transpose(1, 2).reshape(b, s, hidden)

    class DenseNorm(nn.Module):  # BertSelfOutput / BertOutput: LayerNorm(dense(x) + residual)
        def __init__(self, width):
            super().__init__()
            self.dense = nn.Linear(width, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)

        def forward(self, x, residual):
            return self.LayerNorm(self.dense(x) + residual)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.self = SelfAttention()
            self.output = DenseNorm(hidden)

        def forward(self, x):
            return self.output(self.self(x), x)

    class Intermediate(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(hidden, ffn)

        def forward(self, x):
            return F.gelu(self.dense(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Attention()
            self.intermediate = Intermediate()
            self.output = DenseNorm(ffn)

        def forward(self, x):
            a = self.attention(x)
            return self.output(self.intermediate(a), a)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, x):
            for layer in self.layer:
                x = layer(x)
            return x

    if attention not in ("sdpa", "eager"):
        raise ValueError(f"attention={attention!r}: use 'sdpa' or 'eager'")
    torch.manual_seed(seed)
    return Encoder().eval()


def bert_module(batch: int = 8, seq: int = 128, **kwargs) -> tuple[tvm.IRModule, dict]:
    """The transformers BERT encoder imported with torch.export: (IRModule, weights)."""
    torch = import_torch()
    model = bert_encoder(**kwargs)
    hidden = model.encoder.config.hidden_size
    example = (torch.from_numpy(np.zeros((batch, seq, hidden), "float32")),)
    return import_exported(model, example)


def llama_mlp_module(tokens: int = 64, hidden: int = 256, intermediate: int = 704, seed: int = 0):
    """A LLaMA-style gated MLP: down(silu(gate(x)) * up(x)) + x, imported with torch.export."""
    torch = import_torch()
    nn = torch.nn

    class GatedMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(hidden, intermediate, bias=False)
            self.up = nn.Linear(hidden, intermediate, bias=False)
            self.down = nn.Linear(intermediate, hidden, bias=False)

        def forward(self, x):
            return self.down(nn.functional.silu(self.gate(x)) * self.up(x)) + x

    torch.manual_seed(seed)
    example = (torch.from_numpy(np.zeros((tokens, hidden), "float32")),)
    return import_exported(GatedMLP().eval(), example)


def last_hidden_state(model):
    """Wrap a Hugging Face `transformers` model so that its forward takes token ids (and an optional
    attention mask) and returns one tensor, the last hidden state: torch.export and the zoo need a
    single output, and the wrapper keeps the model's own forward (its attention implementation,
    masks and caches) as users run it."""
    torch = import_torch()

    class LastHiddenState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask=None):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return LastHiddenState().eval()


# Tiny random-init models of many transformers families (scripts/hf_sweep.py and the tests).
TINY_LAYERS = 2
TINY_VOCAB = 512


def tiny_families(transformers) -> dict:
    """family -> (config class, model class, config kwargs); hidden 128, 4 heads, 2 layers."""
    t = transformers
    decoder = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_hidden_layers": TINY_LAYERS,
               "vocab_size": TINY_VOCAB}  # fmt: skip
    gqa = {**decoder, "num_key_value_heads": 2}
    encoder = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_hidden_layers": TINY_LAYERS,
               "vocab_size": TINY_VOCAB}  # fmt: skip
    return {
        "llama": (t.LlamaConfig, t.LlamaModel, gqa),
        "mistral": (t.MistralConfig, t.MistralModel, {**gqa, "sliding_window": 16}),
        "qwen2": (t.Qwen2Config, t.Qwen2Model, gqa),
        "qwen3": (getattr(t, "Qwen3Config", None), getattr(t, "Qwen3Model", None), {**gqa, "head_dim": 32}),
        "gemma": (t.GemmaConfig, t.GemmaModel, {**gqa, "head_dim": 32}),
        # eager: where transformers soft-caps (its sdpa path, the default in 5.17, drops the cap)
        "gemma2": (
            t.Gemma2Config,
            t.Gemma2Model,
            {**gqa, "head_dim": 32, "sliding_window": 16, "attn_implementation": "eager"},
        ),
        "phi": (t.PhiConfig, t.PhiModel, decoder),
        "phi3": (t.Phi3Config, t.Phi3Model, {**gqa, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}),
        "stablelm": (t.StableLmConfig, t.StableLmModel, gqa),
        "falcon_new": (
            t.FalconConfig,
            t.FalconModel,
            {
                "hidden_size": 128,
                "num_attention_heads": 4,
                "num_kv_heads": 2,
                "num_hidden_layers": TINY_LAYERS,
                "vocab_size": TINY_VOCAB,
                "new_decoder_architecture": True,
            },
        ),  # fmt: skip
        "gpt2": (
            t.GPT2Config,
            t.GPT2Model,
            {"n_embd": 128, "n_layer": TINY_LAYERS, "n_head": 4, "vocab_size": TINY_VOCAB},
        ),
        "gpt_neox": (t.GPTNeoXConfig, t.GPTNeoXModel, decoder),
        "gptj": (
            t.GPTJConfig,
            t.GPTJModel,
            {"n_embd": 128, "n_layer": TINY_LAYERS, "n_head": 4, "vocab_size": TINY_VOCAB, "rotary_dim": 16},
        ),  # fmt: skip
        "codegen": (
            t.CodeGenConfig,
            t.CodeGenModel,
            {"n_embd": 128, "n_layer": TINY_LAYERS, "n_head": 4, "vocab_size": TINY_VOCAB, "rotary_dim": 16},
        ),  # fmt: skip
        "opt": (
            t.OPTConfig,
            t.OPTModel,
            {
                "hidden_size": 128,
                "ffn_dim": 256,
                "num_attention_heads": 4,
                "num_hidden_layers": TINY_LAYERS,
                "vocab_size": TINY_VOCAB,
                "word_embed_proj_dim": 128,
            },
        ),  # fmt: skip
        "bloom": (
            t.BloomConfig,
            t.BloomModel,
            {"hidden_size": 128, "n_head": 4, "n_layer": TINY_LAYERS, "vocab_size": TINY_VOCAB},
        ),  # fmt: skip
        "bert": (t.BertConfig, t.BertModel, encoder),
        "roberta": (t.RobertaConfig, t.RobertaModel, {**encoder, "pad_token_id": 1}),
        "distilbert": (
            t.DistilBertConfig,
            t.DistilBertModel,
            {"dim": 128, "hidden_dim": 256, "n_heads": 4, "n_layers": TINY_LAYERS, "vocab_size": TINY_VOCAB},
        ),  # fmt: skip
        "albert": (t.AlbertConfig, t.AlbertModel, {**encoder, "embedding_size": 64}),
        "electra": (t.ElectraConfig, t.ElectraModel, {**encoder, "embedding_size": 128}),
        "t5_encoder": (
            t.T5Config,
            t.T5EncoderModel,
            {
                "d_model": 128,
                "d_ff": 256,
                "num_heads": 4,
                "d_kv": 32,
                "num_layers": TINY_LAYERS,
                "vocab_size": TINY_VOCAB,
            },
        ),  # fmt: skip
        "clip_text": (t.CLIPTextConfig, t.CLIPTextModel, {**encoder, "max_position_embeddings": 77}),
    }


def tiny_model(family: str, torch, transformers):
    """A random-init `family` model of `tiny_families` in eval mode, returning its last hidden state
    (the pooler dropped): what the sweep and the attention tests import."""
    config_class, model_class, kwargs = tiny_families(transformers)[family]
    if config_class is None:
        raise RuntimeError("not in this transformers")
    kwargs = dict(kwargs)
    model = model_class(config_class(**kwargs)).eval()
    if family in ("bert", "roberta", "electra", "albert") and hasattr(model, "pooler"):
        model.pooler = None
    return last_hidden_state(model)


def tiny_input_families(transformers) -> dict:
    """Vision and speech families, whose forward takes pixels, a waveform or mel features:
    family -> (config class, model class, config kwargs, (input name, example shape)); hidden 128
    and 4 heads where the family has them, 2 layers or stages of 1 block."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    t = transformers
    encoder = {"hidden_size": 128, "num_hidden_layers": TINY_LAYERS, "num_attention_heads": 4, "intermediate_size": 256}
    patches = {**encoder, "image_size": 32, "patch_size": 8}
    stages = {"hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1]}
    waveform = {**encoder, "conv_dim": (32, 32, 32), "conv_stride": (5, 2, 2), "conv_kernel": (10, 3, 3),
                "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4}  # fmt: skip
    image32, image64 = ("pixel_values", (2, 3, 32, 32)), ("pixel_values", (2, 3, 64, 64))
    return {
        "vit": (t.ViTConfig, t.ViTModel, patches, image32),
        "deit": (t.DeiTConfig, t.DeiTModel, patches, image32),
        # a relative position bias on every layer's scores
        "beit": (t.BeitConfig, t.BeitModel, {**patches, "use_relative_position_bias": True}, image32),
        "dinov2": (t.Dinov2Config, t.Dinov2Model, patches, image32),
        "clip_vision": (t.CLIPVisionConfig, t.CLIPVisionModel, patches, image32),
        # windows of 4x4 patches, every second block shifted (a window mask beside the position bias)
        "swin": (
            t.SwinConfig,
            t.SwinModel,
            {
                "image_size": 32,
                "patch_size": 4,
                "embed_dim": 32,
                "depths": [2, 2],
                "num_heads": [2, 4],
                "window_size": 4,
            },
            image32,
        ),  # fmt: skip
        "convnext": (t.ConvNextConfig, t.ConvNextModel, stages, image64),
        "resnet": (t.ResNetConfig, t.ResNetModel, {**stages, "embedding_size": 16}, image64),
        "regnet": (t.RegNetConfig, t.RegNetModel, {**stages, "embedding_size": 16, "groups_width": 8}, image64),
        # initializer_range: at its default (0.02) the random init's activations vanish (1e-24 at the
        # output, below float16's range: every build's output is 0); at 0.2 they stay in range
        "mobilenet_v2": (
            t.MobileNetV2Config,
            t.MobileNetV2Model,
            {"image_size": 64, "depth_multiplier": 0.35, "initializer_range": 0.2},
            image64,
        ),  # fmt: skip
        "segformer": (
            t.SegformerConfig,
            t.SegformerModel,
            {**stages, "num_attention_heads": [1, 2, 4, 8], "decoder_hidden_size": 64},
            image64,
        ),  # fmt: skip
        "wav2vec2": (t.Wav2Vec2Config, t.Wav2Vec2Model, waveform, ("input_values", (2, 1600))),
        "hubert": (t.HubertConfig, t.HubertModel, waveform, ("input_values", (2, 1600))),
        "whisper_encoder": (
            t.WhisperConfig,
            WhisperEncoder,
            {
                "d_model": 128,
                "encoder_layers": TINY_LAYERS,
                "encoder_attention_heads": 4,
                "encoder_ffn_dim": 256,
                "num_mel_bins": 80,
                "max_source_positions": 32,
            },
            ("input_features", (2, 80, 64)),
        ),  # fmt: skip
    }


def tiny_input_model(family: str, torch, transformers):
    """-> (a random-init `family` model of `tiny_input_families` in eval mode whose forward takes its
    one float input and returns the last hidden state, that input's example shape)."""
    config_class, model_class, kwargs, (name, shape) = tiny_input_families(transformers)[family]
    model = model_class(config_class(**kwargs)).eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(**{name: x}).last_hidden_state

    return LastHiddenState().eval(), shape
