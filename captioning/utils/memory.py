"""How much memory a device has free: the bound of every size a user may ask for (beams, resamples)."""

from __future__ import annotations

import os

import torch


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Bytes a new allocation may take now: CUDA's free memory, else the system's ``MemAvailable``
    (or free pages where ``/proc/meminfo`` is missing); None when it cannot be known."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def gib(size: float) -> str:
    """``size`` bytes in GiB, for a message."""
    return f"{size / 2**30:.1f} GiB"
