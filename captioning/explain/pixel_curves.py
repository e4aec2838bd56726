"""Deletion and insertion in pixel space: RISE's published protocol with the encoder in the loop.

Petsiuk et al. 2018 ("RISE", their released ``evaluation.py``: ``CausalMetric``) delete or insert the
pixels of the image the network sees (the normalised tensor), most salient first, ``step`` pixels at a
time, and read the class probability after every step:

- deletion starts from the image and sets pixels to the substrate 0 (in normalised units: the
  normalisation's mean colour);
- insertion starts from a blurred copy of the image (a Gaussian kernel of 11 x 11 pixels, sigma 5,
  made as their ``gkern(11, 5)``: ``scipy.ndimage.gaussian_filter`` of a centred delta; zero padding)
  and puts the real pixels back;
- the area is the mean of the curve over its ``n + 1`` points, ends halved:
  ``(sum - (first + last) / 2) / n`` (the trapezoid rule over the steps).

Here the saliency is a word's map on the decoder's grid (P cells), upsampled to the image as the
figures draw it (bilinear, pixel centres aligned); pixels of equal value are taken in one seeded
random order (the same for every word). Each changed image goes through the encoder again (passes of
``batch_images`` images) and the word's probability is read teacher-forced on the model's own caption,
as on the grid (:mod:`captioning.explain.faithfulness`). ``steps`` sets n: ``ceil(H W / steps)``
pixels per step and ``ceil(H W / that)`` steps, the last one possibly shorter (RISE's ``step = 224``
on 224 x 224 images is ``steps = 224``). The grid's random control has a pixel counterpart: each word's
pixels in a random order, one per seed.

What differs from RISE: the explained score is a word's probability given its prefix, not a class's;
maps come from the grid and are upsampled (RISE's own maps are per pixel); the image, its blurred copy
and the fully deleted image are encoded once per image and shared by every word and method.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.ndimage import gaussian_filter
from torch import Tensor

from captioning.explain.faithfulness import WordCurves, WordsAt
from captioning.utils.errors import InputError

# (M, 3, H, W) normalised images -> (M, P, C) grids
Encode = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class PixelCurveSettings:
    """The pixel-space protocol's options (stored in the scores' signature).

    Attributes:
        steps: RISE's number of steps n: ``ceil(H W / steps)`` pixels change per step.
        deletion_value: what a deleted pixel becomes, in the encoder's normalised units (0: the
            normalisation's mean colour, RISE's substrate).
        blur_size, blur_sigma: the insertion's Gaussian kernel (RISE: 11 pixels, sigma 5).
        tie_seed: the seed of the random order that breaks ties between pixels of equal value.
        batch_images: images per encoder pass.
    """

    steps: int = 10
    deletion_value: float = 0.0
    blur_size: int = 11
    blur_sigma: float = 5.0
    tie_seed: int = 0
    batch_images: int = 32

    def __post_init__(self) -> None:
        for name in ("steps", "batch_images", "blur_size"):
            if getattr(self, name) < 1:
                raise InputError(f"pixel curves {name} must be at least 1, got {getattr(self, name)}")
        if self.blur_size % 2 == 0:
            raise InputError(f"pixel curves blur_size must be odd, got {self.blur_size}")
        if not self.blur_sigma > 0:
            raise InputError(f"pixel curves blur_sigma must be above 0, got {self.blur_sigma}")
        if not math.isfinite(self.deletion_value):
            raise InputError(
                f"pixel curves deletion_value must be a finite number, got {self.deletion_value}"
            )

    def signature(self) -> str:
        """The settings as one signature value (no ``|`` or ``:``)."""
        return (
            f"pixel{self.steps}steps,del={self.deletion_value:g},"
            f"blur{self.blur_size}s{self.blur_sigma:g},tie{self.tie_seed}"
        )


def blur_kernel(size: int = 11, sigma: float = 5.0) -> Tensor:
    """(size, size) RISE's blurring kernel: a centred delta smoothed by ``gaussian_filter`` (sums to 1)."""
    delta = np.zeros((size, size))
    delta[size // 2, size // 2] = 1.0
    return torch.from_numpy(gaussian_filter(delta, sigma).astype(np.float32))


def blurred(images: Tensor, kernel: Tensor) -> Tensor:
    """(B, ch, H, W) images -> the same blurred channel by channel with ``kernel`` (zero padding)."""
    channels, size = images.size(1), kernel.size(-1)
    weight = kernel.to(images).expand(channels, 1, size, size)
    return F.conv2d(images, weight, padding=size // 2, groups=channels)


def change_counts(pixels: int, steps: int) -> Tensor:
    """(n + 1,) pixels changed after each step: ``min(i * step, pixels)``, ``step = ceil(pixels / steps)``."""
    step = -(-pixels // steps)
    total = -(-pixels // step)
    return torch.clamp(torch.arange(total + 1) * step, max=pixels)


def upsampled(maps: Tensor, grid: tuple[int, int], size: tuple[int, int]) -> Tensor:
    """(W, P) grid maps -> (W, H * W') maps on the image's pixels (bilinear, pixel centres aligned)."""
    stretched = F.interpolate(
        maps.float().view(-1, 1, *grid), size=size, mode="bilinear", align_corners=False
    )  # (W, 1, H, W')
    return stretched.flatten(1)


def tie_order(pixels: int, seed: int) -> Tensor:
    """(pixels,) the seeded random order in which pixels of equal value are taken."""
    return torch.randperm(pixels, generator=torch.Generator().manual_seed(seed))


def pixel_ranks(maps: Tensor, grid: tuple[int, int], size: tuple[int, int], seed: int) -> Tensor:
    """(W, P) maps -> (W, H * W') each pixel's place in its word's order (0: changed first): the
    upsampled map's highest value first, ties in the order of ``tie_order(H W', seed)``."""
    values = upsampled(maps, grid, size)
    ties = tie_order(values.size(1), seed).to(values.device)
    order = ties[torch.argsort(-values[:, ties], dim=1, stable=True)]  # (W, HW)
    return _ranks_of(order)


def random_pixel_ranks(words: int, pixels: int, seed: int, device: torch.device | None = None) -> Tensor:
    """(W, pixels) each word's pixels in a random order of its own, from ``seed`` (the control)."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.argsort(torch.rand(words, pixels, generator=generator), dim=1)
    return _ranks_of(order).to(device)


def _ranks_of(order: Tensor) -> Tensor:
    ranks = torch.empty_like(order, dtype=torch.int32)
    places = torch.arange(order.size(1), dtype=torch.int32, device=order.device)
    return ranks.scatter_(1, order, places.expand_as(order).contiguous())


def rise_area(curve: Tensor) -> Tensor:
    """RISE's ``auc``: the mean of curves (..., n + 1) over their points, ends halved -> (...)."""
    ends = (curve[..., 0] + curve[..., -1]) / 2
    return (curve.sum(-1) - ends) / (curve.size(-1) - 1)


@dataclass
class PixelWordCurves(WordCurves):
    """:class:`WordCurves` in pixel space, its areas RISE's (:func:`rise_area`, over the steps)."""

    @property
    def deletion_area(self) -> Tensor:
        return rise_area(self.deletion)

    @property
    def insertion_area(self) -> Tensor:
        return rise_area(self.insertion)


def _chunks(total: int, size: int) -> Iterator[slice]:
    for first in range(0, total, size):
        yield slice(first, min(total, first + size))


def _encoded(encode: Encode, images: Tensor, size: int) -> Tensor:
    return torch.cat([encode(images[part]).float() for part in _chunks(images.size(0), size)])


@torch.no_grad()
def pixel_curves(
    encode: Encode,
    words_at: WordsAt,
    images: Tensor,
    ranks: Tensor,
    words: Tensor,
    settings: PixelCurveSettings,
) -> PixelWordCurves:
    """RISE's deletion and insertion curves of W words in pixel space.

    Args:
        encode: normalised images (M, 3, H, W) -> their grids (M, P, C) (``Captioner.encode``).
        words_at: the word scores (``WordScorer.words_at``) of the B captions.
        images: (B, 3, H, W) the captioned images, normalised as the encoder takes them.
        ranks: (W, H * W) each word's pixel order (:func:`pixel_ranks`, :func:`random_pixel_ranks`).
        words: (W, 2) the (caption row, word index) of each word.
        settings: steps, substrates and pass size.
    Returns:
        the deletion and insertion probabilities, each (W, n + 1), and their areas.
    """
    height, width = images.shape[-2:]
    counts = change_counts(height * width, settings.steps).to(images.device)  # (K,)
    kernel = blur_kernel(settings.blur_size, settings.blur_sigma)
    blurry = blurred(images.float(), kernel).to(images.dtype)  # (B, 3, H, W)
    deleted = torch.full_like(images[:1], settings.deletion_value)  # (1, 3, H, W)
    # the three images every word shares: as it is, blurred, fully deleted
    ends = _encoded(encode, torch.cat([images, blurry, deleted]), settings.batch_images)
    full, blur_grids, void = ends[: images.size(0)], ends[images.size(0) : -1], ends[-1:]
    rows, indices = words[:, 0], words[:, 1]

    def scored(grids: Tensor, at: Tensor) -> Tensor:  # (M, P, C) grids of words ``at`` (M,) -> (M,)
        return words_at(grids, rows[at], indices[at]).exp()

    every = torch.arange(words.size(0), device=images.device)
    steps = counts.numel()
    deletion = images.new_zeros(words.size(0), steps, dtype=torch.float32)
    insertion = torch.zeros_like(deletion)
    deletion[:, 0] = insertion[:, -1] = scored(full[rows], every)
    deletion[:, -1] = scored(void.expand(words.size(0), -1, -1), every)
    insertion[:, 0] = scored(blur_grids[rows], every)
    # the inner points: (word, step) jobs, each mode's images made and encoded a pass at a time
    inner = torch.cartesian_prod(every, torch.arange(1, steps - 1, device=images.device))  # (J, 2)
    if steps > 2:
        for part in _chunks(inner.size(0), settings.batch_images):
            word, step = inner[part, 0], inner[part, 1]
            changed = (ranks[word] < counts[step].unsqueeze(1)).view(-1, 1, height, width)  # (m, 1, H, W)
            source = images[rows[word]]
            for curve, start, finish in (
                (deletion, source, deleted),
                (insertion, blurry[rows[word]], source),
            ):
                grids = encode(torch.where(changed, finish, start)).float()  # (m, P, C)
                curve[word, step] = scored(grids, word)
    return PixelWordCurves(deletion, insertion)


def method_pixel_curves(
    encode: Encode,
    words_at: WordsAt,
    images: Tensor,
    maps: Tensor,
    words: Tensor,
    grid: tuple[int, int],
    settings: PixelCurveSettings,
) -> PixelWordCurves:
    """The pixel curves of W words (``words`` (W, 2)) whose pixels their grid maps (W, P) order."""
    size = (images.size(-2), images.size(-1))
    ranks = pixel_ranks(maps, grid, size, settings.tie_seed).to(images.device)
    return pixel_curves(encode, words_at, images, ranks, words, settings)


def random_pixel_curves(
    encode: Encode,
    words_at: WordsAt,
    images: Tensor,
    words: Tensor,
    seeds: int,
    settings: PixelCurveSettings,
) -> list[PixelWordCurves]:
    """The control: one :class:`PixelWordCurves` per seed 0 .. seeds - 1, each word's pixels in a
    random order."""
    pixels = images.size(-2) * images.size(-1)
    return [
        pixel_curves(
            encode,
            words_at,
            images,
            random_pixel_ranks(words.size(0), pixels, seed, images.device),
            words,
            settings,
        )
        for seed in range(seeds)
    ]


@dataclass(frozen=True)
class PixelInputs:
    """What the pixel curves of a study need besides the grids.

    Attributes:
        encode: normalised images (M, 3, H, W) -> grids (M, P, C), on the study's device.
        images: (first, stop) -> the normalised images (stop - first, 3, H, W) of those captions, in
            the study's order (read when their batch is explained, so a split need not fit in memory).
        grid: (gh, gw) the encoder's grid, P = gh * gw.
    """

    encode: Encode
    images: Callable[[int, int], Tensor]
    grid: tuple[int, int]


def joined(parts: list[PixelWordCurves]) -> PixelWordCurves:
    """The curves of several batches of words, in order."""
    return PixelWordCurves(torch.cat([p.deletion for p in parts]), torch.cat([p.insertion for p in parts]))


def rank_agreement(grid_rows: dict[str, dict], pixel_rows: dict[str, dict]) -> dict[str, dict]:
    """Do the grid and pixel protocols rank the methods alike? Per curve, the methods from most to
    least faithful under each (deletion: lowest area first; insertion: highest) and Kendall's tau
    between their areas (None with fewer than two methods or when a protocol ties them all)."""
    from scipy.stats import kendalltau

    names = [name for name in grid_rows if name in pixel_rows]
    result = {}
    for curve, sign in (("deletion", 1.0), ("insertion", -1.0)):
        key = f"{curve}_auc"
        grid = [grid_rows[name][key] for name in names]
        pixel = [pixel_rows[name][key] for name in names]
        tau = kendalltau(grid, pixel).statistic if len(names) > 1 else float("nan")
        result[curve] = {
            "grid_order": sorted(names, key=lambda name: sign * grid_rows[name][key]),
            "pixel_order": sorted(names, key=lambda name: sign * pixel_rows[name][key]),
            "kendall_tau": None if not np.isfinite(tau) else float(tau),
        }
    return result


PROTOCOLS = ("grid", "pixel")


def parse_curves(text: str, option: str = "--curves") -> tuple[str, ...]:
    """``"grid,pixel"`` -> the protocols of the deletion and insertion curves; the grid's (the
    study's table) always among them.

    Raises:
        InputError: an unknown protocol, or a list without ``grid``, naming ``option``.
    """
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    for name in names:
        if name not in PROTOCOLS:
            raise InputError(f"{option}: unknown curves {name!r}; choose from {', '.join(PROTOCOLS)}")
    if "grid" not in names:
        raise InputError(
            f"{option} {text!r}: the grid curves make the study's table; give grid or grid,pixel"
        )
    return names
