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


def cpu_bf16_instructions() -> tuple[str, bool]:
    """This CPU's vector capability as torch dispatches on it (``torch.backends.cpu.get_cpu_capability()``:
    ``AVX2``, ``AVX512``, ``DEFAULT``, ...) and whether it multiplies bf16 natively (AVX512-BF16 or
    AMX on x86, SVE on ARM)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        native = any(
            bool(getattr(torch.cpu, check, lambda: False)())
            for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        )
    else:
        native = capability.startswith("SVE")
    return capability, native


def bf16_cost(device: torch.device, amp: str) -> str | None:
    """The plan's part for ``train.amp=bf16`` on a CPU without bf16 instructions, else None.

    There torch runs bf16 matrix products through a scalar fallback (AVX2: a 512x512 product
    measured 40x slower than in float32 on a Zen 2 EPYC), so bf16 training is an order of magnitude
    slower than float32; with AVX-512 but no bf16 instructions it is converted and not faster.
    """
    if amp != "bf16" or device.type != "cpu":
        return None
    capability, native = cpu_bf16_instructions()
    if native:
        return None
    cost = (
        "bf16 products are converted to float32 and are no faster"
        if capability.startswith("AVX512")
        else "bf16 products run without vector instructions, an order of magnitude slower than float32"
    )
    return (
        f"train.amp=bf16 on a CPU without bf16 instructions (torch CPU capability {capability}): {cost}; "
        "set train.amp=none to train in float32"
    )
