"""Does the word depend on the cells its map lights? Deletion and insertion curves on the grid.

Petsiuk et al. 2018 (RISE), on the decoder's grid instead of pixels: the cells of one word's map are
taken in the order the map ranks them (highest first; cells the map ties, such as Grad-CAM's cut
zeros, in a random order drawn from ``CurveSettings.seed``, not top-left first) and, ``steps`` times,
a further share of them is

- deleted: set to the baseline's, starting from the image's grid; or
- inserted: given their real feature, starting from the baseline grid.

After step k, ``round(k P / steps)`` of the P cells have changed: the counts are whole cells, so the
points are not evenly spaced when ``steps`` does not divide P. After each step the word's probability
``p(w_t | w_<t, grid)`` is read (teacher-forced on the model's own caption). A map that finds the cells
the word needs makes the deletion curve fall fast (low area) and the insertion curve rise fast (high
area). Areas are the trapezoid rule over the TRUE share of cells changed at each point
(``shares``: count / P, in [0, 1]). The control is a random order of the cells, per seed; the table
gives its mean area over the seeds' means and the spread (standard deviation) of the seeds' means,
and each method's gap to it (deletion: random minus method; insertion: method minus random; both
positive when the map beats chance).

Random orders (ties and the control) are drawn per image from (seed, image index), so they do not
depend on how images are batched.
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
    seed: the random orders' seed (ties in a map; the control's seeds are seed's streams 0 .. n - 1).
    """

    steps: int = 10
    random_seeds: int = 3
    batch_rows: int = 256
    seed: int = 0


def cell_counts(cells: int, steps: int) -> Tensor:
    """(steps + 1,) cells changed at each point: 0 .. P, evenly spaced, rounded to whole cells."""
    return torch.round(torch.linspace(0, cells, steps + 1, dtype=torch.float64)).long()


def shares(cells: int, steps: int) -> Tensor:
    """(steps + 1,) float64: the true share of the P cells changed at each point, count / P."""
    return cell_counts(cells, steps).double() / cells


def area(curve: Tensor, x: Tensor) -> Tensor:
    """Trapezoid area of curves (..., K) over the K points ``x`` (K,) of [0, 1] -> (...)."""
    return torch.trapezoid(curve.double(), x=x.to(curve.device), dim=-1).to(curve.dtype)


def random_keys(images: Tensor, cells: int, entropy: tuple[int, ...]) -> Tensor:
    """(W, P) uniform keys for W words, drawn per image: the words of image i (``images`` (W,), in their
    order) take their rows from a generator seeded with (``entropy``, i), so a word's keys do not
    depend on which other images share its batch."""
    keys = torch.empty(images.numel(), cells, dtype=torch.float64)
    where = images.cpu().numpy()
    for image in np.unique(where):
        chosen = np.flatnonzero(where == image)
        generator = np.random.default_rng([*entropy, int(image)])
        keys[torch.from_numpy(chosen)] = torch.from_numpy(generator.random((chosen.size, cells)))
    return keys.to(images.device)


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
        words_at: the word scores (``WordScorer.words_at``: log-probabilities).
        annotations: (B, P, C) the images' grids.
        baseline: (C,) or (B, P, C): what a deleted (or not yet inserted) cell holds.
        orders: (W, P) each word's cells, most relevant first.
        words: (W, 2) the (caption row, word index) of each word.
        settings: steps and pass size.
    Returns:
        deletion and insertion probabilities, each (W, steps + 1).
    """
    cells = annotations.size(1)
    counts = cell_counts(cells, settings.steps).to(annotations.device)  # (K,)
    points = counts.numel()
    rank = torch.empty_like(orders)
    rank.scatter_(1, orders, torch.arange(cells, device=orders.device).expand_as(orders))  # (W, P)
    base = baseline.to(annotations).expand_as(annotations)  # (B, P, C)
    results = []
    for mode in ("deletion", "insertion"):
        probabilities = []
        for part in _chunks(words.size(0) * points, settings.batch_rows):
            flat = torch.arange(part.start, part.stop, device=annotations.device)  # rows w * K + k
            word, point = flat // points, flat % points
            rows, indices = words[word, 0], words[word, 1]
            changed = rank[word] < counts[point].unsqueeze(1)  # (m, P): among the first counts[k] cells
            replace = changed if mode == "deletion" else ~changed  # cells holding the baseline's
            grids = torch.where(replace.unsqueeze(-1), base[rows], annotations[rows])  # (m, P, C)
            probabilities.append(words_at(grids, rows, indices).exp())
        results.append(torch.cat(probabilities).view(-1, points))
    return results[0], results[1]


def ranked(maps: Tensor, keys: Tensor) -> Tensor:
    """(W, P) maps -> (W, P) cell orders, highest first; cells of equal value in the order of their
    ``keys`` (W, P) (random keys: a random order among ties)."""
    shuffle = torch.argsort(keys, dim=1)  # (W, P) the cells in the keys' order
    order = torch.argsort(-maps.gather(1, shuffle), dim=1, stable=True)
    return shuffle.gather(1, order)


def random_orders(images: Tensor, cells: int, entropy: tuple[int, ...]) -> Tensor:
    """(W, P) a random permutation of the cells per word (``random_keys``' order)."""
    return torch.argsort(random_keys(images, cells, entropy), dim=1)


@dataclass
class WordCurves:
    """Curves and areas of W words for one method (or one seed of the random control).

    Attributes:
        deletion, insertion: (W, K) probabilities after each step.
        shares: (K,) the share of cells changed at each point (``shares``); None: K evenly spaced
            points of [0, 1] (curves built by hand whose steps divide the cells).
        deletion_area, insertion_area: (W,) trapezoid areas over ``shares``.
    """

    deletion: Tensor
    insertion: Tensor
    shares: Tensor | None = None

    def __post_init__(self) -> None:
        if self.shares is None:
            self.shares = torch.linspace(0, 1, self.deletion.size(-1), dtype=torch.float64)

    @property
    def points(self) -> Tensor:
        """(K,) ``shares`` (set at construction)."""
        assert self.shares is not None
        return self.shares

    @property
    def deletion_area(self) -> Tensor:
        return area(self.deletion, self.points)

    @property
    def insertion_area(self) -> Tensor:
        return area(self.insertion, self.points)


def method_curves(
    words_at: WordsAt,
    annotations: Tensor,
    baseline: Tensor,
    maps: Tensor,
    words: Tensor,
    settings: CurveSettings,
    images: Tensor | None = None,
) -> WordCurves:
    """The curves of W words ranked by their maps (W, P), ties in a random order.

    ``images`` (W,): each word's image index in the whole study (default: its caption row), which
    seeds the order of its ties."""
    cells = annotations.size(1)
    keys = random_keys(words[:, 0] if images is None else images, cells, (settings.seed, 0))
    orders = ranked(maps, keys.to(maps.device))
    return WordCurves(
        *curves(words_at, annotations, baseline, orders, words, settings), shares(cells, settings.steps)
    )


def random_curves(
    words_at: WordsAt,
    annotations: Tensor,
    baseline: Tensor,
    words: Tensor,
    settings: CurveSettings,
    images: Tensor | None = None,
) -> list[WordCurves]:
    """The control: one :class:`WordCurves` per seed 0 .. random_seeds - 1, each word in a random order
    (``images`` as for :func:`method_curves`)."""
    cells = annotations.size(1)
    images = words[:, 0] if images is None else images
    return [
        WordCurves(
            *curves(
                words_at,
                annotations,
                baseline,
                random_orders(images, cells, (settings.seed, 1, seed)).to(annotations.device),
                words,
                settings,
            ),
            shares(cells, settings.steps),
        )
        for seed in range(settings.random_seeds)
    ]


def summarise(
    per_method: dict[str, WordCurves], control: list[WordCurves], select: Tensor
) -> dict[str, dict]:
    """The faithfulness rows of the words ``select`` (W,) bool: per method the mean deletion and
    insertion areas, and the gaps to the random control; ``random`` the control: per seed the mean
    area over the words, then the mean of those seed means and their standard deviation over the seeds
    (``*_auc_std``: the spread of the seeds' means, not an interval). Empty when no word is selected."""
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
