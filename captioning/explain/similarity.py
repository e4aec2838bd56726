"""How alike two maps of the same word are: the four measures of Adebayo et al. 2018.

"Sanity Checks for Saliency Maps" compares a method's map under the trained model with its map under a
randomised one (or one trained on shuffled labels) by

- ``spearman``: the Spearman rank correlation of the maps' values, signed;
- ``spearman_abs``: the same of their absolute values (a map whose sign flips scores -1 signed, 1 here);
- ``ssim``: the structural similarity index (Wang et al. 2004, scikit-image's ``structural_similarity``);
- ``hog``: the Pearson correlation of the maps' histograms of oriented gradients (scikit-image's ``hog``).

Their maps are images; ours are grids of cells (7x7, 9x9). The rank correlations are taken over the
P cells as they are (upsampling would add interpolated values that only repeat the cells' order).
SSIM and HOG describe an image's structure, so for them each map is first divided by its largest
absolute value (Adebayo et al.'s diverging normalisation, values in [-1, 1]: SSIM's data range is 2)
and stretched bilinearly over the image's ``size`` x ``size`` pixels (each cell's value at the cell's
centre, as the figures draw it; rounded to 10 decimals), then compared with scikit-image's defaults
(a 7-pixel window for SSIM; 9 orientations, 8x8-pixel cells, 3x3-cell blocks for HOG).

A measure that is undefined for a word (a constant map has no ranks or gradients to correlate) is left
out of that word's mean; ``words`` counts the words each mean is over.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import pearsonr, spearmanr
from torch import Tensor

from captioning.utils.errors import InputError

MEASURES = ("spearman", "spearman_abs", "ssim", "hog")
DECIMALS = 10  # the stretched maps' values are rounded to this many decimals


def skimage() -> tuple[ModuleType, ModuleType]:
    """``skimage.metrics`` and ``skimage.feature``, imported on first use.

    Raises:
        InputError: scikit-image is not installed, naming the extra that installs it.
    """
    try:
        import skimage.feature
        import skimage.metrics
    except ImportError:
        raise InputError(
            'the sanity checks\' SSIM and HOG need scikit-image: pip install -e ".[explain]"'
        ) from None
    return skimage.metrics, skimage.feature


def image_maps(maps: Tensor | np.ndarray, grid: tuple[int, int], size: int) -> np.ndarray:
    """(W, P) maps -> (W, size, size) float64 images: each divided by its largest absolute value
    (an all-zero map stays zero), stretched bilinearly (align_corners False) over the image, rounded to
    ``DECIMALS`` decimals."""
    values = torch.as_tensor(maps).detach().double().cpu().view(-1, 1, *grid)  # (W, 1, gh, gw)
    peak = values.abs().amax(dim=(1, 2, 3), keepdim=True)
    values = torch.where(peak > 0, values / peak.clamp_min(1e-300), torch.zeros_like(values))
    stretched = F.interpolate(values, size=(size, size), mode="bilinear", align_corners=False)[:, 0]
    # rounded: a bilinear stretch has gradients exactly along the axes, on HOG's orientation bins'
    # edges, where the last bit of float rounding would choose the bin
    return np.round(stretched.numpy(), DECIMALS)


def _rank_correlation(first: np.ndarray, second: np.ndarray) -> float:
    if np.ptp(first) == 0 or np.ptp(second) == 0:
        return float("nan")
    return float(spearmanr(first, second).statistic)


def _pearson(first: np.ndarray, second: np.ndarray) -> float:
    if np.ptp(first) == 0 or np.ptp(second) == 0:
        return float("nan")
    return float(pearsonr(first, second).statistic)


def hog_features(images: np.ndarray) -> np.ndarray:
    """(W, S, S) images -> (W, F) their HOG descriptors (scikit-image's defaults)."""
    _, feature = skimage()
    return np.stack([feature.hog(image) for image in images]) if len(images) else np.zeros((0, 0))


class Reference:
    """One method's maps under the trained model, with what every comparison reuses (their images
    and HOG descriptors), so a cascade of S stages computes them once.

    Args:
        maps: (W, P) the W words' maps.
        grid: (gh, gw), P = gh * gw.
        size: the image side in pixels for SSIM and HOG.
    """

    def __init__(self, maps: Tensor | np.ndarray, grid: tuple[int, int], size: int):
        self.maps = torch.as_tensor(maps).detach().double().cpu().numpy().reshape(-1, grid[0] * grid[1])
        self.grid, self.size = grid, size
        self.images = image_maps(self.maps, grid, size)
        self.hog = hog_features(self.images)

    def compare(self, other: Tensor | np.ndarray) -> dict[str, np.ndarray]:
        """Each measure per word between these maps and ``other`` (W, P): measure -> (W,) (NaN where
        undefined)."""
        metrics, _ = skimage()
        after = torch.as_tensor(other).detach().double().cpu().numpy().reshape(self.maps.shape)
        images = image_maps(after, self.grid, self.size)
        descriptors = hog_features(images)
        words = range(len(after))
        return {
            "spearman": np.array([_rank_correlation(self.maps[w], after[w]) for w in words]),
            "spearman_abs": np.array(
                [_rank_correlation(np.abs(self.maps[w]), np.abs(after[w])) for w in words]
            ),
            "ssim": np.array(
                [metrics.structural_similarity(self.images[w], images[w], data_range=2.0) for w in words]
            ),
            "hog": np.array([_pearson(self.hog[w], descriptors[w]) for w in words]),
        }


def summary(per_word: Mapping[str, np.ndarray]) -> dict[str, float | int | None]:
    """Measure -> its mean over the words where it is defined (None where it is nowhere), and
    ``words_<measure>``: how many words that mean is over."""
    result: dict[str, float | int | None] = {}
    for measure in MEASURES:
        values = per_word[measure]
        defined = values[~np.isnan(values)]
        result[measure] = float(defined.mean()) if defined.size else None
        result[f"words_{measure}"] = int(defined.size)
    return result


def similarities(
    before: Tensor | np.ndarray, after: Tensor | np.ndarray, grid: tuple[int, int], size: int
) -> dict[str, float | int | None]:
    """The four measures between W words' maps before and after (W, P), averaged over the words."""
    return summary(Reference(before, grid, size).compare(after))
