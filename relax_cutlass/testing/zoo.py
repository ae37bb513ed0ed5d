"""The model zoo's registry: real models nobody here wrote (torchvision, transformers; random init,
no download), how each is built, and how its result is judged and tabled. bench/zoo.py imports,
offloads, builds and times them on the GPU host; tests/test_zoo.py checks the judging on the CPU.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry: how to build it (random init) and its example inputs."""

    name: str
    family: str  # "vision" (channels_last for torch) or "transformer"
    batch: int
    seq: int = 0  # transformers: sequence length of the token ids
    # "torch": relax_cutlass.from_torch; "onnx": the same model exported with torch.onnx (dynamo)
    # and imported with relax_cutlass.from_onnx (an entry named after its model, "<model>_onnx")
    importer: str = "torch"
    # the 16-bit type the model runs in (torch's model too); a bfloat16 entry's weights are rounded
    # to bfloat16 first, as a bfloat16 checkpoint holds them
    dtype: str = "float16"

    @property
    def model(self) -> str:
        """The model this entry builds (an ONNX entry's torch model is its torch entry's)."""
        return self.name.removesuffix("_onnx") if self.importer == "onnx" else self.name

    def build(self):
        """-> (torch model in float32 eval mode, example inputs tuple); deterministic, so the build
        and the time phase construct the same weights."""
        import torch

        torch.manual_seed(0)
        model, example = BUILDERS[self.model](self, torch)
        if self.dtype == "bfloat16":
            model = model.to(torch.bfloat16).float()
        return model, example

    def import_module(self, model, example: tuple, workdir):
        """The Relax module of `model` as this entry's importer gives it (an ONNX entry writes
        `<name>.onnx` into `workdir` first)."""
        from pathlib import Path

        import relax_cutlass

        if self.importer == "torch":
            return relax_cutlass.from_torch(model, example, dtype=self.dtype)
        import torch

        path = Path(workdir) / f"{self.name}.onnx"
        torch.onnx.export(model, example, str(path), dynamo=True)
        return relax_cutlass.from_onnx(path, dtype=self.dtype)


def _vision(constructor_name: str):
    def build(entry: ZooModel, torch):
        import torchvision

        model = getattr(torchvision.models, constructor_name)(weights=None)
        randomize_zero_layers(model, torch)
        image = torch.randn(entry.batch, 3, 224, 224)
        return calibrate_batch_norm(model, image, torch), (image,)

    return build


def randomize_zero_layers(model, torch) -> None:
    """torchvision initializes some layers to zero (vit_b_16's classification head): its output is
    then all zeros, and every build matches it exactly, which checks nothing. Such a layer gets
    the default init of its type (nn.Linear's uniform), as a trained model's would be non-zero.
    Likewise ConvNeXt's layer scales start at 1e-6, which makes every block's contribution
    invisible in the output (the error check would then see only the stem and downsampling
    convs): they get values in a trained model's range, uniform in [0.1, 1]."""
    gen = torch.Generator().manual_seed(0)
    for name, param in model.named_parameters():
        if name.endswith("layer_scale"):
            with torch.no_grad():
                param.copy_(torch.rand(param.shape, generator=gen) * 0.9 + 0.1)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not module.weight.detach().any():
            module.reset_parameters()


def calibrate_batch_norm(model, image, torch):
    """Random init leaves batch norm at mean 0 / variance 1, so activations grow block after block
    (MobileNetV3's reach 1e5 and overflow fp16): set every batch norm's statistics from one batch,
    as a trained model's would be, then return the model in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for m in norms:
            m.momentum = None  # cumulative average: one batch sets the statistics exactly
            m.reset_running_stats()
        model.train()
        with torch.no_grad():
            model(image)
    return model.eval()


def _transformer(
    config_class: str, model_class: str, vocab: int, padding: bool | str = False, pad_step: int = 12, **config
):
    """A `transformers` model with random init; `padding`: called with an attention mask whose row b
    keeps seq - pad_step * b tokens (a padded batch of sentences of different lengths), padded on
    the right (True) or, as a decoder's batched prefill is, on the left ("left")."""

    def build(entry: ZooModel, torch):
        import transformers

        from .models.torch_transformers import last_hidden_state

        kwargs = {"add_pooling_layer": False} if model_class == "BertModel" else {}
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config), **kwargs)
        ids = torch.randint(0, vocab, (entry.batch, entry.seq))
        if not padding:
            return last_hidden_state(model.eval()), (ids,)
        lengths = torch.tensor([max(1, entry.seq - pad_step * b) for b in range(entry.batch)])
        positions = torch.arange(entry.seq)[None, :]
        kept = positions >= entry.seq - lengths[:, None] if padding == "left" else positions < lengths[:, None]
        return last_hidden_state(model.eval()), (ids, kept.to(torch.int64))

    return build


# a Llama with grouped-query attention (32 query heads over 8 kv heads), four layers of 2048
LLAMA_GQA = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_hidden_layers=4,
    vocab_size=32000,
)

GEMMA2_2B = dict(
    hidden_size=2304,
    intermediate_size=9216,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    num_hidden_layers=2,
    vocab_size=32000,
    # eager attention, where transformers soft-caps the scores (its sdpa path, the default for
    # Gemma-2 in transformers releases before sdpa was turned off for it, drops the cap)
    attn_implementation="eager",
)

BUILDERS = {
    "resnet50": _vision("resnet50"),
    "resnet50_b1": _vision("resnet50"),  # batch 1: the latency case
    "vit_b_16": _vision("vit_b_16"),
    "mobilenet_v3_large": _vision("mobilenet_v3_large"),
    "convnext_tiny": _vision("convnext_tiny"),
    # grouped 3x3 convs (32 groups), the ResNeXt/RegNet form
    "resnext50_32x4d": _vision("resnext50_32x4d"),
    # depthwise convs, squeeze-excitation, SiLU
    "efficientnet_b0": _vision("efficientnet_b0"),
    # pre-activation BN-ReLU before each conv, on channel concatenations of every earlier output
    "densenet121": _vision("densenet121"),
    "bert_base": _transformer("BertConfig", "BertModel", 30000),  # default (sdpa) attention
    # a padded batch: the attention mask a tokenizer gives sentences of different lengths
    "bert_base_padded": _transformer("BertConfig", "BertModel", 30000, padding=True),
    # BERT-large (24 layers, hidden 1024, 16 heads, FFN 4096) at 8 x 128, against torch in
    # the same run
    "bert_large": _transformer(
        "BertConfig",
        "BertModel",
        30000,
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
    ),
    "gpt2": _transformer("GPT2Config", "GPT2Model", 50000),
    "llama_gqa": _transformer("LlamaConfig", "LlamaModel", 32000, **LLAMA_GQA),
    # Llama-3-8B's layer shapes (hidden 4096, 32 query / 8 kv heads, SiLU-gated MLP 14336), two
    # layers, 1 x 2048 prefill
    "llama_8b_2l": _transformer(
        "LlamaConfig",
        "LlamaModel",
        32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=2,
        vocab_size=32000,
    ),
    # Siblings of GPT-2's packed projection: Falcon's fused projection with multi-query
    # attention (its key/value heads taken with negative indices: NaN in TVM's float16 build before
    # FixTvmCudaForms wrapped them) and GPT-NeoX's (Pythia's) per-head interleaved q/k/v
    "falcon_mq": _transformer(
        "FalconConfig",
        "FalconModel",
        32000,
        hidden_size=2048,
        num_attention_heads=32,
        num_hidden_layers=4,
        vocab_size=32000,
        multi_query=True,
        new_decoder_architecture=False,
    ),
    "gpt_neox": _transformer(
        "GPTNeoXConfig",
        "GPTNeoXModel",
        32000,
        hidden_size=1024,
        intermediate_size=4096,
        num_attention_heads=16,
        num_hidden_layers=8,
        vocab_size=32000,
    ),
    # Phi-3-mini's layer shapes (hidden 3072, 32 heads, intermediate 8192), two layers: its packed
    # gate_up_proj is split so the gated multiply fuses (unsplit, it runs in TVM)
    "phi3": _transformer(
        "Phi3Config",
        "Phi3Model",
        32064,
        hidden_size=3072,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=32,
        num_hidden_layers=2,
        vocab_size=32064,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    # a batched Llama-family prefill (llama_gqa's shapes) with left padding: causal, padding and
    # grouped-query attention in one mask, row b keeping 512 - 64 * b tokens
    "llama_left_padded": _transformer("LlamaConfig", "LlamaModel", 32000, padding="left", pad_step=64, **LLAMA_GQA),
    # BLOOM-560m's layer shapes (hidden 1024, 16 heads of 64), four layers: ALiBi beside the causal mask
    "bloom_4l": _transformer(
        "BloomConfig", "BloomModel", 32000, hidden_size=1024, n_head=16, n_layer=4, vocab_size=32000
    ),
    # Gemma-2-2B's layer shapes (hidden 2304, 8 query / 4 kv heads of 256, GELU-gated MLP 9216),
    # a sliding-window and a global layer: its attention scores soft-capped (50 * tanh(s / 50))
    "gemma2_2l": _transformer("Gemma2Config", "Gemma2Model", 32000, **GEMMA2_2B),
    # the same in a left-padded batch (row b keeping 512 - 64 * b tokens): eager attention's finite
    # mask, whose fully masked rows give the mean of the values, beside the causal mask
    "gemma2_left_padded": _transformer("Gemma2Config", "Gemma2Model", 32000, padding="left", pad_step=64, **GEMMA2_2B),
    # windowed attention with a relative position bias, and the shifted windows' mask beside it
    "swin_t": _vision("swin_t"),
    "t5_encoder_padded": _transformer(
        "T5Config",
        "T5EncoderModel",
        32128,
        padding=True,
        d_model=768,
        d_kv=64,
        d_ff=3072,
        num_layers=12,
        num_heads=12,
        vocab_size=32128,
    ),
}

ZOO = (
    ZooModel("resnet50", "vision", 32),
    ZooModel("resnet50_b1", "vision", 1),
    ZooModel("bert_base", "transformer", 8, 128),
    ZooModel("gpt2", "transformer", 1, 512),
    ZooModel("llama_gqa", "transformer", 1, 512),
    ZooModel("bert_base_padded", "transformer", 8, 128),
    ZooModel("bert_large", "transformer", 8, 128),
    ZooModel("llama_8b_2l", "transformer", 1, 2048),
    ZooModel("vit_b_16", "vision", 8),
    ZooModel("mobilenet_v3_large", "vision", 32),
    ZooModel("convnext_tiny", "vision", 32),
    ZooModel("resnext50_32x4d", "vision", 32),
    ZooModel("efficientnet_b0", "vision", 32),
    ZooModel("densenet121", "vision", 32),
    ZooModel("falcon_mq", "transformer", 1, 512),
    ZooModel("gpt_neox", "transformer", 1, 512),
    ZooModel("phi3", "transformer", 1, 512),
    # a T5 encoder (t5-base's shapes) in bfloat16 on a padded batch: its position bias under the
    # padding mask on every layer's scores
    ZooModel("t5_encoder_padded", "transformer", 8, 128, dtype="bfloat16"),
    ZooModel("llama_left_padded", "transformer", 4, 512),
    ZooModel("bloom_4l", "transformer", 1, 512),
    ZooModel("swin_t", "vision", 32),
    ZooModel("gemma2_2l", "transformer", 1, 2048),
    ZooModel("gemma2_left_padded", "transformer", 4, 512),
    # the same models through ONNX (torch.onnx's dynamo export, then from_onnx), against their
    # from_torch builds in the same run
    ZooModel("bert_base_padded_onnx", "transformer", 8, 128, importer="onnx"),
    ZooModel("resnet50_onnx", "vision", 32, importer="onnx"),
)

BUILDS = ("relax_cutlass", "relax_cutlass_graph", "tvm_default", "tvm_default_graph")


def float64_reference(model, inputs_gpu):
    """`model`'s output in float64 on the GPU (a copy; the model is left as it is), as numpy. A
    float32 reference there runs cuDNN's convolutions in TF32 (10-bit mantissas, torch's default),
    about as coarse as the fp16 builds it is to judge. Values float64 leaves non-finite where float32
    gives a number come from float32: transformers' eager masks hold the dtype's minimum, and two of
    them added (a padded decoder batch's causal and padding parts) overflow to -inf in float64, so a
    fully masked row's softmax is 0/0 there, while in float32 (and in the 16-bit model) it is the
    mean of the values."""
    import numpy as np
    import torch

    device = inputs_gpu[0].device  # the GPU in the zoo; the CPU tests pass CPU tensors

    def run(dtype):
        with torch.no_grad():
            cast = [x.to(dtype) if x.is_floating_point() else x for x in inputs_gpu]
            return copy.deepcopy(model).to(device, dtype)(*cast).cpu().numpy()

    out = run(torch.float64)
    lost = ~np.isfinite(out)
    if lost.any():
        wide = run(torch.float32).astype(np.float64)
        out = np.where(lost & np.isfinite(wide), wide, out)
    return out


def error_bound(torch_fp16_error: float) -> float:
    """The largest relative error (vs torch float64) a 16-bit build may have: 1e-2, or, for a model
    whose output torch's own fp16 already misses by more (a random-init ResNet's classifier sums
    2048 all-positive features against random-sign weights, so every fp16 rounding upstream is
    amplified: torch fp16 is itself 3e-2 off), 1.5x torch fp16's own error."""
    return max(1e-2, 1.5 * torch_fp16_error)


def profile_for(model: str, spec: str) -> str:
    """The profile= option for `model`: `spec` is one option for all ("never", "auto"), or
    "auto:a+b" to tune only models a and b (tuning takes minutes per model on the GPU host)."""
    option, _, names = spec.partition(":")
    return option if not names or model in names.split("+") else "never"


def _ratio(a, b) -> str:
    return f"{b / a:.2f}x" if a and b else "-"


def _ms(value: float | None) -> str:
    """A time for the table: "-" for a build or run the record does not have."""
    return f"{value:.3f}" if value else "-"


def _tvm_kernels(report: dict) -> str:
    """The table's TVM kernels per forward, where the record counted them (report.launches)."""
    launches = report.get("launches_per_forward")
    return f", {launches['tvm']} TVM kernels" if launches else ""


def table(records: list[dict]) -> str:
    head = (
        "| model | offloaded | FLOPs | err vs torch fp64 (torch 16-bit's) | relax_cutlass ms (graph) "
        "| TVM default ms (graph) | torch eager ms | torch.compile ms | reduce-overhead ms "
        "| vs TVM | vs eager | vs reduce-overhead |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in records:
        if "failed" in r:
            lines.append(f"| {r['model']} | FAILED: {r['failed'][:160]} |" + " |" * 10)
            continue
        ms, err, rep = r["ms"], r["error"], r["report"]
        ours = min(ms.get("relax_cutlass", 0) or 1e9, ms.get("relax_cutlass_graph", 0) or 1e9)
        tvm_best = min(ms.get("tvm_default", 0) or 1e9, ms.get("tvm_default_graph", 0) or 1e9)
        errors = [v for k, v in err.items() if k.startswith("relax_cutlass")]
        verdict = "" if r.get("ok") else " NOT OK"
        lines.append(
            f"| {r['model']} b{r['batch']}{'x' + str(r['seq']) if r['seq'] else ''}"
            f"{' ' + r['dtype'] if r.get('dtype', 'float16') != 'float16' else ''} "
            f"| {rep['offloaded_calls']} calls, {rep['left_in_tvm']} in TVM{_tvm_kernels(rep)} "
            f"| {rep['flop_fraction']:.1%} "
            f"| {max(errors, default=float('nan')):.1e} ({err.get('torch_fp16_vs_fp64', float('nan')):.1e}){verdict} "
            f"| {_ms(ms.get('relax_cutlass'))} ({_ms(ms.get('relax_cutlass_graph'))}) "
            f"| {_ms(ms.get('tvm_default'))} ({_ms(ms.get('tvm_default_graph'))}) "
            f"| {_ms(ms.get('torch_eager'))} | {_ms(ms.get('torch_compile_default'))} "
            f"| {_ms(ms.get('torch_compile_reduce-overhead'))} | {_ratio(ours, tvm_best if tvm_best < 1e9 else 0)} "
            f"| {_ratio(ours, ms.get('torch_eager'))} | {_ratio(ours, ms.get('torch_compile_reduce-overhead'))} |"
        )
    return "\n".join(lines)
