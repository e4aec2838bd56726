"""A map's positive part as shares: what a map's peak, mass and entropy are read from, wherever the
map came from (attention, an attribution method)."""

from __future__ import annotations

import numpy as np


def positive_shares(maps: np.ndarray) -> np.ndarray:
    """``maps`` (..., P) -> the positive part of each map along its last axis as shares summing to 1,
    float64; a map with nothing positive is uniform (1 / P per cell)."""
    positive = np.clip(np.asarray(maps, dtype=np.float64), 0.0, None)
    totals = positive.sum(axis=-1, keepdims=True)
    uniform = np.full_like(positive, 1.0 / max(positive.shape[-1], 1))
    return np.where(totals > 0, positive / np.where(totals > 0, totals, 1.0), uniform)
