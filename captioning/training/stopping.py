"""Stopping on SIGTERM, the signal schedulers and ``torchrun`` send before they kill a job.

Every process finishes the step it is in; the processes agree on stopping (a flag all-reduced
as a max after each step, so a signal to any one of them stops them all at the same step); rank 0
writes ``last.pt``; the run exits with ``EXIT_STATUS``. The same command with ``--resume auto``
continues exactly where it stopped.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from captioning.utils import distributed

EXIT_STATUS = 75  # EX_TEMPFAIL (sysexits.h): stopped on request with everything saved; run it again


class TrainingStopped(Exception):
    """The run stopped on SIGTERM after writing ``last.pt``; nothing failed."""

    exit_status = EXIT_STATUS


class StopRequest:
    """Catches SIGTERM while training (a context manager) and says when every process should stop.

    Args:
        world_size: processes in the job; with more than one, ``agreed`` is a collective call.
        device: where the flag is reduced (the device of the process group's backend).
    """

    def __init__(self, world_size: int = 1, device: torch.device | str = "cpu"):
        self.world_size, self.device = world_size, torch.device(device)
        self.received = False  # this process got SIGTERM
        self.stopping = False  # the processes agreed to stop
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None  # the handler replaced

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = True  # acted on at the next step boundary, never inside a step

    def agreed(self) -> bool:
        """True once any process has received SIGTERM; every process must call it after each step."""
        if self.world_size > 1:
            flag = torch.tensor([float(self.received)], device=self.device)
            self.stopping = bool(distributed.all_reduce_max(flag).item())
        else:
            self.stopping = self.received
        return self.stopping
