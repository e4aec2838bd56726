"""CLIP image towers through open_clip: ``open_clip:<arch>/<pretrained tag>`` (the ``clip`` extra).

The grid is the tower's patch tokens after the last block and ``ln_post`` (open_clip's
``forward_intermediates``), before the projection to the joint space: 768 channels for ViT-B. The
architecture and its preprocessing come from open_clip's model configuration and the tag's
pretrained configuration; at another image size open_clip resizes the position embeddings.
``load_clip`` builds the whole model (both towers) the same way, for CLIP-S.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

import torch
from torch import nn
from torchvision.transforms import InterpolationMode

from captioning.config import ConfigError
from captioning.models.encoders.registry import Backbone, optional_library, register_family
from captioning.models.encoders.weights import (
    ResolvedWeights,
    hub_file,
    library_error,
    resolve_weights,
    url_file,
)


def parse_clip_name(name: str) -> tuple[str, str]:
    """``<arch>/<tag>`` -> (arch, tag); the tag may be empty."""
    architecture, _, tag = name.partition("/")
    return architecture, tag


def _published_file(pretrained_cfg: dict[str, Any], label: str, setting: str) -> Path:
    """The file open_clip would load for a pretrained tag: from its Hugging Face repository, else its URL."""
    if pretrained_cfg.get("hf_hub"):
        repo, filename = pretrained_cfg["hf_hub"].rstrip("/"), ""
        if not pretrained_cfg["hf_hub"].endswith("/"):
            repo, filename = pretrained_cfg["hf_hub"].rsplit("/", 1)
        names = [filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        return hub_file(repo, names, label, setting)
    return url_file(pretrained_cfg["url"], label)


def load_clip(
    name: str, weights: str, image_size: int | None = None, setting: str = "model.encoder.weights"
) -> tuple[nn.Module, ResolvedWeights, ModuleType]:
    """A whole open_clip model ``<arch>/<tag>`` with ``weights`` ("pretrained" | a file | "none").

    Args:
        name: e.g. ``ViT-B-32/openai``; the tag sets the preprocessing and QuickGELU, and is needed
            for ``pretrained``.
        image_size: the tower's input side (position embeddings resized); None keeps the architecture's.
        setting: the configuration key or flag that set ``weights``, for error messages.
    Returns:
        (model in eval mode, the resolved weights, the open_clip module).
    """
    label = f"open_clip:{name}"
    open_clip = optional_library("open_clip", "clip", label)
    architecture, tag = parse_clip_name(name)
    if open_clip.get_model_config(architecture) is None:
        raise ConfigError(
            f"{label}: open_clip has no architecture {architecture!r} (open_clip.list_models())"
        )
    tags = open_clip.list_pretrained_tags_by_model(architecture)
    if tag and tag not in tags:
        raise ConfigError(
            f"{label}: open_clip has no pretrained tag {tag!r} for {architecture} "
            f"(known: {', '.join(tags) or 'none'})"
        )
    pretrained_cfg = open_clip.get_pretrained_cfg(architecture, tag) if tag else {}
    if weights == "pretrained" and not tag:
        raise ConfigError(
            f"{label}: pretrained weights need a tag, open_clip:{architecture}/<tag> "
            f"with a tag among {', '.join(tags) or 'none'}"
        )
    resolved = resolve_weights(
        weights,
        lambda: _published_file(pretrained_cfg, label, setting),
        lambda path: {"open_clip": f"{architecture}/{tag}"},
        setting,
    )
    preprocess = {
        key: pretrained_cfg[key]
        for key in ("mean", "std", "interpolation", "resize_mode")
        if key in pretrained_cfg
    }
    try:
        model = open_clip.create_model(
            architecture,
            pretrained=str(resolved.path) if resolved.path else None,
            force_quick_gelu=bool(pretrained_cfg.get("quick_gelu", False)),
            force_image_size=image_size,
            force_preprocess_cfg=preprocess or None,
            device=torch.get_default_device(),
        )  # meta under torch.device('meta')
    except (RuntimeError, KeyError, ValueError, OSError) as error:
        if resolved.path is None:
            raise
        raise library_error(resolved.path, label, error) from None
    return model.eval(), resolved, open_clip


class _TowerIntermediates(Protocol):
    """What ``ClipGrid`` calls on an open_clip image tower (``nn.Module`` does not declare it)."""

    def forward_intermediates(
        self, x: torch.Tensor, *, indices: int, normalize_intermediates: bool, intermediates_only: bool
    ) -> dict[str, list[torch.Tensor]]: ...


class ClipGrid(nn.Module):
    """An open_clip image tower's patch tokens after ``ln_post``, on their grid.

    Args:
        tower: ``model.visual``, an open_clip ``VisionTransformer``.
    """

    def __init__(self, tower: nn.Module) -> None:
        super().__init__()
        self.tower = tower

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) -> (B, C, S/p, S/p), C the tower's width, p its patch size."""
        return cast(_TowerIntermediates, self.tower).forward_intermediates(
            images, indices=1, normalize_intermediates=True, intermediates_only=True
        )["image_intermediates"][-1]


@register_family("open_clip", form="open_clip:<arch>/<pretrained tag>")
def open_clip_encoder(name: str, weights: str, image_size: int) -> Backbone:
    """The image tower of ``open_clip.create_model(arch, pretrained)``; stages are its residual blocks."""
    label = f"open_clip:{name}"
    optional_library("open_clip", "clip", label)
    from open_clip.transformer import VisionTransformer

    model, resolved, open_clip = load_clip(name, weights, image_size)
    tower = model.visual
    if not isinstance(tower, VisionTransformer):
        raise ConfigError(
            f"model.encoder.name {label!r}: only ViT image towers give a grid here, "
            f"not {type(tower).__name__}"
        )
    patch = tower.patch_size[0]
    if image_size % patch:
        raise ConfigError(
            f"model.encoder.image_size {image_size} must be a multiple of {label}'s patch size {patch}"
        )
    config = open_clip.get_model_preprocess_cfg(model)
    trained_size = open_clip.get_model_config(parse_clip_name(name)[0])["vision_cfg"]["image_size"]
    blocks = list(tower.transformer.resblocks)
    stages = (*blocks[:-1], nn.ModuleList([blocks[-1], tower.ln_post]))
    return Backbone(
        ClipGrid(tower),
        stages,
        mean=tuple(config["mean"]),
        std=tuple(config["std"]),
        interpolation=InterpolationMode(config["interpolation"]),
        weights=resolved.identity,
        channels_last=False,
        position_embedding_size=int(trained_size),
    )
