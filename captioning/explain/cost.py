"""What an explanation costs in memory, checked before any work: the counts of :class:`ExplainConfig`
against the model's grid, the words to explain and the memory free on the device.

The counts' passes per explained word are bounded when the settings are made
(``ExplainConfig.rows_per_word``, at most ``MAX_ROWS_PER_WORD``); what needs the model and the input is
checked here, each part of the memory named by the key that sets it:

- ``batch_rows``: one pass's grids, ``batch_rows`` x P x C float32 values held about four times (the
  grids, their baseline, the mixed copy, the decoder's work);
- ``ig_steps``: integrated gradients' per-step lists (``CAPTUM_STEP_BYTES`` per step);
- ``curve_steps``: every word's curves kept for the table, (steps + 1) float32 points of deletion and
  insertion per method and per random seed, and each word's (P,) map per method.
"""

from __future__ import annotations

import torch

from captioning.explain.config import CAPTUM_STEP_BYTES, ExplainConfig
from captioning.utils.errors import InputError
from captioning.utils.memory import available_bytes, gib

GRID_COPIES = 4  # grids of one pass held at once (see the module docstring)


def memory_parts(config: ExplainConfig, cells: int, channels: int, words: int) -> dict[str, int]:
    """Bytes by the key that sets them, for ``words`` explained words on a grid of P ``cells``."""
    kept = 2 * (config.curve_steps + 1) * (len(config.methods) + config.random_seeds)
    return {
        "batch_rows": GRID_COPIES * config.batch_rows * cells * channels * 4,
        "ig_steps": CAPTUM_STEP_BYTES * config.ig_steps,
        "curve_steps": words * 4 * (kept + cells * len(config.methods)),
    }


def check_explain_fits(
    config: ExplainConfig, cells: int, channels: int, words: int, device: torch.device
) -> None:
    """Refuse, before any work, settings whose memory for ``words`` explained words (at most: images x
    ``decode.max_length``) on a grid of P ``cells`` x ``channels`` is more than ``device`` has free.

    Raises:
        InputError: one line naming the key that needs the most (and its flag).
    """
    parts = memory_parts(config, cells, channels, words)
    needed = sum(parts.values())
    free = available_bytes(device)
    if free is not None and needed > free:
        key = max(parts, key=lambda name: parts[name])
        flag = "" if key == "batch_rows" else f" ({'--' + key.replace('_', '-')})"
        raise InputError(
            f"explain {key} {getattr(config, key)}{flag} with {words} words needs about {gib(needed)}, "
            f"more than the {gib(free)} free on {device}: lower it"
        )
