"""Real models written in PyTorch and imported through TVM's own frontend.

torchvision is not installable everywhere relax_cutlass runs, so ResNet-50 (the torchvision v1.5
architecture: stride on the 3x3 conv of each bottleneck), a vit_b_16-style ViT and MobileNetV3
(torchvision's mobilenet_v3_large blocks) are written out here. Importing goes through
`torch.export` + `tvm.relax.frontend.torch.from_exported_program`, the path users take, with the
weights kept as parameters so `bind_weights` can turn them into constants.
"""

from __future__ import annotations

import numpy as np
import tvm


def import_torch():
    try:
        import torch
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "relax_cutlass.testing.models.torch_models needs PyTorch: pip install 'relax_cutlass[models]'"
        ) from err
    return torch


def resnet50(
    num_classes: int = 1000,
    width: int = 64,
    blocks=(3, 4, 6, 3),
    seed: int = 0,
    groups: int = 1,
    width_per_group: int = 64,
):
    """A torchvision-style ResNet-50 (eval mode, random init with non-trivial batch-norm stats).
    `groups` and `width_per_group` as torchvision's: groups=32, width_per_group=4 is ResNeXt-50
    32x4d (each bottleneck's 3x3 conv grouped)."""
    torch = import_torch()
    nn = torch.nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes: int, planes: int, stride: int, downsample: bool):
            super().__init__()
            out = planes * self.expansion
            inner = planes * width_per_group // 64 * groups
            self.conv1 = nn.Conv2d(inplanes, inner, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(inner)
            self.conv2 = nn.Conv2d(inner, inner, 3, stride=stride, padding=1, groups=groups, bias=False)
            self.bn2 = nn.BatchNorm2d(inner)
            self.conv3 = nn.Conv2d(inner, out, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = (
                nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
                if downsample
                else None
            )

        def forward(self, x):
            identity = self.downsample(x) if self.downsample is not None else x
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return self.relu(y + identity)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            layers, inplanes = [], width
            for i, count in enumerate(blocks):
                planes = width * 2**i
                for j in range(count):
                    stride = 2 if (i > 0 and j == 0) else 1
                    layers.append(Bottleneck(inplanes, planes, stride, downsample=j == 0))
                    inplanes = planes * Bottleneck.expansion
            self.layers = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(inplanes, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layers(x)
            return self.fc(torch.flatten(self.avgpool(x), 1))

    torch.manual_seed(seed)
    return _trained_batch_norm(ResNet()).eval()


def _trained_batch_norm(model):
    """Fresh BatchNorm has mean 0 / var 1, which folds to a no-op: give it statistics like a
    trained model's so that folding it into the convolutions is actually tested."""
    torch = import_torch()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.1, 0.1)
    return model


def import_exported(model, example_inputs: tuple) -> tuple[tvm.IRModule, dict]:
    """torch.export + from_exported_program -> (float32 IRModule with weights as parameters, {name: array}).

    Models are exported in float32 (TVM 0.27's batch_norm converter rejects a float16 export) and
    lowered to float16 on the Relax side with `relax_cutlass.prepare.bind_float16`, the usual TVM flow. Floating
    example inputs are cast to float32; integer and bool ones (token ids, attention masks) keep
    their dtype, since a model indexes or compares with them.
    """
    torch = import_torch()
    from tvm.relax.frontend.torch import from_exported_program

    inputs = tuple(x.float() if x.is_floating_point() else x for x in example_inputs)
    with torch.no_grad():
        exported = torch.export.export(model.float(), inputs)
    mod = from_exported_program(exported, keep_params_as_input=True)
    mod, params = tvm.relax.frontend.detach_params(mod)
    n_inputs = len(example_inputs)
    weights = {p.name: v.numpy() for p, v in zip(mod["main"].params[n_inputs:], params["main"], strict=True)}
    return mod, weights


def resnet50_module(batch: int = 1, image: int = 224, **kwargs) -> tuple[tvm.IRModule, dict]:
    """ResNet-50 imported from PyTorch: (IRModule, weights), input `x` of shape (batch, 3, image, image)."""
    torch = import_torch()
    model = resnet50(**kwargs)
    example = (torch.from_numpy(np.zeros((batch, 3, image, image), "float32")),)
    return import_exported(model, example)


def vit(
    image: int = 64,
    patch: int = 16,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    mlp: int | None = None,
    num_classes: int = 10,
    seed: int = 0,
):
    """A torchvision-style Vision Transformer (vit_b_16 is image=224, hidden=768, layers=12,
    heads=12, mlp=3072, num_classes=1000), eval mode, random init.

    The torchvision structure: a patch x patch, stride-patch conv stem, flatten(2).transpose(1, 2)
    to tokens, a class token concatenated in front, a position embedding added, pre-norm encoder
    layers (nn.MultiheadAttention with its packed q/k/v projection, GELU MLP), a final LayerNorm and
    the head on the class token. Input: (batch, 3, image, image).
    """
    torch = import_torch()
    nn = torch.nn
    tokens = (image // patch) ** 2 + 1

    class VisionTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv_proj = nn.Conv2d(3, hidden, patch, stride=patch)
            self.class_token = nn.Parameter(0.02 * torch.randn(1, 1, hidden))
            self.pos_embedding = nn.Parameter(0.02 * torch.randn(1, tokens, hidden))
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(
                    hidden,
                    heads,
                    mlp or 4 * hidden,
                    dropout=0.0,
                    activation="gelu",
                    layer_norm_eps=1e-6,
                    batch_first=True,
                    norm_first=True,
                )
                for _ in range(layers)
            )
            self.ln = nn.LayerNorm(hidden, eps=1e-6)
            self.head = nn.Linear(hidden, num_classes)

        def forward(self, x):
            x = self.conv_proj(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
            for layer in self.layers:
                x = layer(x)
            return self.head(self.ln(x)[:, 0])

    torch.manual_seed(seed)
    return VisionTransformer().eval()


def vit_module(batch: int = 1, image: int = 64, **kwargs) -> tuple[tvm.IRModule, dict]:
    """The ViT of `vit` imported from PyTorch: (IRModule, weights), input `x` of shape (batch, 3, image, image)."""
    torch = import_torch()
    model = vit(image=image, **kwargs)
    example = (torch.from_numpy(np.zeros((batch, 3, image, image), "float32")),)
    return import_exported(model, example)


# torchvision's mobilenet_v3_large settings: (kernel, expanded, out, squeeze-excite, activation, stride)
# per inverted-residual block, input channels chained from the previous block (16 after the stem).
MOBILENET_V3_LARGE = (
    (3, 16, 16, False, "RE", 1),
    (3, 64, 24, False, "RE", 2),
    (3, 72, 24, False, "RE", 1),
    (5, 72, 40, True, "RE", 2),
    (5, 120, 40, True, "RE", 1),
    (5, 120, 40, True, "RE", 1),
    (3, 240, 80, False, "HS", 2),
    (3, 200, 80, False, "HS", 1),
    (3, 184, 80, False, "HS", 1),
    (3, 184, 80, False, "HS", 1),
    (3, 480, 112, True, "HS", 1),
    (3, 672, 112, True, "HS", 1),
    (5, 672, 160, True, "HS", 2),
    (5, 960, 160, True, "HS", 1),
    (5, 960, 160, True, "HS", 1),
)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: to a multiple of `divisor`, never more than 10% down."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def mobilenet_v3(
    num_classes: int = 1000,
    width_mult: float = 1.0,
    blocks=MOBILENET_V3_LARGE,
    last_channel: int = 1280,
    seed: int = 0,
):
    """A torchvision-style MobileNetV3 (mobilenet_v3_large by default; eval mode, random init with
    non-trivial batch-norm statistics): inverted residual blocks (1x1 expand, depthwise kxk, optional
    squeeze-excitation avgpool -> 1x1 conv -> relu -> 1x1 conv -> hardsigmoid -> multiply, 1x1
    project), hardswish activations, classifier Linear -> Hardswish -> Dropout -> Linear.

    `blocks`: rows (kernel, expanded channels, output channels, squeeze-excitation, "RE" (relu) or
    "HS" (hardswish), stride), as MOBILENET_V3_LARGE; a subset makes a smaller model. Channel counts
    (and the classifier's hidden width `last_channel`) are scaled by `width_mult` and rounded to
    multiples of 8, as torchvision does."""
    torch = import_torch()
    nn = torch.nn

    def adjust(channels: int) -> int:
        return _make_divisible(channels * width_mult)

    def conv_bn_act(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act=None):
        layers = [
            nn.Conv2d(cin, cout, kernel, stride=stride, padding=(kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=0.001, momentum=0.01),  # torchvision's MobileNetV3 norm layer
        ]
        if act is not None:
            layers.append(act(inplace=True))
        return nn.Sequential(*layers)

    class SqueezeExcitation(nn.Module):
        def __init__(self, channels: int, squeeze: int):
            super().__init__()
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(channels, squeeze, 1)
            self.fc2 = nn.Conv2d(squeeze, channels, 1)
            self.activation = nn.ReLU()
            self.scale_activation = nn.Hardsigmoid()

        def forward(self, x):
            scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
            return scale * x

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, act: str, stride: int):
            super().__init__()
            self.use_res_connect = stride == 1 and cin == cout
            activation = nn.Hardswish if act == "HS" else nn.ReLU
            layers = []
            if expanded != cin:
                layers.append(conv_bn_act(cin, expanded, 1, act=activation))
            layers.append(conv_bn_act(expanded, expanded, kernel, stride, groups=expanded, act=activation))
            if se:
                layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4)))
            layers.append(conv_bn_act(expanded, cout, 1))
            self.block = nn.Sequential(*layers)

        def forward(self, x):
            y = self.block(x)
            return y + x if self.use_res_connect else y

    class MobileNetV3(nn.Module):
        def __init__(self):
            super().__init__()
            cin = adjust(16)
            layers = [conv_bn_act(3, cin, 3, stride=2, act=nn.Hardswish)]
            for kernel, expanded, cout, se, act, stride in blocks:
                expanded, cout = adjust(expanded), adjust(cout)
                layers.append(InvertedResidual(cin, kernel, expanded, cout, se, act, stride))
                cin = cout
            last_conv = 6 * cin
            layers.append(conv_bn_act(cin, last_conv, 1, act=nn.Hardswish))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            hidden = adjust(last_channel)
            self.classifier = nn.Sequential(
                nn.Linear(last_conv, hidden),
                nn.Hardswish(inplace=True),
                nn.Dropout(p=0.2, inplace=True),
                nn.Linear(hidden, num_classes),
            )

        def forward(self, x):
            x = self.avgpool(self.features(x))
            return self.classifier(torch.flatten(x, 1))

    torch.manual_seed(seed)
    return _trained_batch_norm(MobileNetV3()).eval()


def mobilenet_v3_module(
    batch: int = 1, image: int = 64, width_mult: float = 0.25, **kwargs
) -> tuple[tvm.IRModule, dict]:
    """MobileNetV3 imported from PyTorch: (IRModule, weights), input `x` of shape (batch, 3, image,
    image); other keyword arguments go to `mobilenet_v3` (num_classes, blocks, ...). Small by
    default (64x64 image, width 0.25) for CPU tests; `mobilenet_v3_module(batch=32, image=224,
    width_mult=1.0)` is torchvision's mobilenet_v3_large at batch 32.

    The network downsamples by 32: from image=32 down, the last blocks run on a 1x1 feature map,
    where TVM 0.27's CUDA build of a padded depthwise conv fails at batch 1 (DLight's GEMV rule,
    `assert s_loops`); image=64 leaves them 2x2. The full model (15 blocks) takes minutes to bind
    on a small CPU (FoldConstant compiles every op it folds); pass a few `blocks` for tests."""
    torch = import_torch()
    model = mobilenet_v3(width_mult=width_mult, **kwargs)
    example = (torch.from_numpy(np.zeros((batch, 3, image, image), "float32")),)
    return import_exported(model, example)


# convnext_tiny: (channels, next stage's channels or None, blocks) per stage
CONVNEXT_TINY = ((96, 192, 3), (192, 384, 3), (384, 768, 9), (768, None, 3))


def convnext(num_classes: int = 1000, stages=CONVNEXT_TINY, layer_scale: float = 1e-6, seed: int = 0):
    """torchvision's ConvNeXt (convnext_tiny by default; eval mode, random init, layer scales drawn
    in a trained model's range so the blocks matter), its own NCHW <-> NHWC permutes included (the
    blocks' and `LayerNorm2d`'s). `stages` as CONVNEXT_TINY; fewer or narrower for tests."""
    torch = import_torch()
    nn, F = torch.nn, torch.nn.functional

    class LayerNorm2d(nn.LayerNorm):
        def forward(self, x):
            x = x.permute(0, 2, 3, 1)
            x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            return x.permute(0, 3, 1, 2)

    class Permute(nn.Module):
        def __init__(self, dims):
            super().__init__()
            self.dims = dims

        def forward(self, x):
            return torch.permute(x, self.dims)

    class CNBlock(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.block = nn.Sequential(
                nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim, bias=True),
                Permute([0, 2, 3, 1]),
                nn.LayerNorm(dim, eps=1e-6),
                nn.Linear(dim, 4 * dim),
                nn.GELU(),
                nn.Linear(4 * dim, dim),
                Permute([0, 3, 1, 2]),
            )
            self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)

        def forward(self, x):
            return self.layer_scale * self.block(x) + x  # stochastic depth: identity in eval

    class ConvNeXt(nn.Module):
        def __init__(self):
            super().__init__()
            first = stages[0][0]
            layers = [nn.Sequential(nn.Conv2d(3, first, 4, 4), LayerNorm2d(first, eps=1e-6))]
            for cin, cout, blocks in stages:
                layers.append(nn.Sequential(*[CNBlock(cin) for _ in range(blocks)]))
                if cout is not None:
                    layers.append(nn.Sequential(LayerNorm2d(cin, eps=1e-6), nn.Conv2d(cin, cout, 2, 2)))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            last = stages[-1][1] or stages[-1][0]
            self.classifier = nn.Sequential(LayerNorm2d(last, eps=1e-6), nn.Flatten(1), nn.Linear(last, num_classes))

        def forward(self, x):
            return self.classifier(self.avgpool(self.features(x)))

    torch.manual_seed(seed)
    model = ConvNeXt().eval()
    with torch.no_grad():  # a layer scale of 1e-6 would hide every block's output
        for block in (m for m in model.modules() if isinstance(m, CNBlock)):
            block.layer_scale.uniform_(0.1, 1.0)
    return model


# DenseNet-121's stem and dense blocks (torchvision's densenet121 layers: growth 32, bottleneck 4)
DENSENET121 = dict(growth=32, blocks=(6, 12, 24, 16), init_features=64)


def densenet(growth: int = 32, blocks=(6, 12, 24, 16), init_features: int = 64, num_classes: int = 1000, seed: int = 0):
    """torchvision's DenseNet written out (its `_DenseLayer`, `_DenseBlock` and `_Transition`): every
    layer's input is the concatenation of all earlier outputs of its block, batch-normed and
    activated before its first conv (pre-activation: the norm cannot fold into a conv's weights)."""
    torch = import_torch()
    nn = torch.nn

    class DenseLayer(nn.Module):
        def __init__(self, channels: int):
            super().__init__()
            self.norm1, self.relu1 = nn.BatchNorm2d(channels), nn.ReLU(inplace=True)
            self.conv1 = nn.Conv2d(channels, 4 * growth, 1, bias=False)
            self.norm2, self.relu2 = nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

        def forward(self, features):
            x = self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))
            return self.conv2(self.relu2(self.norm2(x)))

    class DenseBlock(nn.Module):
        def __init__(self, layers: int, channels: int):
            super().__init__()
            self.layers = nn.ModuleList([DenseLayer(channels + i * growth) for i in range(layers)])

        def forward(self, x):
            features = [x]
            for layer in self.layers:
                features.append(layer(features))
            return torch.cat(features, 1)

    layers = [
        nn.Conv2d(3, init_features, 7, 2, 3, bias=False),
        nn.BatchNorm2d(init_features),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    channels = init_features
    for i, count in enumerate(blocks):
        layers.append(DenseBlock(count, channels))
        channels += count * growth
        if i != len(blocks) - 1:  # a transition: BN-ReLU, 1x1 conv halving the channels, 2x2 average pool
            layers += [
                nn.BatchNorm2d(channels),
                nn.ReLU(inplace=True),
                nn.Conv2d(channels, channels // 2, 1, bias=False),
            ]
            layers.append(nn.AvgPool2d(2, 2))
            channels //= 2
    layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(1)]
    torch.manual_seed(seed)
    model = nn.Sequential(*layers, nn.Linear(channels, num_classes))
    return _trained_batch_norm(model).eval()
