"""Typed, frozen configuration for every part of the pipeline: ``Config``, the tree's root.

The configuration is a tree of dataclasses (``Config`` -> ``DataConfig``, ``EncoderConfig``, ...),
one module per section: ``data``, ``model`` (the encoder and the decoder families), ``decode`` and
``train``, with what they share in ``fields``. It is filled from a YAML file, overridden from the
command line with dotted keys (``train.lr=2e-4``), validated at construction, saved beside the
outputs and stored in every checkpoint as plain Python types, so a checkpoint rebuilds its model with
no other file (reading and writing: :mod:`captioning.config.loading`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from captioning.config.data import DataConfig, ShapesDataConfig
from captioning.config.decode import DecodeConfig
from captioning.config.model import ModelConfig
from captioning.config.train import TrainConfig

__all__ = ["Config", "to_dict"]


@dataclass(frozen=True)
class Config:
    """The whole configuration of a run."""

    data: DataConfig = field(default_factory=ShapesDataConfig)  # its class follows data.dataset
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


def to_dict(config: Any) -> dict[str, Any]:
    """A configuration dataclass as nested plain dicts/lists (for YAML, JSON and checkpoints)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value

    return plain(config)
