"""Where a run computes: the device, the random streams, and mixed precision."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

from captioning.utils.errors import ConfigError, InputError, RunError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available; else ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        ValueError: another device (``meta`` holds no data: a run on it would fail after writing).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise InputError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RunError(f"device {name!r} asked for, but CUDA is not available")
    return device


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seed Python's, NumPy's and torch's generators; ``deterministic`` also asks torch for deterministic
    algorithms (warning where there is none) and turns off cuDNN's benchmark search."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def amp_dtype(device: torch.device, amp: str) -> torch.dtype | None:
    """The autocast dtype of ``train.amp`` on ``device``: None for 'none'.

    Raises:
        ConfigError: fp16 on CPU. CPU matrix products are not faster in float16 (bf16 is, where
            the CPU has bf16 instructions), and float16's narrow range needs a gradient scaler.
    """
    if amp == "none":
        return None
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError(f"train.amp: fp16 needs a CUDA device, the device is {device}; use bf16 on CPU")
    return torch.bfloat16 if amp == "bf16" else torch.float16


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    """Mixed precision (``train.amp``): bf16 on GPU or CPU, fp16 on GPU; a no-op with 'none'."""
    dtype = amp_dtype(device, amp)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
