"""Measuring in the benchmarks: median wall time, peak memory, and the load other processes put on the CPU."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import re
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(run: Callable[[], Any], repeats: int, device: torch.device, warmup: int = 1) -> float:
    """Median wall time of ``run()`` over ``repeats`` calls, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _status_kib(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _release_free_heap() -> None:
    """Hand freed heap memory back to the OS (glibc), so the resident set counts live memory only."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakMemory:
    """Peak memory a block adds above what was in use when it began, in MiB (``.mib`` after the block).

    CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak. CPU: the resident set's
    high-water mark (VmHWM), reset by writing 5 to /proc/self/clear_refs (Linux), above the
    resident set at the start, after freed heap memory is returned to the OS; where the reset is
    not possible, the growth of ``ru_maxrss``, which misses a block that stays under an earlier peak.
    ``.peak_mib``: the peak itself, what was in use before included (CPU: the process's resident
    set at its highest during the block; without the reset, the process's highest ever).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.mib = 0.0
        self.peak_mib = 0.0

    def __enter__(self) -> Self:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            return self
        _release_free_heap()
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self._peak = lambda: _status_kib("VmHWM") * 1024
            self._start = _status_kib("VmRSS") * 1024
        except (OSError, TypeError):
            self._peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self._start = self._peak()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = self._peak()
        self.mib = max(peak - self._start, 0) / 2**20
        self.peak_mib = peak / 2**20


def autocast(device: torch.device, amp: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` (CUDA or CPU) when ``amp``; nothing otherwise."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext()


class OtherLoad:
    """CPU cores used on average by other processes while the block ran (Linux; None elsewhere).

    The system's busy time from /proc/stat minus this process's own CPU time, over the wall time:
    near 0 means the numbers were measured on an otherwise idle machine.
    """

    @staticmethod
    def _busy_seconds() -> float | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> Self:
        times = os.times()
        self._start = (self._busy_seconds(), times.user + times.system, time.perf_counter())
        self.cores: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        busy, times, wall = self._busy_seconds(), os.times(), time.perf_counter()
        if busy is not None and self._start[0] is not None:
            own = times.user + times.system - self._start[1]
            self.cores = max(busy - self._start[0] - own, 0.0) / (wall - self._start[2])
