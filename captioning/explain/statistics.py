"""How sure is the faithfulness table? Intervals, n and paired tests of its areas and gaps.

Every number of a table row (:func:`captioning.explain.faithfulness.summarise`) is a mean over the
words of the chosen images. Words of one image are not independent (one caption, one grid), so the
resampling unit is the image: each of R resamples draws the N images with replacement and keeps all
the words of each drawn image (a cluster bootstrap), through the resample counts of
:func:`captioning.evaluation.significance.resample_counts`. A resample's mean is the sum of its words'
areas over its number of words (each image's (sum, words) statistics, as the caption comparison
resamples ratio metrics).

- An area's interval: the 2.5th and 97.5th percentiles of its resampled means (a percentile interval).
- A gap to the random order (deletion: random minus method; insertion: method minus random) and the
  difference between two methods on the same words: the paired test of
  :func:`captioning.evaluation.significance.compare_groups` (both sides resampled with the same
  images), its p-value ``(1 + #{|d* - d| >= |d|}) / (R + 1)`` and its interval ``d +- the 95th
  percentile of |d* - d|`` (0 lies outside it exactly when p < 0.05).
- Every test of one table (each pair of methods and each method against the random order, on both
  curves: m (m + 1) tests for m methods) is adjusted together by Holm's step-down method
  (:func:`captioning.evaluation.significance.holm`), as the caption comparison adjusts its metrics.
- The random order's seeds: each seed's mean area over the words, kept as a list (the page shows their
  mean, minimum and maximum); its interval is that of the seeds' mean, resampled over images.
- A table of one image has n and no interval or test (its resamples are all the image itself).
- Grounding mass and the pointing games per mention: percentile intervals of the same bootstrap over
  the images with boxes, each drawn with its mentions (:func:`grounding_intervals`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from captioning.evaluation.grounding import Instances, WordMatcher, grounding_per_image
from captioning.evaluation.significance import (
    Comparison,
    compare_groups,
    holm,
    ratio_score,
    resample_counts,
)
from captioning.explain.plausibility import Explained
from captioning.utils.errors import InputError

CURVES = ("deletion", "insertion")
LEVEL = 95.0  # percent, every interval
ALPHA = 0.05  # a Holm-adjusted p-value below it names the more faithful method

# (deletion (W,), insertion (W,)) areas of every word
Areas = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class BootstrapSettings:
    """The bootstrap of a faithfulness table (``evaluate.py --resamples``, ``--seed``).

    Attributes:
        resamples: R, resamples of the images.
        seed: seeds the draws (the same seed draws the same images for every method).
    """

    resamples: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        for name, least in (("resamples", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InputError(f"bootstrap {name} must be an integer of at least {least}, got {value!r}")

    def describe(self, tests: int) -> dict:
        """What the table's intervals and tests are, as JSON values (shown on the pages)."""
        return {
            "resamples": self.resamples,
            "seed": self.seed,
            "interval": f"{LEVEL:g}% percentile interval of a bootstrap over images (words resampled with "
            "their image)",
            "test": "paired bootstrap over images (both sides resampled with the same images), two-sided",
            "correction": f"Holm over the {tests} tests of the table",
            "tests": tests,
            "smallest_p_holm": smallest_p_holm(tests, self.resamples),
        }


def smallest_p_holm(tests: int, resamples: int) -> float:
    """The smallest Holm-adjusted p-value any of ``tests`` bootstrap tests of ``resamples`` resamples
    can have: the smallest p-value, 1 / (R + 1), times the number of tests (at most 1)."""
    return min(1.0, tests / (resamples + 1))


def floor_warning(tests: int, resamples: int) -> str | None:
    """A line when the tests cannot reach ``ALPHA`` at all (too few resamples for so many tests)."""
    floor = smallest_p_holm(tests, resamples)
    if floor < ALPHA:
        return None
    return (
        f"note: with {resamples} resamples and {tests} tests no p Holm can fall below {floor:.3g}, so no "
        f"test can be called at {ALPHA:g}: give --resamples {100 * tests} or more (a floor of 0.01)"
    )


def image_statistics(values: np.ndarray, image_index: np.ndarray, images: int) -> np.ndarray:
    """Per image, the sum of its words' ``values`` and its number of words.

    Args:
        values: (W,) one number per word; image_index: (W,) each word's image, 0 .. images - 1.
    Returns:
        (images, 2) float64 (sum, words).
    """
    sums = np.bincount(image_index, weights=np.asarray(values, dtype=np.float64), minlength=images)
    words = np.bincount(image_index, minlength=images).astype(np.float64)
    return np.stack([sums, words], axis=1)


def percentile_interval(counts: np.ndarray, statistics: np.ndarray) -> list[float]:
    """[low, high] of the word mean: percentiles of ``counts @ statistics`` (R resamples) as ratios."""
    means = ratio_score(counts @ statistics)  # (R,)
    means = means[np.isfinite(means)]
    if len(means) == 0:
        return [float("nan"), float("nan")]
    half = (100.0 - LEVEL) / 2
    return [float(np.percentile(means, half)), float(np.percentile(means, 100.0 - half))]


def _more_faithful(curve: str, a: str, b: str, difference: float, p_holm: float) -> str | None:
    """The method whose area is better (deletion lower, insertion higher) when the test says so."""
    if not p_holm < ALPHA or difference == 0:
        return None
    b_lower = difference < 0
    return (b if b_lower else a) if curve == "deletion" else (a if b_lower else b)


def add_statistics(
    rows: dict[str, dict],
    per_method: Mapping[str, Areas],
    control: Sequence[Areas],
    word_images: Sequence[int],
    select: np.ndarray,
    settings: BootstrapSettings,
    pairs: bool = True,
) -> list[dict]:
    """Add intervals, n and tests to the rows of :func:`summarise` of the words ``select``, in place.

    Args:
        rows: ``{"random": row, method: row}`` (empty when no word is selected: nothing is added).
        per_method: method -> its words' areas; control: the random order's areas, one per seed.
        word_images: (W,) each word's image id; select: (W,) bool, the words of the rows.
        settings: resamples and seed.
        pairs: whether to test each pair of methods too.
    Returns:
        The paired tests (``pairs``): ``{"curve", "a", "b", "a_area", "b_area", "difference" (B - A),
        "ci_low", "ci_high", "p_value", "p_holm", "more_faithful"}`` each; every method row gains
        ``images``, ``<curve>_auc_ci``, ``<curve>_gap_ci``, ``<curve>_gap_p`` and ``<curve>_gap_p_holm``;
        the random row ``images``, ``<curve>_auc_ci`` and ``<curve>_auc_seeds``.
    """
    if not rows:
        return []
    select = np.asarray(select, dtype=bool)
    ids = np.asarray(word_images)[select]
    index = np.unique(ids, return_inverse=True)[1].reshape(-1)  # (W',) 0 .. N - 1
    images = int(index.max()) + 1
    counts = resample_counts(images, settings.resamples, settings.seed)  # (R, N), one draw for all

    def stats(values: np.ndarray) -> np.ndarray:
        return image_statistics(np.asarray(values)[select], index, images)

    random = {curve: stats(np.mean([seed[k] for seed in control], axis=0)) for k, curve in enumerate(CURVES)}
    rows["random"]["images"] = images
    for k, curve in enumerate(CURVES):
        rows["random"][f"{curve}_auc_seeds"] = [float(np.asarray(seed[k])[select].mean()) for seed in control]
    for name in per_method:
        rows[name]["images"] = images
    if images < 2:  # one image resampled is itself: no interval, and a test that always "finds" a difference
        return []
    for curve in CURVES:
        rows["random"][f"{curve}_auc_ci"] = percentile_interval(counts, random[curve])
    method_stats = {
        name: {c: stats(areas[k]) for k, c in enumerate(CURVES)} for name, areas in per_method.items()
    }
    tests: list[tuple[bool, dict, str, Comparison]] = []  # (a pair?, where it goes, curve, test)
    for name, curves in method_stats.items():
        for curve in CURVES:
            rows[name][f"{curve}_auc_ci"] = percentile_interval(counts, curves[curve])
            # the gap is positive when the map beats chance: random - method on deletion, method - random
            first, second = (
                (curves[curve], random[curve]) if curve == "deletion" else (random[curve], curves[curve])
            )
            gap = compare_groups(counts, [first], [second], ratio_score, settings.seed)
            tests.append((False, rows[name], curve, gap))
    paired: list[dict] = []
    for a, b in combinations(method_stats, 2) if pairs else ():
        for curve in CURVES:
            sides = [method_stats[a][curve]], [method_stats[b][curve]]
            paired.append({"curve": curve, "a": a, "b": b})
            tests.append(
                (True, paired[-1], curve, compare_groups(counts, *sides, ratio_score, settings.seed))
            )
    adjusted = holm([test.p_value for *_, test in tests])
    for (pair, where, curve, test), p_holm in zip(tests, adjusted, strict=True):
        if pair:
            where.update(
                a_area=test.a, b_area=test.b, difference=test.difference, ci_low=test.ci_low,
                ci_high=test.ci_high, p_value=test.p_value, p_holm=p_holm,
                more_faithful=_more_faithful(curve, where["a"], where["b"], test.difference, p_holm),
            )  # fmt: skip
        else:
            where[f"{curve}_gap_ci"] = [test.ci_low, test.ci_high]
            where[f"{curve}_gap_p"] = test.p_value
            where[f"{curve}_gap_p_holm"] = p_holm
    return paired


def number_of_tests(methods: int, pairs: bool = True) -> int:
    """The number of tests a table of ``methods`` methods adjusts together."""
    return len(CURVES) * (methods + (methods * (methods - 1) // 2 if pairs else 0))


# key of a method's row -> the per-mention list of ImageGrounding it averages
GROUNDING_LISTS = {"grounding_mass": "masses", "pointing": "hits", "pointing_published": "published_hits"}


def grounding_intervals(
    explained: Sequence[Explained], instances: Instances, tolerance: float, settings: BootstrapSettings
) -> dict[str, dict[str, list[float]]]:
    """Per method, the 95% percentile intervals of its grounding mass and both pointing games per
    mention (``<key>_ci`` of :data:`GROUNDING_LISTS`), from a bootstrap over the images the instances
    cover, each drawn with its mentions (the rules of
    :func:`captioning.explain.plausibility.grounding_rows`)."""
    matcher = WordMatcher()
    covered = [item for item in explained if item.image_id in instances.image_sizes]
    if len(covered) < 2:  # one image: no interval (see the module docstring)
        return {}
    counts = resample_counts(len(covered), settings.resamples, settings.seed)
    intervals: dict[str, dict[str, list[float]]] = {}
    for method in covered[0].maps:
        items = (
            (item.image_id, item.words, np.clip(item.maps[method], 0.0, None), item.grid) for item in covered
        )
        per_image = grounding_per_image(items, instances, matcher, tolerance)
        intervals[method] = {}
        for key, field in GROUNDING_LISTS.items():
            values = [getattr(per_image[item.image_id], field) for item in covered]
            statistics = np.array([[float(np.sum(v)), float(len(v))] for v in values])  # (N, 2)
            intervals[method][f"{key}_ci"] = percentile_interval(counts, statistics)
    return intervals
