"""How much memory a device has free: the bound of every size a user may ask for (beams, resamples)."""

from __future__ import annotations

import os
import resource
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Bytes a new allocation may take now: CUDA's free memory, else the system's ``MemAvailable``
    (or free pages where ``/proc/meminfo`` is missing), and at most what this process's address-space
    limit (``ulimit -v``, ``prlimit --as``) leaves; None when it cannot be known."""
    if str(device).startswith("cuda"):  # torch only for CUDA: the CPU's answer needs none
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    system = _system_available()
    room = _address_space_left()
    if system is None or room is None:
        return room if system is None else system
    return min(system, room)


def _address_space_left() -> int | None:
    """What ``RLIMIT_AS`` leaves this process beyond its present size (``VmSize``); None unlimited."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return max(limit - int(line.split()[1]) * 1024, 0)
    except (OSError, ValueError):
        pass
    return limit


def _system_available() -> int | None:
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
