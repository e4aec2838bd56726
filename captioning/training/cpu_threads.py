"""CPU threads on a busy machine: torch's intra-op threads (one per core by default) wait for each
other at every operation, and when other processes hold the cores they spin instead of working. On a
shared 2-core machine that ran tiny and mid-sized models 4-8x slower than one thread per process.

``busy_machine_warning`` says so before a CPU run starts, with the setting that helps, and
``busy_machine_advice`` repeats the setting in the run's plan line; neither changes anything, so that
a run and its resume compute alike (the thread count changes the order of float reductions).
"""

from __future__ import annotations

import math
import os

import torch


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; all of them where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _oversubscribed(
    threads: int | None, cores: int | None, load: float | None
) -> tuple[int, int, float, int] | None:
    """(threads, cores, load, idle cores) when torch's threads outnumber the idle cores, else None."""
    threads = torch.get_num_threads() if threads is None else threads
    cores = usable_cores() if cores is None else cores
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
    idle = max(1, math.floor(cores - load + 0.5))
    return None if threads <= idle else (threads, cores, load, idle)


def busy_machine_warning(
    threads: int | None = None, cores: int | None = None, load: float | None = None
) -> str | None:
    """One warning line when this process's torch threads outnumber the cores other processes leave
    idle (the 1-minute load average), else None.

    Args:
        threads: torch's intra-op threads (default: ``torch.get_num_threads()``).
        cores: usable cores (default: ``usable_cores()``).
        load: the 1-minute load average (default: ``os.getloadavg()[0]``; None where there is none).
    """
    busy = _oversubscribed(threads, cores, load)
    if busy is None:
        return None
    threads, cores, load, idle = busy
    return (
        f"warning: the machine is busy (load average {load:.1f} on {cores} cores) and torch runs {threads} "
        f"threads per process: waiting threads spin, which can make a run several times slower; start it "
        f"with OMP_NUM_THREADS={idle} (docs/first-run-notes.md)"
    )


def busy_machine_advice(
    device: torch.device, threads: int | None = None, cores: int | None = None, load: float | None = None
) -> str | None:
    """The plan line's part on a busy machine (arguments as for :func:`busy_machine_warning`), else None."""
    busy = _oversubscribed(threads, cores, load) if device.type == "cpu" else None
    if busy is None:
        return None
    threads, cores, load, idle = busy
    return (
        f"busy machine (load average {load:.1f} on {cores} cores, {threads} torch threads): expect it to run "
        f"several times slower than idle unless started with OMP_NUM_THREADS={idle}"
    )


def say_if_busy(device: torch.device) -> None:
    """Print ``busy_machine_warning()``'s line, if any, before a run on the CPU does its work."""
    warning = busy_machine_warning() if device.type == "cpu" else None
    if warning:
        print(warning, flush=True)
