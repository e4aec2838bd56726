"""Is system B better than system A on the same images? A paired bootstrap over images.

Both systems' captions of the same images are scored; the images are resampled with replacement
(the same resample for both systems and every metric), and each metric is recomputed on each
resample as the toolkit computes it on the whole set:

- CIDEr-D, ROUGE-L, METEOR and SPICE as the mean of their per-image scores (for CIDEr-D, ROUGE-L
  and SPICE that is the toolkit's corpus score; METEOR's corpus score pools its statistics, so its
  mean of per-image scores differs slightly from the METEOR of the scores table);
- BLEU-1..4 at corpus level, from each image's n-gram matches, n-gram counts, caption length and
  closest reference length (pycocoevalcap's statistics), summed over the resample: no text is
  rescored.

With the bootstrap differences d*_r (B minus A) and the observed difference d, the 95% interval is
the 2.5 and 97.5 percentiles of d*, and the two-sided p-value is the share of resamples whose
difference, centred on d, is at least as far from 0 as d: ``(1 + #{|d*_r - d| >= |d|}) / (R + 1)``
(Berg-Kirkpatrick et al., 2012; Koehn, 2004). Differences under 1e-9 count as none (p = 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from pycocoevalcap.bleu.bleu_scorer import cook_refs, cook_test

BLEU_ORDERS = 4
# Columns of the BLEU statistics: caption length, closest reference length, n-gram counts, matches.
_TESTLEN, _REFLEN, _GUESS, _CORRECT = 0, 1, 2, 2 + BLEU_ORDERS
# pycocoevalcap's smoothing constants, so that the corpus scores are the toolkit's.
_TINY, _SMALL = 1e-15, 1e-9
# Differences smaller than this are no difference: BLEU without a single n-gram match is ~1e-15, not 0.
_RESOLUTION = 1e-9


@dataclass(frozen=True)
class Comparison:
    """One metric of two systems: their scores, B - A, its 95% interval and the p-value."""

    a: float
    b: float
    difference: float
    ci_low: float
    ci_high: float
    p_value: float

    def to_json(self) -> dict[str, float]:
        """The fields as a dict."""
        return asdict(self)


def bleu_statistics(gts: Mapping[int, Sequence[str]], res: Mapping[int, Sequence[str]],
                    image_ids: Sequence[int]) -> np.ndarray:
    """Per-image BLEU statistics as pycocoevalcap's ``BleuScorer`` keeps them (option ``closest``).

    Args:
        gts: image id -> tokenised references (space-separated strings).
        res: image id -> ``[tokenised candidate]``.
        image_ids: (N,) the images, in the row order wanted.
    Returns:
        (N, 2 + 2 * 4) float64: caption length, closest reference length, n-gram counts for
        n = 1..4, clipped n-gram matches for n = 1..4.
    """
    rows = np.zeros((len(image_ids), _CORRECT + BLEU_ORDERS))
    for row, image_id in enumerate(image_ids):
        comps = cook_test(res[image_id][0], cook_refs(gts[image_id], n=BLEU_ORDERS), n=BLEU_ORDERS)
        testlen = comps["testlen"]
        rows[row, _TESTLEN] = testlen
        rows[row, _REFLEN] = min((abs(length - testlen), length) for length in comps["reflen"])[1]
        rows[row, _GUESS:_CORRECT] = comps["guess"]
        rows[row, _CORRECT:] = comps["correct"]
    return rows


def corpus_bleu(sums: np.ndarray, order: int) -> np.ndarray:
    """Corpus BLEU-``order`` from summed statistics, as pycocoevalcap computes it.

    Args:
        sums: (R, 10) statistics of :func:`bleu_statistics` summed over each of R image sets.
        order: 1..4.
    Returns:
        (R,) scores.
    """
    precisions = (sums[:, _CORRECT:_CORRECT + order] + _TINY) / (sums[:, _GUESS:_GUESS + order] + _SMALL)  # (R, n)
    score = np.prod(precisions, axis=1) ** (1.0 / order)
    ratio = (sums[:, _TESTLEN] + _TINY) / (sums[:, _REFLEN] + _SMALL)
    penalty = np.where(ratio < 1, np.exp(1 - 1 / np.minimum(ratio, 1)), 1.0)
    return score * penalty


def resample_counts(images: int, resamples: int, seed: int) -> np.ndarray:
    """How often each image is drawn in each bootstrap resample: (R, N) float64, rows sum to N."""
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, images, size=(resamples, images))  # (R, N) image indices
    flat = (np.arange(resamples)[:, None] * images + drawn).ravel()
    return np.bincount(flat, minlength=resamples * images).reshape(resamples, images).astype(np.float64)


def compare_statistic(counts: np.ndarray, stats_a: np.ndarray, stats_b: np.ndarray,
                      score: Callable[[np.ndarray], np.ndarray]) -> Comparison:
    """Paired bootstrap of one metric.

    Args:
        counts: (R, N) :func:`resample_counts`.
        stats_a, stats_b: (N, K) per-image statistics of each system.
        score: (M, K) summed statistics -> (M,) the metric over M image sets.
    Returns:
        :class:`Comparison` (``difference`` is B - A).
    """
    observed = score(np.stack([stats_a.sum(axis=0), stats_b.sum(axis=0)]))  # (2,)
    difference = float(observed[1] - observed[0])
    boot = score(counts @ stats_b) - score(counts @ stats_a)  # (R,)
    low, high = np.percentile(boot, [2.5, 97.5])
    extreme = np.count_nonzero(np.abs(boot - difference) >= abs(difference) - _RESOLUTION)
    return Comparison(float(observed[0]), float(observed[1]), difference, float(low), float(high),
                      float((1 + extreme) / (len(boot) + 1)))


def mean_score(images: int) -> Callable[[np.ndarray], np.ndarray]:
    """The score of a per-image-mean metric from its (M, 1) summed per-image values."""
    return lambda sums: sums[:, 0] / images


def paired_bootstrap(per_image_a: Mapping[str, np.ndarray], per_image_b: Mapping[str, np.ndarray],
                     bleu_a: np.ndarray | None = None, bleu_b: np.ndarray | None = None,
                     resamples: int = 1000, seed: int = 0) -> dict[str, Comparison]:
    """Compare two systems on the same N images, metric by metric.

    Args:
        per_image_a, per_image_b: metric -> (N,) per-image scores (same metrics, same image order).
        bleu_a, bleu_b: (N, 10) :func:`bleu_statistics` for corpus BLEU-1..4, or None.
        resamples: bootstrap resamples R.
        seed: seeds the resampling (the result is a function of the inputs and the seed).
    Returns:
        metric -> :class:`Comparison`, BLEU-1..4 first when given.
    """
    images = len(next(iter(per_image_a.values()))) if per_image_a else len(bleu_a)
    counts = resample_counts(images, resamples, seed)
    result: dict[str, Comparison] = {}
    if bleu_a is not None and bleu_b is not None:
        for order in range(1, BLEU_ORDERS + 1):
            result[f"BLEU-{order}"] = compare_statistic(counts, bleu_a, bleu_b,
                                                        lambda sums, n=order: corpus_bleu(sums, n))
    for metric, values in per_image_a.items():
        result[metric] = compare_statistic(counts, np.asarray(values, dtype=np.float64)[:, None],
                                           np.asarray(per_image_b[metric], dtype=np.float64)[:, None],
                                           mean_score(images))
    return result


def comparison_table(comparisons: Mapping[str, Comparison], names: tuple[str, str] = ("A", "B")) -> str:
    """A console table: each metric's two scores, B - A with its 95% interval, and the p-value (x100)."""
    width = max([len("metric"), *map(len, comparisons)])
    header = (f"{'metric':<{width}}  {names[0][:9]:>9}  {names[1][:9]:>9}  {'B - A':>8}  "
              f"{'95% interval':>20}  {'p':>6}")
    lines = [header, "-" * len(header)]
    for metric, c in comparisons.items():
        lines.append(f"{metric:<{width}}  {100 * c.a:9.2f}  {100 * c.b:9.2f}  {100 * c.difference:+8.2f}  "
                     f"[{100 * c.ci_low:+8.2f}, {100 * c.ci_high:+8.2f}]  {c.p_value:6.4f}")
    return "\n".join(lines)
