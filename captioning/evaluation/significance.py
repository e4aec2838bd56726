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

With the bootstrap differences d*_r (B minus A) and the observed difference d, the two-sided p-value
is the share of resamples whose difference, centred on d, is at least as far from 0 as d:
``(1 + #{|d*_r - d| >= |d|}) / (R + 1)`` (Berg-Kirkpatrick et al., 2012; Koehn, 2004), and the 95%
interval is that test's: d +- the 95th percentile of |d*_r - d|, so that 0 lies outside it exactly
when p < 0.05 (a percentile interval of d* beside this p-value can disagree with it on a skewed
bootstrap). Differences under 1e-9 count as none (p = 1).

Ratio metrics (attention grounding's mass and pointing game per mention, CHAIR-i per mention,
CHAIR-s per image with boxes) are recomputed on each resample from per-image sums and counts, as
BLEU is: every mention weighs the same, as in the scores table.

Several metrics tested at once: ``p_holm`` is each p-value adjusted by Holm's step-down method
(Holm, 1979), which keeps the chance of any false "significant" below 5% whatever the metrics'
dependence (BLEU-1..4 share their n-grams, so it is conservative there).

Seeds against seeds: with k runs of A and k' runs of B (same images), each resample draws the
images (shared by every run) and, independently, k runs of A and k' runs of B with replacement;
the statistic is the mean score of the drawn B runs minus that of the drawn A runs. Its interval
therefore holds the variance between seeds as well as between images (a two-level bootstrap);
with one run each it is the paired bootstrap above.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

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
    p_holm: float | None = None

    def to_json(self) -> dict[str, float]:
        """The fields as a dict."""
        return asdict(self)


def bleu_statistics(
    gts: Mapping[int, Sequence[str]], res: Mapping[int, Sequence[str]], image_ids: Sequence[int]
) -> np.ndarray:
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
    # (R, n): smoothed n-gram precisions of each resample
    precisions = (sums[:, _CORRECT : _CORRECT + order] + _TINY) / (sums[:, _GUESS : _GUESS + order] + _SMALL)
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


def run_draws(runs: int, resamples: int, seed: int, group: int) -> np.ndarray:
    """(R, runs) indices of the runs drawn, with replacement, in each resample of one group of runs.

    Drawn from their own generator (``seed``, ``group``), so that the images' resampling is the
    same whatever the number of runs; one run is always drawn as itself.
    """
    return np.random.default_rng([seed, group + 1]).integers(0, runs, size=(resamples, runs))


def compare_groups(
    counts: np.ndarray,
    stats_a: Sequence[np.ndarray],
    stats_b: Sequence[np.ndarray],
    score: Callable[[np.ndarray], np.ndarray],
    seed: int = 0,
) -> Comparison:
    """Bootstrap of one metric between k runs of A and k' runs of B on the same N images.

    Args:
        counts: (R, N) :func:`resample_counts`, shared by every run.
        stats_a, stats_b: k and k' arrays (N, K) of per-image statistics, one per run.
        score: (M, K) summed statistics -> (M,) the metric over M image sets (NaN where undefined,
            e.g. a ratio whose resample holds no mention; such resamples are left out).
        seed: seeds the draws of runs (see the module docstring).
    Returns:
        :class:`Comparison`: ``a``, ``b`` the mean score of each group's runs; ``difference`` B - A;
        the interval and p-value from resamples of images and runs together.
    """
    sides = []
    for group, runs in enumerate((stats_a, stats_b)):
        observed = score(np.stack([stats.sum(axis=0) for stats in runs]))  # (k,) each run's score
        boot = np.stack([score(counts @ stats) for stats in runs], axis=1)  # (R, k)
        drawn = run_draws(len(runs), len(counts), seed, group)  # (R, k)
        sides.append((float(np.mean(observed)), np.take_along_axis(boot, drawn, axis=1).mean(axis=1)))  # (R,)
    (score_a, boot_a), (score_b, boot_b) = sides
    return bootstrap_comparison(score_a, score_b, boot_b - boot_a)


def compare_paired_runs(
    counts: np.ndarray,
    stats_a: Sequence[np.ndarray],
    stats_b: Sequence[np.ndarray],
    score: Callable[[np.ndarray], np.ndarray],
    seed: int = 0,
) -> Comparison:
    """Bootstrap of B - A where run i of A and run i of B are one run measured two ways (two maps of
    one trained model): each resample draws the images (``counts``, shared) and k runs with
    replacement, the same k runs for both sides, so the runs' variance enters the interval and the
    pairing is kept.

    Args:
        counts: (R, N) :func:`resample_counts`; stats_a, stats_b: k arrays (N, K) each, in run order.
        score: as for :func:`compare_groups`; seed: seeds the draws of runs.
    Returns:
        :class:`Comparison` of the mean over runs of each side's score.
    """
    if len(stats_a) != len(stats_b) or not stats_a:
        raise ValueError("paired runs need the same runs, one or more, on both sides")
    observed_a = score(np.stack([stats.sum(axis=0) for stats in stats_a]))  # (k,)
    observed_b = score(np.stack([stats.sum(axis=0) for stats in stats_b]))
    per_run = np.stack(
        [score(counts @ b) - score(counts @ a) for a, b in zip(stats_a, stats_b, strict=True)], axis=1
    )  # (R, k)
    drawn = run_draws(len(stats_a), len(counts), seed, 0)
    boot = np.take_along_axis(per_run, drawn, axis=1).mean(axis=1)
    return bootstrap_comparison(float(np.mean(observed_a)), float(np.mean(observed_b)), boot)


def bootstrap_comparison(score_a: float, score_b: float, boot: np.ndarray) -> Comparison:
    """The comparison of ``score_b - score_a`` given its (R,) bootstrap differences ``boot``."""
    difference = score_b - score_a
    boot = boot[np.isfinite(boot)]
    if not np.isfinite(difference) or len(boot) == 0:
        nan = float("nan")
        return Comparison(score_a, score_b, difference, nan, nan, nan)
    # The interval of the same test as the p-value: d +- the 95th percentile of |d* - d| (0 lies outside
    # it exactly when p < 0.05, up to the resamples' granularity); a percentile interval of d* beside a
    # shifted-null p-value could exclude 0 with p = 0.09 on a skewed bootstrap.
    half = float(np.percentile(np.abs(boot - difference), 95))
    low, high = difference - half, difference + half
    extreme = np.count_nonzero(np.abs(boot - difference) >= abs(difference) - _RESOLUTION)
    return Comparison(
        score_a, score_b, difference, float(low), float(high), float((1 + extreme) / (len(boot) + 1))
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of m p-values tested together (NaN stays NaN and is not counted).

    The i-th smallest of the m p-values is multiplied by m - i + 1 (i from 1), then made
    non-decreasing in that order and capped at 1: reject where the adjusted value is below 0.05.

    Args:
        p_values: (m,) p-values.
    Returns:
        (m,) adjusted p-values, in the input order.
    """
    values = np.asarray(p_values, dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(values))
    adjusted = np.full(len(values), np.nan)
    order = finite[np.argsort(values[finite], kind="stable")]
    scaled = values[order] * (len(order) - np.arange(len(order)))
    adjusted[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return adjusted.tolist()


def ratio_score(sums: np.ndarray) -> np.ndarray:
    """(M, 2) summed (numerator, count) -> (M,) their ratio, NaN where the count is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sums[:, 1] > 0, sums[:, 0] / np.where(sums[:, 1] > 0, sums[:, 1], 1.0), np.nan)


def class_mean_score(sums: np.ndarray) -> np.ndarray:
    """(M, 2K) summed (hits, mentions) of K classes -> (M,) the mean over the classes with mentions of
    each class's hit rate (NaN where no class has one): the published pointing game's class mean."""
    pairs = sums.reshape(len(sums), -1, 2)  # (M, K, 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(
            pairs[..., 1] > 0, pairs[..., 0] / np.where(pairs[..., 1] > 0, pairs[..., 1], 1.0), np.nan
        )
        counted = np.isfinite(rates).sum(axis=1)  # (M,)
        return np.where(counted > 0, np.nansum(rates, axis=1) / np.maximum(counted, 1), np.nan)


def mean_score(images: int) -> Callable[[np.ndarray], np.ndarray]:
    """The score of a per-image-mean metric from its (M, 1) summed per-image values."""
    return lambda sums: sums[:, 0] / images


def group_bootstrap(
    per_image_a: Sequence[Mapping[str, np.ndarray]],
    per_image_b: Sequence[Mapping[str, np.ndarray]],
    bleu_a: Sequence[np.ndarray] | None = None,
    bleu_b: Sequence[np.ndarray] | None = None,
    resamples: int = 1000,
    seed: int = 0,
    ratios_a: Sequence[Mapping[str, np.ndarray]] | None = None,
    ratios_b: Sequence[Mapping[str, np.ndarray]] | None = None,
    ratio_scores: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None,
) -> dict[str, Comparison]:
    """Compare k runs of A with k' runs of B on the same N images (see the module docstring).

    Args:
        per_image_a, per_image_b: one mapping per run, metric -> (N,) per-image scores (same
            metrics, same image order; the metrics of the first run of A are compared).
        bleu_a, bleu_b: one (N, 10) array per run, or None.
        ratios_a, ratios_b: one mapping per run, metric -> (N, 2) (sum, count), or None.
        ratio_scores: metric -> its score of summed statistics, for ratio metrics that are not one
            sum over one count (:func:`class_mean_score`); :func:`ratio_score` for the others.
    Returns:
        metric -> :class:`Comparison` (group means, B - A, interval, p-value, Holm-adjusted p-value).
    """
    first = per_image_a[0]
    if first:
        images = len(next(iter(first.values())))
    elif bleu_a:
        images = len(bleu_a[0])
    else:
        raise ValueError("nothing to compare: no per-image scores and no BLEU statistics")
    counts = resample_counts(images, resamples, seed)
    result: dict[str, Comparison] = {}

    def column(values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).reshape(images, -1)  # (N, K)

    if bleu_a is not None and bleu_b is not None:
        for order in range(1, BLEU_ORDERS + 1):
            result[f"BLEU-{order}"] = compare_groups(
                counts, bleu_a, bleu_b, functools.partial(corpus_bleu, order=order), seed
            )
    for metric in first:
        result[metric] = compare_groups(
            counts,
            [column(run[metric]) for run in per_image_a],
            [column(run[metric]) for run in per_image_b],
            mean_score(images),
            seed,
        )
    if ratios_a and ratios_b:
        for metric in ratios_a[0]:
            result[metric] = compare_groups(
                counts,
                [column(run[metric]) for run in ratios_a],
                [column(run[metric]) for run in ratios_b],
                (ratio_scores or {}).get(metric, ratio_score),
                seed,
            )
    # A metric undefined on either side (grounding without boxes) is no test: left out, and not
    # counted in Holm's adjustment.
    result = {metric: c for metric, c in result.items() if np.isfinite(c.difference)}
    adjusted = holm([c.p_value for c in result.values()])
    return {metric: replace(c, p_holm=p) for (metric, c), p in zip(result.items(), adjusted, strict=True)}


# Rows whose numbers are not those of the scores table, said in the row's name.
_LABELS = {"METEOR": "METEOR (mean/img)"}


def comparison_table(comparisons: Mapping[str, Comparison], names: tuple[str, str] = ("A", "B")) -> str:
    """A console table: each metric's two scores, B - A with its 95% interval, the p-value and the
    Holm-adjusted p-value (scores x100; columns as wide as the names). The interval is the p-value's
    own test's; METEOR is the mean of per-image scores (the scores table's pools its statistics)."""
    width = max([len("metric"), *(len(_LABELS.get(m, m)) for m in comparisons)])
    a_width, b_width = (max(9, len(name)) for name in names)
    header = (
        f"{'metric':<{width}}  {names[0]:>{a_width}}  {names[1]:>{b_width}}  {'B - A':>8}  "
        f"{'95% interval':>20}  {'p':>6}  {'p Holm':>6}"
    )
    lines = [header, "-" * len(header)]
    for metric, c in comparisons.items():
        holm_text = "" if c.p_holm is None else f"{c.p_holm:6.4f}"
        lines.append(
            f"{_LABELS.get(metric, metric):<{width}}  {100 * c.a:{a_width}.2f}  {100 * c.b:{b_width}.2f}  "
            f"{100 * c.difference:+8.2f}  [{100 * c.ci_low:+8.2f}, {100 * c.ci_high:+8.2f}]  "
            f"{c.p_value:6.4f}  {holm_text:>6}"
        )
    return "\n".join(lines)
