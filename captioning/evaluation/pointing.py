"""The pointing game as published (Zhang et al. 2016, "Top-down neural attention by excitation
backprop"), as TorchRay's ``benchmark/pointing_game.py`` computes it and grounding papers report it.

A map points at its maximum after upsampling to the image's pixels (bilinear, pixel centres aligned:
``align_corners=False``; ties go to the first pixel in row-major order). The point hits when any
ground-truth pixel lies strictly within ``tolerance`` pixels (Euclidean, default 15) of it. On COCO
the ground truth is the instance's segmentation mask (polygons or RLE, decoded with pycocotools);
an object without a segmentation counts by its box, rasterised the same way. The accuracy is
reported per category and averaged over the categories as TorchRay's ``PointingGame.accuracy``
does: over every category of the dataset, a category never evaluated counting 0
(:func:`dataset_class_mean`); :func:`class_mean` averages over the categories evaluated only.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pycocotools import mask as mask_utils

from captioning.evaluation.coco_files import EvaluationInputError

DEFAULT_TOLERANCE = 15.0  # pixels, as published
MAX_PIXELS = 10**7  # image sides and box coordinates beyond this are not images


def checked_segmentation(where: str, segmentation: Any, image_size: tuple[float, float]) -> Any:
    """An annotation's segmentation as pycocotools decodes it, or None when it has none (absent,
    null or an empty list).

    Raises:
        EvaluationInputError: ``<file>: annotations[i]: segmentation ...``: not a list of polygons
            (each an even number, at least 6, of finite coordinates) nor an RLE (``counts`` and a
            ``size`` equal to the image's [height, width]).
    """
    if segmentation is None or segmentation == []:
        return None
    if isinstance(segmentation, list):
        for index, polygon in enumerate(segmentation):
            if not (
                isinstance(polygon, list)
                and len(polygon) >= 6
                and len(polygon) % 2 == 0
                and all(is_number(v) and abs(v) <= MAX_PIXELS for v in polygon)
            ):
                raise EvaluationInputError(
                    f"{where}: segmentation[{index}] must be a polygon [x1, y1, x2, y2, ...] of at least "
                    f"3 points within +-{MAX_PIXELS} pixels, got {polygon!r:.60}"
                )
        return segmentation
    width, height = image_size
    if isinstance(segmentation, dict) and segmentation.get("size") == [round(height), round(width)]:
        counts = segmentation.get("counts")
        if isinstance(counts, str):
            counts = _rle_string_counts(counts)
        # pycocotools writes the runs without bounds checks: they must cover the image exactly.
        if (
            isinstance(counts, list)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts)
            and sum(counts) == round(height) * round(width)
        ):
            return segmentation
    raise EvaluationInputError(
        f"{where}: segmentation must be a list of polygons or an RLE {{'counts': ..., 'size': "
        f"[{round(height)}, {round(width)}]}} (the image's height and width), got {segmentation!r:.80}"
    )


def _rle_string_counts(text: str) -> list[int] | None:
    """The run lengths of a compressed COCO RLE string (pycocotools' ``rleFrString``), None when it
    is not one (a character outside the alphabet, a truncated number, a negative run)."""
    counts: list[int] = []
    position = 0
    while position < len(text):
        value, shift, more = 0, 0, True
        while more:
            if position >= len(text) or not 48 <= ord(text[position]) < 48 + 64 or shift > 60:
                return None
            chunk = ord(text[position]) - 48
            value |= (chunk & 0x1F) << (5 * shift)
            more = bool(chunk & 0x20)
            position += 1
            shift += 1
            if not more and chunk & 0x10:
                value |= -1 << (5 * shift)
        if len(counts) > 2:
            value += counts[-2]
        if value < 0:
            return None
        counts.append(value)
    return counts


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and bool(np.isfinite(value))


def object_mask(
    bbox: tuple[float, float, float, float], segmentation: Any, image_size: tuple[float, float]
) -> np.ndarray:
    """The pixels an object covers: its segmentation when it has one, else its box.

    Args:
        bbox: (x, y, width, height) in pixels.
        segmentation: polygons or an RLE (:func:`checked_segmentation`), or None.
        image_size: (width, height) of the image.
    Returns:
        (H, W) bool.
    """
    width, height = round(image_size[0]), round(image_size[1])
    if segmentation is None:
        rle = mask_utils.frPyObjects(np.array([bbox], dtype=np.float64), height, width)[0]
    elif isinstance(segmentation, list):
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation["counts"], list):
        rle = mask_utils.frPyObjects(segmentation, height, width)
    else:
        rle = {"size": segmentation["size"], "counts": segmentation["counts"].encode("ascii")}
    with warnings.catch_warnings():  # pycocotools' decode predates numpy 2's copy keyword
        warnings.simplefilter("ignore", DeprecationWarning)
        return mask_utils.decode(rle).astype(bool)


def map_maximum(weights: np.ndarray, image_size: tuple[float, float]) -> tuple[int, int]:
    """The pixel (x, y) where a (gh, gw) map, upsampled to the image, is largest.

    Args:
        weights: (gh, gw) attention over the grid that covers the whole image.
        image_size: (width, height) in pixels.
    Returns:
        (column, row) of the first maximum in row-major order.
    """
    width, height = round(image_size[0]), round(image_size[1])
    grid = torch.as_tensor(np.asarray(weights, dtype=np.float64))[None, None]  # (1, 1, gh, gw)
    upsampled = F.interpolate(grid, size=(height, width), mode="bilinear", align_corners=False)[0, 0]
    index = int(torch.argmax(upsampled))  # (H, W) flattened; the first maximum
    return index % width, index // width


def published_hit(
    weights: np.ndarray,
    mask: np.ndarray,
    image_size: tuple[float, float],
    tolerance: float = DEFAULT_TOLERANCE,
) -> bool:
    """Whether the map's maximum lies strictly within ``tolerance`` pixels of a ground-truth pixel.

    Args:
        weights: (gh, gw) attention map.
        mask: (H, W) bool ground truth (the union of the named objects' masks).
        image_size: (width, height) in pixels, the mask's size.
        tolerance: pixels.
    """
    x, y = map_maximum(weights, image_size)
    reach = int(np.ceil(tolerance))
    top, left = max(y - reach, 0), max(x - reach, 0)
    window = mask[top : y + reach + 1, left : x + reach + 1]  # (h, w) around the point
    rows, cols = np.nonzero(window)
    return bool((((rows + top - y) ** 2 + (cols + left - x) ** 2) < tolerance**2).any())


def dataset_class_mean(
    hits: Sequence[float], classes: Sequence[str], categories: Sequence[str]
) -> float | None:
    """TorchRay's class mean: over every one of the dataset's ``categories``, hits / max(evaluations, 1)
    (a category never evaluated counts 0), averaged; None without categories or without any hit
    counted (no evaluation: the game was not played).

    Args:
        hits: one 0/1 (or expected) hit per evaluation (here a mention).
        classes: the class of each; one that is not a single category (a word naming objects of
            several, ``circle+square``) is no category's evaluation and is left out.
        categories: the dataset's categories (an instances file's ``categories``).
    """
    if not categories or not hits:
        return None
    totals = {name: [0.0, 0] for name in categories}
    for hit, name in zip(hits, classes, strict=True):
        if name in totals:
            totals[name][0] += hit
            totals[name][1] += 1
    return float(np.mean([hit_sum / max(count, 1) for hit_sum, count in totals.values()]))


def class_mean(hits: Sequence[float], classes: Sequence[str]) -> float | None:
    """The mean over the classes evaluated of each class's mean hit (None without any hit counted).

    Args:
        hits: one 0/1 (or expected) hit per mention.
        classes: the class of each mention.
    """
    per_class: dict[str, list[float]] = {}
    for hit, name in zip(hits, classes, strict=True):
        per_class.setdefault(name, []).append(hit)
    if not per_class:
        return None
    return float(np.mean([np.mean(values) for values in per_class.values()]))
