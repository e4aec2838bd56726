"""Does the word depend on the cells its map lights? Deletion and insertion curves on the grid.

Petsiuk et al. 2018 (RISE), on the decoder's grid instead of pixels: the cells of one word's map are
taken in the order the map ranks them (highest first) and, ``steps`` times, a further share of them is

- deleted: set to the baseline feature, starting from the image's grid; or
- inserted: given their real feature, starting from a grid of baseline features.

After each step the word's probability ``p(w_t | w_<t, grid)`` is read (teacher-forced on the model's
own caption). A map that finds the cells the word needs makes the deletion curve fall fast (low area)
and the insertion curve rise fast (high area). Areas are the trapezoid rule over the share of cells
in [0, 1]. The control is a random order of the cells, over several seeds: its mean area and its
spread, and each method's gap to it (deletion: random minus method; insertion: method minus random;
both positive when the map beats chance).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# (M, P, C) grids, (M,) caption rows, (M,) word indices -> (M,) log-probabilities
WordsAt = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class CurveSettings:
    """Attributes:
    steps: the curve's points after the first: cells changed after step k = round(k P / steps).
    random_seeds: random orders of the control.
    batch_rows: grids per forward pass.
    """

    steps: int = 10
    random_seeds: int = 3
    batch_rows: int = 256


def cell_counts(cells: int, steps: int) -> Tensor:
    """(steps + 1,) cells changed at each point: 0 .. P, evenly spaced, rounded."""
    return torch.round(torch.linspace(0, cells, steps + 1)).long()


def area(curve: Tensor) -> Tensor:
    """Trapezoid area of curves (..., K) over K evenly spaced points of [0, 1] -> (...)."""
    return torch.trapezoid(curve, dx=1.0 / (curve.size(-1) - 1), dim=-1)


def _chunks(total: int, size: int) -> Iterator[slice]:
    for first in range(0, total, size):
        yield slice(first, min(total, first + size))


@torch.no_grad()
def curves(
    words_at: WordsAt,
    annotations: Tensor,
    baseline: Tensor,
    orders: Tensor,
    words: Tensor,
    settings: CurveSettings,
) -> tuple[Tensor, Tensor]:
    """Deletion and insertion curves of W words.

    Args:
        words_at: the word scores (``WordScorer.words_at``).
        annotations: (B, P, C) the images' grids.
        baseline: (C,) the feature a deleted (or not yet inserted) cell takes.
        orders: (W, P) each word's cells, most relevant first.
        words: (W, 2) the (caption row, word index) of each word.
        settings: steps and pass size.
    Returns:
        deletion and insertion probabilities, each (W, steps + 1).
    """
    cells = annotations.size(1)
    counts = cell_counts(cells, settings.steps).to(annotations.device)  # (K,)
    rank = torch.empty_like(orders)
    rank.scatter_(1, orders, torch.arange(cells, device=orders.device).expand_as(orders))  # (W, P)
    # changed[w, k, p]: cell p is among the first counts[k] of word w's order
    changed = rank.unsqueeze(1) < counts.view(1, -1, 1)  # (W, K, P)
    rows = words[:, 0].unsqueeze(1).expand(-1, counts.numel()).reshape(-1)  # (W*K,)
    indices = words[:, 1].unsqueeze(1).expand(-1, counts.numel()).reshape(-1)
    flat = changed.reshape(-1, cells)  # (W*K, P)
    baseline = baseline.to(annotations)
    results = []
    for mode in ("deletion", "insertion"):
        probabilities = []
        for part in _chunks(flat.size(0), settings.batch_rows):
            grids = annotations[rows[part]]  # (m, P, C)
            replace = flat[part] if mode == "deletion" else ~flat[part]  # cells holding the baseline
            grids = torch.where(replace.unsqueeze(-1), baseline, grids)
            probabilities.append(words_at(grids, rows[part], indices[part]).exp())
        results.append(torch.cat(probabilities).view(-1, counts.numel()))
    return results[0], results[1]


def ranked(maps: Tensor) -> Tensor:
    """(W, P) maps -> (W, P) cell orders, highest first (ties in cell order)."""
    return torch.argsort(-maps, dim=1, stable=True)


def random_orders(words: int, cells: int, seed: int, device: torch.device | None = None) -> Tensor:
    """(W, P) a random permutation of the cells per word, from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.argsort(torch.rand(words, cells, generator=generator), dim=1).to(device)


@dataclass
class WordCurves:
    """Curves and areas of W words for one method (or the random control, averaged over seeds).

    Attributes:
        deletion, insertion: (W, K) probabilities after each step.
        deletion_area, insertion_area: (W,).
    """

    deletion: Tensor
    insertion: Tensor

    @property
    def deletion_area(self) -> Tensor:
        return area(self.deletion)

    @property
    def insertion_area(self) -> Tensor:
        return area(self.insertion)


def method_curves(
    words_at: WordsAt,
    annotations: Tensor,
    baseline: Tensor,
    maps: Tensor,
    words: Tensor,
    settings: CurveSettings,
) -> WordCurves:
    """The curves of W words ranked by their maps (W, P)."""
    return WordCurves(*curves(words_at, annotations, baseline, ranked(maps), words, settings))


def random_curves(
    words_at: WordsAt, annotations: Tensor, baseline: Tensor, words: Tensor, settings: CurveSettings
) -> list[WordCurves]:
    """The control: one :class:`WordCurves` per seed 0 .. random_seeds - 1, each word in a random order."""
    cells = annotations.size(1)
    return [
        WordCurves(
            *curves(
                words_at,
                annotations,
                baseline,
                random_orders(words.size(0), cells, seed, annotations.device),
                words,
                settings,
            )
        )
        for seed in range(settings.random_seeds)
    ]


def summarise(
    per_method: dict[str, WordCurves], control: list[WordCurves], select: Tensor
) -> dict[str, dict]:
    """The faithfulness rows of the words ``select`` (W,) bool: per method the mean deletion and
    insertion areas, and the gaps to the random control; ``random`` the control's mean areas over words,
    their mean and standard deviation over seeds. Empty when no word is selected."""
    if not bool(select.any()):
        return {}
    seed_deletion = np.array([float(c.deletion_area[select].mean()) for c in control])
    seed_insertion = np.array([float(c.insertion_area[select].mean()) for c in control])
    random_deletion, random_insertion = float(seed_deletion.mean()), float(seed_insertion.mean())
    rows: dict[str, dict] = {
        "random": {
            "deletion_auc": random_deletion,
            "deletion_auc_std": float(seed_deletion.std()),
            "insertion_auc": random_insertion,
            "insertion_auc_std": float(seed_insertion.std()),
            "words": int(select.sum()),
        }
    }
    for name, result in per_method.items():
        deletion = float(result.deletion_area[select].mean())
        insertion = float(result.insertion_area[select].mean())
        rows[name] = {
            "deletion_auc": deletion,
            "insertion_auc": insertion,
            "deletion_gap": random_deletion - deletion,
            "insertion_gap": insertion - random_insertion,
            "words": int(select.sum()),
        }
    return rows
