"""Image encoders: one registry of backbones cut before pooling, each wrapped as an ``Encoder``.

- ``registry``: ``Backbone``, ``Encoder``, ``ENCODERS`` and the families (``timm:``, ``open_clip:``),
  ``build_encoder`` (the public door).
- ``weights``: ``pretrained`` / a file / ``none`` resolved to one file and its identity.
- ``torchvision_models``: ResNet, VGG, EfficientNet, EfficientNet-Lite0, ViT, Swin, ConvNeXt.
- ``timm_models``: any timm model as ``timm:<model name>`` (the ``timm`` extra).
- ``open_clip_models``: CLIP image towers as ``open_clip:<arch>/<pretrained tag>`` (the ``clip`` extra).

Importing this package registers every builder; the two optional libraries are imported only when
one of their names is built.
"""

from captioning.models.encoders import open_clip_models, timm_models, torchvision_models  # noqa: F401 - register
from captioning.models.encoders.registry import (
    ENCODERS,
    FAMILIES,
    Backbone,
    Encoder,
    EncoderWeightsError,
    build_encoder,
    encoder_builder,
    fold_traced_batch_norms,
    register_encoder,
    register_family,
)
from captioning.models.encoders.weights import file_identity, resolve_weights

__all__ = [
    "ENCODERS",
    "FAMILIES",
    "Backbone",
    "Encoder",
    "EncoderWeightsError",
    "build_encoder",
    "encoder_builder",
    "file_identity",
    "fold_traced_batch_norms",
    "register_encoder",
    "register_family",
    "resolve_weights",
]
