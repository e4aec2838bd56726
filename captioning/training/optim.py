"""Optimisers and learning-rate schedules: Adam by parameter group, and the per-epoch and per-step
schedules ``train.schedule`` names (``noam`` and ``cosine`` as factors of the peak rate)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.torch_version import TorchVersion

from captioning.config import Config
from captioning.models.captioner import Captioner


def optimizer_for(model: Captioner, lr: float, encoder_lr: float, config: Config) -> torch.optim.Optimizer:
    """Adam with parameter groups by name: the decoder at ``lr``, trainable encoder stages at
    ``encoder_lr``."""
    groups = [
        {"params": [p for p in model.decoder.parameters() if p.requires_grad], "lr": lr, "name": "decoder"}
    ]
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    if encoder_params:
        groups.append({"params": encoder_params, "lr": encoder_lr, "name": "encoder"})
    return adam(groups, betas=(0.9, config.train.adam_beta2), weight_decay=config.train.weight_decay)


# Adam's fused kernel makes one pass over each parameter instead of about ten element-wise ones:
# 46 ms against 231 ms per step for the 31.8 M parameters of the COCO decoder on one CPU thread.
_FUSED_ADAM_DEVICES = ("cpu", "cuda") if TorchVersion(torch.__version__) >= "2.4" else ("cuda",)


def adam(parameters: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]], **options) -> torch.optim.Adam:
    """``torch.optim.Adam`` over parameters (or parameter groups), fused where torch has a fused
    kernel for every parameter's device (CUDA; CPU from torch 2.4). It computes the same update,
    to float rounding (about 1e-7 apart after 20 steps)."""
    items = list(parameters)
    groups = [item for item in items if isinstance(item, dict)]
    if len(groups) < len(items):  # plain parameters: one group
        groups = [{"params": items}]
    fused = all(
        p.is_floating_point() and p.device.type in _FUSED_ADAM_DEVICES
        for group in groups
        for p in group["params"]
    )
    return torch.optim.Adam(groups, fused=fused or None, **options)


def noam_factor(step: int, warmup_steps: int) -> float:
    """The learning rate of optimisation step ``step + 1`` as a fraction of its peak (Vaswani et al. 2017).

    Linear warm-up to 1 over ``warmup_steps`` steps, then ``sqrt(warmup_steps / step)``: the paper's
    ``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` with its peak ``d_model^-0.5 * warmup^-0.5``
    given as ``train.lr``.
    """
    step += 1  # LambdaLR counts from 0; the paper's first step is 1
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def cosine_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """The learning rate of optimisation step ``step + 1`` of ``total_steps`` as a fraction of its peak.

    Linear warm-up to 1 over ``warmup_steps`` steps, then half a cosine down towards 0, which the
    last step approaches but does not reach (Loshchilov and Hutter 2017, without restarts).
    """
    step += 1
    if step <= warmup_steps:
        return step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps + 1))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


# A warm-up takes at most this fraction of the cross-entropy stage: a configuration's warm-up (20,000
# steps in configs/coco_transformer.yaml) would otherwise swallow a short first run whole.
MAX_WARMUP_FRACTION = 0.25


def warmup_for(warmup_steps: int, stage_steps: int) -> int:
    """The warm-up a schedule uses: ``warmup_steps``, clipped to ``MAX_WARMUP_FRACTION`` of the
    ``stage_steps`` optimisation steps of the cross-entropy stage (at least 1; 0 steps: no clipping)."""
    if stage_steps <= 0:
        return warmup_steps
    return min(warmup_steps, max(1, int(stage_steps * MAX_WARMUP_FRACTION)))


def scheduler_for(optimizer: torch.optim.Optimizer, config: Config, stage: str = "xe", total_steps: int = 0):
    """The learning-rate schedule ``train.schedule`` names (None for ``none``).

    ``noam`` and ``cosine`` step per batch and shape the cross-entropy stage only: the
    self-critical stage fine-tunes at a constant ``train.scst_lr``, as the Transformer captioners
    do. ``cosine`` spreads its decay over ``total_steps``, the cross-entropy stage's steps; both
    warm up over ``warmup_for(train.warmup_steps, total_steps)`` steps.
    """
    warmup = warmup_for(config.train.warmup_steps, total_steps)
    builders = {
        "noam": lambda: (
            torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: noam_factor(step, warmup))
            if stage == "xe"
            else None
        ),
        "cosine": lambda: (
            torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: cosine_factor(step, warmup, max(total_steps, warmup + 1))
            )
            if stage == "xe"
            else None
        ),
        "none": lambda: None,
        "step": lambda: torch.optim.lr_scheduler.StepLR(
            optimizer, config.train.step_size, config.train.gamma
        ),
        "plateau": lambda: torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=config.train.gamma, patience=config.train.plateau_patience
        ),
    }
    return builders[config.train.schedule]()
