"""What an explanation costs, checked before any work: the counts of :class:`ExplainConfig` against
the model's grid and the memory free on the device.

The counts' passes per explained word are bounded when the settings are made
(``ExplainConfig.rows_per_word``, at most ``MAX_ROWS_PER_WORD``); what needs the model is checked here:

- ``curve_steps`` at most the grid's P cells: a curve changes whole cells, so more points than cells
  only repeat points (and the memory of each point's grids);
- the largest allocation of one pass: ``batch_rows`` grids of P x C float32 values, held about four
  times (the grids, their baseline, the mixed copy, the decoder's work), plus integrated gradients'
  per-step lists (``CAPTUM_STEP_BYTES`` per step), within the device's free memory.
"""

from __future__ import annotations

import torch

from captioning.explain.config import CAPTUM_STEP_BYTES, ExplainConfig
from captioning.utils.errors import InputError
from captioning.utils.memory import available_bytes, gib

GRID_COPIES = 4  # grids of one pass held at once (see the module docstring)


def pass_bytes(config: ExplainConfig, cells: int, channels: int) -> int:
    """Bytes of one pass's grids and integrated gradients' step lists."""
    return GRID_COPIES * config.batch_rows * cells * channels * 4 + CAPTUM_STEP_BYTES * config.ig_steps


def check_explain_fits(config: ExplainConfig, cells: int, channels: int, device: torch.device) -> None:
    """Refuse, before any work, settings the model's grid (P ``cells`` of ``channels``) or the device's
    free memory cannot hold.

    Raises:
        InputError: one line naming the key (and its flag).
    """
    if config.curve_steps > cells:
        raise InputError(
            f"explain curve_steps {config.curve_steps} (--curve-steps) is more than the grid's {cells} "
            "cells: a curve changes whole cells, so at most one point per cell"
        )
    needed = pass_bytes(config, cells, channels)
    free = available_bytes(device)
    if free is not None and needed > free:
        key = "ig_steps" if CAPTUM_STEP_BYTES * config.ig_steps > needed // 2 else "batch_rows"
        raise InputError(
            f"explain {key} {getattr(config, key)} needs about {gib(needed)} at once, more than the "
            f"{gib(free)} free on {device}: lower it"
        )
