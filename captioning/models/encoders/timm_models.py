"""Any timm model as an encoder: ``timm:<model name>[.<pretrained tag>]`` (the ``timm`` extra).

The grid is the last feature map of timm's ``forward_intermediates`` (NCHW, prefix tokens removed,
the final norm applied): a ViT's patch tokens, Swin's and ConvNeXt's last stage, a CNN's last block.
The stages are timm's ``feature_info`` modules (the last with the final norm). Preprocessing comes
from timm's data config for the model's pretrained configuration; a ViT or Swin at another image
size gets its position embeddings resampled by timm (``set_input_size``).
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
from captioning.models.encoders.weights import hub_file, library_error, resolve_weights, url_file


class _FeatureMaps(Protocol):
    """What ``TimmGrid`` calls on its timm model (timm has no common base class that declares it)."""

    def forward_intermediates(
        self, x: torch.Tensor, *, indices: int, norm: bool, output_fmt: str, intermediates_only: bool
    ) -> list[torch.Tensor]: ...


class TimmGrid(nn.Module):
    """A timm model's last feature map as a grid.

    Args:
        model: a timm model that implements ``forward_intermediates``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) -> (B, C, h, w)."""
        return cast(_FeatureMaps, self.model).forward_intermediates(
            images, indices=1, norm=True, output_fmt="NCHW", intermediates_only=True
        )[-1]


def _published_file(timm: ModuleType, pretrained_cfg: dict[str, Any], label: str) -> Path:
    """The pretrained file timm would load: from its Hugging Face repository, else its URL."""
    if pretrained_cfg.get("hf_hub_id"):
        names = (
            [pretrained_cfg["hf_hub_filename"]]
            if pretrained_cfg.get("hf_hub_filename")
            else ["model.safetensors", "pytorch_model.bin"]
        )
        return hub_file(pretrained_cfg["hf_hub_id"], names, label)
    if pretrained_cfg.get("url"):
        return url_file(pretrained_cfg["url"], label)
    raise ConfigError(f"{label} has no published weights; set model.encoder.weights to none or a file")


@register_family("timm", form="timm:<model name>")
def timm_encoder(model_name: str, weights: str, image_size: int) -> Backbone:
    """``timm.create_model(model_name)`` with ``weights``, cut to its last feature map."""
    label = f"timm:{model_name}"
    timm = optional_library("timm", "timm", label)
    architecture, tag = timm.models.split_model_name_tag(model_name)
    if not timm.models.is_model(architecture):
        raise ConfigError(
            f"model.encoder.name {label!r}: timm has no model {architecture!r} "
            "(timm.list_models() lists them)"
        )
    try:
        pretrained_cfg = timm.models.get_pretrained_cfg(model_name)
    except RuntimeError:  # an unknown tag
        pretrained_cfg = None
    if pretrained_cfg is None:
        raise ConfigError(
            f"model.encoder.name {label!r}: timm has no pretrained tag {tag!r} for {architecture} "
            f"(known: {', '.join(timm.list_pretrained(architecture + '.*')) or 'none'})"
        )
    pretrained_cfg = pretrained_cfg.to_dict()
    resolved = resolve_weights(
        weights,
        lambda: _published_file(timm, pretrained_cfg, label),
        lambda path: {"timm": f"{architecture}.{pretrained_cfg['tag']}"},
    )
    try:
        if resolved.path is None:
            model = timm.create_model(model_name, pretrained=False)
        else:  # timm's own loading: it converts original checkpoints and adapts what it needs. With
            # the published head kept, timm loads strictly: a file for another network is refused.
            model = timm.create_model(
                model_name, pretrained=True, pretrained_cfg_overlay={"file": str(resolved.path)}
            )
    except (RuntimeError, KeyError, ValueError, OSError) as error:
        if resolved.path is None:
            raise
        raise library_error(resolved.path, label, error) from None
    if not hasattr(model, "forward_intermediates"):
        raise ConfigError(
            f"model.encoder.name {label!r}: this timm model has no forward_intermediates, "
            "so no grid can be taken from it"
        )
    data = timm.data.resolve_model_data_config(model)  # from the pretrained configuration
    trained_size = int(data["input_size"][-1])
    model.prune_intermediate_layers(indices=1, prune_norm=False, prune_head=True)
    has_position_embedding = getattr(model, "pos_embed", None) is not None
    if image_size != trained_size and hasattr(model, "set_input_size"):
        try:
            model.set_input_size(img_size=(image_size, image_size))
        except (AssertionError, ValueError, RuntimeError) as error:
            raise ConfigError(
                f"model.encoder.image_size {image_size} does not suit {label} ({error})"
            ) from None
    modules = [model.get_submodule(info["module"]) for info in model.feature_info]
    final_norm = getattr(model, "norm", None)
    if isinstance(final_norm, nn.Module) and any(True for _ in final_norm.parameters()):
        modules[-1] = nn.ModuleList([modules[-1], final_norm])
    return Backbone(
        TimmGrid(model),
        tuple(modules),
        mean=tuple(data["mean"]),
        std=tuple(data["std"]),
        interpolation=InterpolationMode(data["interpolation"]),
        weights=resolved.identity,
        channels_last=False,
        position_embedding_size=trained_size if has_position_embedding else None,
    )
