"""The encoder registry and ``Encoder``: a backbone cut before pooling, giving a grid of annotation vectors.

An ``Encoder`` turns normalised images (B, 3, S, S) into annotation vectors (B, P, C), P = h*w grid
positions, and reports its channels, grid, preprocessing and a fingerprint for the feature cache.
Builders are registered by name with ``@register_encoder`` (``fn(weights, image_size) -> Backbone``);
families of names with a prefix (``timm:<model>``, ``open_clip:<arch>/<tag>``) with
``@register_family`` (``fn(model, weights, image_size) -> Backbone``). ``build_encoder(EncoderConfig)``
is the public door; ``encoder_builder(name)`` resolves any name through the one registry.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.fx.experimental.optimization import fuse as fx_fuse_conv_bn
from torchvision import transforms
from torchvision.transforms import InterpolationMode

from captioning.config import ConfigError, EncoderConfig
from captioning.models.encoders.activations import ActivationMeter
from captioning.registry import Registry
from captioning.utils.errors import CaptioningError, InputError
from captioning.utils.extras import extra_message


class EncoderWeightsError(CaptioningError, RuntimeError):
    """Encoder weights are missing, unreachable or do not fit the network; the message is one line."""


def fold_traced_batch_norms(network: nn.Module) -> nn.Module:
    """``network`` (in eval mode) traced by torch.fx, each convolution that feeds only a batch norm
    fused with it; modules are changed in place.

    A network without batch norms (ViT, Swin, ConvNeXt: layer norms only) is returned as it is,
    untraced: there is nothing to fold, and torch.fx cannot trace every transformer (torchvision's
    ViT asserts on tensor shapes).
    """
    if not any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in network.modules()):
        return network
    return fx_fuse_conv_bn(network, inplace=True)


@dataclass(frozen=True)
class Backbone:
    """What a registered builder returns.

    Attributes:
        features: the network cut before pooling, (B, 3, S, S) -> (B, C, h, w); a transformer's
            patch tokens (without class or other prefix tokens) laid out on their h x w grid.
        stages: submodules of ``features`` from input to output; the unit of fine-tuning.
        mean, std: per-channel normalisation of ToTensor output, from the weights' definition.
        interpolation: the resize filter the weights were trained with.
        weights: identity of the loaded weights (plain JSON types), part of the fingerprint.
        channels_last: run in channels-last memory format (faster for this network on CPU).
        fold_batch_norms: folds each batch norm of ``features`` (in eval mode) into the convolution
            before it, in place, and returns the network to run (``Encoder.inference_copy``); the
            default traces the network with torch.fx and fuses every convolution that feeds only a
            batch norm.
        position_embedding_size: the image side the weights' position embeddings were made for
            (ViT and CLIP towers); at another ``image_size`` the library interpolates them. None for
            networks without absolute position embeddings.
    """

    features: nn.Module
    stages: tuple[nn.Module, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: InterpolationMode
    weights: dict[str, Any]
    channels_last: bool = True
    fold_batch_norms: Callable[[nn.Module], nn.Module] = fold_traced_batch_norms
    position_embedding_size: int | None = None


Builder = Callable[[str, int], Backbone]  # (weights, image_size) -> Backbone
FamilyBuilder = Callable[[str, str, int], Backbone]  # (model, weights, image_size) -> Backbone

ENCODERS: Registry[Builder] = Registry("encoder", key="model.encoder.name")
FAMILIES: dict[str, FamilyBuilder] = {}  # prefix -> builder of "<prefix>:<model>" names
FAMILY_FORMS: dict[str, str] = {}  # prefix -> the form of its names, for error messages


def register_encoder(name: str) -> Callable[[Builder], Builder]:
    """Decorator adding a builder ``fn(weights: str, image_size: int) -> Backbone`` to ``ENCODERS``.

    Raises:
        ValueError: ``name`` holds a colon: ``<prefix>:<model>`` names belong to the families
            (``register_family``), and a registered one would take over a family's model.
    """
    if ":" in name:
        raise ValueError(
            f"encoder name {name!r} holds a colon, which family names use (timm:<model>); choose another"
        )
    return ENCODERS.register(name)


def register_family(prefix: str, form: str) -> Callable[[FamilyBuilder], FamilyBuilder]:
    """Decorator adding a builder ``fn(model, weights, image_size) -> Backbone`` for ``<prefix>:<model>``.

    Args:
        prefix: what names of the family start with, before the colon.
        form: how its names read, e.g. ``timm:<model name>`` (error messages list it).
    """

    def add(builder: FamilyBuilder) -> FamilyBuilder:
        if prefix in FAMILIES:
            raise ValueError(f"encoder family {prefix!r} is already registered")
        FAMILIES[prefix] = builder
        FAMILY_FORMS[prefix] = form
        return builder

    return add


def encoder_builder(name: str) -> Builder:
    """The builder ``fn(weights, image_size) -> Backbone`` of a registered name or a family name.

    Raises:
        ConfigError: the name is neither registered nor ``<family>:<model>`` of a known family.
    """
    if name in ENCODERS:
        return ENCODERS[name]
    prefix, separator, model = name.partition(":")
    if separator and prefix in FAMILIES and model:
        family = FAMILIES[prefix]
        return lambda weights, image_size: family(model, weights, image_size)
    forms = ", ".join(FAMILY_FORMS[prefix] for prefix in sorted(FAMILIES))
    raise ConfigError(
        f"model.encoder.name must be one of {', '.join(sorted(ENCODERS))}, or {forms}; got {name!r}"
    )


def optional_library(module: str, extra: str, name: str) -> ModuleType:
    """Import an optional library, or stop with the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise ConfigError(extra_message(extra, f"model.encoder.name {name!r}", [module])) from None


def image_transform(
    image_size: int, interpolation: InterpolationMode, mean: tuple[float, ...], std: tuple[float, ...]
) -> Callable[[Any], torch.Tensor]:
    """PIL RGB image -> normalised (3, S, S) float tensor: resized to a square without cropping (the
    grid covers the whole image), scaled to [0, 1], normalised per channel."""
    return transforms.Compose(
        [
            transforms.Resize((image_size, image_size), interpolation=interpolation, antialias=True),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )


class Encoder(nn.Module):
    """A backbone cut before pooling, pooled to a fixed grid of annotation vectors.

    Args:
        name: the registry name.
        backbone: what the builder returned.
        image_size: the square input side S in pixels.
        grid_size: adaptive average pooling to grid_size x grid_size; 0 keeps the native grid.
    Attributes:
        channels: C, the feature channels.
        activation_bytes: the activations of one image at ``image_size``: the most alive at once
            (a pass without gradients) and all of them (kept for a backward pass), measured on
            meta tensors (``activations.check_encoder_fits``).
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
        self.position_embedding_size = backbone.position_embedding_size
        if self.channels_last:
            self.backbone.to(memory_format=torch.channels_last)
        self.transform = image_transform(image_size, self.interpolation, self.mean, self.std)
        # Shapes from a pass over meta tensors (shapes only: no memory, no arithmetic), and the bytes its
        # activations would take (the input image's included) for check_encoder_fits.
        was_training = self.backbone.training
        meta_state = {
            key: tensor.to("meta")
            for key, tensor in [*self.backbone.named_parameters(), *self.backbone.named_buffers()]
        }
        image = torch.empty(1, 3, image_size, image_size, device="meta")
        with torch.no_grad(), ActivationMeter() as meter:
            meter.live = meter.total = image.numel() * image.element_size()  # held through the pass
            probe = functional_call(self.backbone.eval(), meta_state, (image,))
        self.backbone.train(was_training)
        self.activation_bytes = (meter.peak, meter.total)  # one image: at once (no_grad), all kept
        if not isinstance(probe, torch.Tensor) or probe.dim() != 4:
            got = f"shape {tuple(probe.shape)}" if isinstance(probe, torch.Tensor) else type(probe).__name__
            raise ConfigError(
                f"model.encoder.name {name!r}: its Backbone.features returned {got} for (1, 3, "
                f"{image_size}, {image_size}) images; it must return a (B, C, h, w) feature map"
            )
        self.channels = int(probe.shape[1])
        self.native_grid = (int(probe.shape[2]), int(probe.shape[3]))
        if grid_size > min(self.native_grid):
            raise ConfigError(
                f"model.encoder.grid_size {grid_size} is finer than {name}'s native "
                f"{self.native_grid[0]}x{self.native_grid[1]} grid at {image_size} px: pooling would only "
                "repeat cells; use 0 (the native grid), a smaller grid_size or a larger image_size"
            )
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
            raise InputError(
                f"model.encoder.fine_tune_stages: {self.name} has {len(self._stages)} stages; "
                f"cannot fine-tune {stages}"
            )
        self.requires_grad_(False)
        for stage in self._stages[len(self._stages) - stages :]:
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
        if mode:  # modules outside every stage (a ViT's patch embedding) are never trained either
            self.backbone.eval()
        first_trainable = len(self._stages) - self.trainable_stages
        for index, stage in enumerate(self._stages):  # also the stages that group modules (not registered)
            stage.train(mode and index >= first_trainable)
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
            # Only where there are position embeddings, so that the keys of CNN caches stay as they were.
            **(
                {"position_embedding_size": self.position_embedding_size}
                if self.position_embedding_size is not None
                else {}
            ),
        }


def check_backbone(backbone: object, name: str) -> None:
    """Refuse, in one line naming the encoder, what a builder returns that is not a ``Backbone`` of
    the documented form (a user module's builder returning None, a bare network, a wrong field).

    Raises:
        ConfigError: naming ``model.encoder.name`` and the field.
    """
    where = f"model.encoder.name {name!r}: its builder"
    if not isinstance(backbone, Backbone):
        raise ConfigError(
            f"{where} returned {type(backbone).__name__}, not a Backbone (features, stages, mean, std, "
            "interpolation, weights; docs/extending.md)"
        )
    if not isinstance(backbone.features, nn.Module):
        raise ConfigError(
            f"{where} returned Backbone.features of type {type(backbone.features).__name__}, not an nn.Module"
        )
    if not isinstance(backbone.stages, (tuple, list)) or not all(
        isinstance(m, nn.Module) for m in backbone.stages
    ):
        raise ConfigError(
            f"{where} returned Backbone.stages that is not a tuple of nn.Module (the fine-tuning units)"
        )
    for field_name in ("mean", "std"):
        values = getattr(backbone, field_name)
        if (
            not isinstance(values, (tuple, list))
            or len(values) != 3
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        ):
            raise ConfigError(
                f"{where} returned Backbone.{field_name} {values!r:.60}; it needs 3 numbers (R, G, B)"
            )
    if not all(v > 0 for v in backbone.std):
        raise ConfigError(f"{where} returned Backbone.std {backbone.std!r}; each must be > 0")
    if not isinstance(backbone.interpolation, InterpolationMode):
        raise ConfigError(
            f"{where} returned Backbone.interpolation {backbone.interpolation!r:.60}, "
            "not an InterpolationMode"
        )
    if not isinstance(backbone.weights, dict):
        raise ConfigError(
            f"{where} returned Backbone.weights of type {type(backbone.weights).__name__}, not a dict"
        )


def build_encoder(config: EncoderConfig) -> Encoder:
    """The encoder named by ``config.name`` with its weights, grid and trainable stages.

    Raises:
        ConfigError: unknown name, more fine-tuning stages than the backbone has, or a grid_size
            finer than the backbone's native grid.
        EncoderWeightsError: weights missing, unreachable or not matching the network.
    """
    builder = encoder_builder(config.name)
    backbone = builder(config.weights, config.image_size)
    check_backbone(backbone, config.name)
    encoder = Encoder(config.name, backbone, config.image_size, config.grid_size)
    try:
        encoder.set_trainable(config.fine_tune_stages)
    except ValueError as error:
        raise ConfigError(f"model.encoder.fine_tune_stages: {error}") from None
    return encoder
