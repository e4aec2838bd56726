"""An independent bootstrap over images, written as plain loops, for the faithfulness statistics'
tests: the same draws as the project's (``numpy.random.default_rng(seed).integers(0, N, (R, N))``,
images in id order), everything after them computed here."""

from __future__ import annotations

import numpy as np


def draws(images: int, resamples: int, seed: int) -> np.ndarray:
    """(R, N) the images drawn by each resample."""
    return np.random.default_rng(seed).integers(0, images, size=(resamples, images))


def word_mean(sums: list[float], words: list[int], drawn) -> float:
    """The mean over the words of the drawn images (each drawn image brings all its words)."""
    return sum(sums[i] for i in drawn) / sum(words[i] for i in drawn)


def percentile_interval(sums: list[float], words: list[int], resamples: int, seed: int) -> list[float]:
    """[2.5th, 97.5th] percentiles of the resampled word means."""
    means = [word_mean(sums, words, row) for row in draws(len(sums), resamples, seed)]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def paired_test(
    sums_a: list[float], sums_b: list[float], words: list[int], resamples: int, seed: int
) -> tuple[float, float, float, float]:
    """B - A of the word means, its interval (d +- the 95th percentile of |d* - d|) and its two-sided
    p-value ``(1 + #{|d* - d| >= |d|}) / (R + 1)``: (difference, low, high, p)."""
    every = range(len(words))
    difference = word_mean(sums_b, words, every) - word_mean(sums_a, words, every)
    shifted = []
    for row in draws(len(words), resamples, seed):
        shifted.append(abs(word_mean(sums_b, words, row) - word_mean(sums_a, words, row) - difference))
    half = float(np.percentile(shifted, 95))
    extreme = sum(1 for value in shifted if value >= abs(difference) - 1e-9)
    return difference, difference - half, difference + half, (1 + extreme) / (resamples + 1)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment, as a loop: the i-th smallest times (m - i + 1), running maximum, cap 1."""
    order = sorted(range(len(p_values)), key=lambda k: p_values[k])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, k in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[k]))
        adjusted[k] = running
    return adjusted
