"""The faithfulness study over the training seeds of one configuration (``evaluate.py --aggregate``).

One run's table (``evaluate.py --faithfulness``) says how sure its numbers are over the test images of
that one trained model. Whether attention is more faithful than integrated gradients *for this kind
of model* also depends on the seed it was trained with. Given the tables of k runs that differ only
in the seed (checked by :mod:`captioning.evaluation.aggregate`), over the images every table
explained:

- each method's deletion and insertion area, and its gap to the random order (deletion: random minus
  method; insertion: method minus random), per run the mean over that run's words; over the runs
  their mean, sample standard deviation (n - 1), minimum, maximum and the 95% interval of the mean
  over seeds (Student's t with k - 1 degrees of freedom), as the metrics are aggregated;
- paired tests, on each curve, of every pair of methods and of each method against the random order:
  a bootstrap that draws the images (with their words) and, in the same resample, k runs with
  replacement, the same runs for both methods (both maps are of one trained model:
  :func:`captioning.evaluation.significance.compare_paired_runs`). Its interval therefore holds the
  variance between seeds as well as between images. All tests of the table are adjusted together by
  Holm's method, as in one run's table.

With k runs the seeds' part of the interval rests on k draws: three seeds give a rough interval, and
the page says how many runs it rests on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import t as student_t

from captioning.evaluation.compare import check_bootstrap_fits
from captioning.evaluation.significance import (
    Comparison,
    compare_paired_runs,
    holm,
    ratio_score,
    resample_counts,
)
from captioning.explain.compare import CURVES, check_table, common_images, methods_not_shared
from captioning.explain.statistics import ALPHA, BootstrapSettings, _more_faithful, floor_warning
from captioning.utils.json_files import read_json_file

RANDOM = "random"


def _summary(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Mean, std (n - 1), min, max and the t interval of the mean of per-run values."""
    mean = float(np.mean(values))
    std = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
    half = (
        float(student_t.ppf(0.975, len(values) - 1)) * std / math.sqrt(len(values))
        if len(values) > 1
        else math.nan
    )
    return {
        "mean": mean,
        "std": std,
        "min": float(np.min(values)),
        "max": float(np.max(values)),
        "ci_low": mean - half,
        "ci_high": mean + half,
        "per_run": [float(v) for v in values],
    }


def _statistics(
    rows: Mapping[int, Mapping[str, Any]], images: Sequence[int], name: str, curve: str
) -> np.ndarray:
    """(N, 2) per image: the method's area summed over the image's words, and its words."""
    words = np.array([rows[image].get("words", 1) for image in images], dtype=np.float64)
    areas = np.array([rows[image][name][f"{curve}_auc"] for image in images], dtype=np.float64)
    return np.stack([areas * words, words], axis=1)


def _gap(curve: str, method: np.ndarray, random: np.ndarray) -> np.ndarray:
    """The gap to the random order (positive when the map beats chance)."""
    return random - method if curve == "deletion" else method - random


def seeds_table(tables: Sequence[Mapping[str, Any]], settings: BootstrapSettings | None = None) -> dict:
    """The faithfulness of each method over the runs whose checked tables (one per run, in run order:
    :func:`captioning.explain.compare.check_table`) are ``tables``.

    Returns:
        ``{"runs": k, "images": N, "not_compared": [methods some tables lack], "words": [per run],
        "methods": {name: {"deletion_auc", "insertion_auc", "deletion_gap", "insertion_gap"}}`` (each a
        summary over runs: mean, std, min, max, ci_low, ci_high, per_run; ``random`` has the areas
        only), ``"tests"``: the paired tests (``curve``, ``a``, ``b``, ``a_area``, ``b_area``,
        ``difference`` B - A, ``ci_low``, ``ci_high``, ``p_value``, ``p_holm``, ``more_faithful``; ``b``
        is ``random`` for a method's gap test), ``"settings"``} or ``{}`` when the tables share no
        image or no method.
    """
    settings = settings or BootstrapSettings()
    images = common_images(tables)
    methods = [
        name for name in tables[0].get("methods", {}) if all(name in t.get("methods", {}) for t in tables)
    ]
    if not images or not methods:
        return {}
    rows = [{row["image_id"]: row for row in table["per_image"]} for table in tables]
    stats = {
        name: {curve: [_statistics(run, images, name, curve) for run in rows] for curve in CURVES}
        for name in [*methods, RANDOM]
    }

    def per_run(name: str, curve: str) -> np.ndarray:
        return np.array([s[:, 0].sum() / s[:, 1].sum() for s in stats[name][curve]])

    table: dict[str, Any] = {
        "not_compared": methods_not_shared(tables),  # methods some runs' tables lack
        "runs": len(tables),
        "images": len(images),
        "words": [int(s[:, 1].sum()) for s in stats[RANDOM]["deletion"]],
        "methods": {RANDOM: {f"{c}_auc": _summary(per_run(RANDOM, c)) for c in CURVES}},
    }
    for name in methods:
        table["methods"][name] = {f"{c}_auc": _summary(per_run(name, c)) for c in CURVES}
        for curve in CURVES:
            table["methods"][name][f"{curve}_gap"] = _summary(
                _gap(curve, per_run(name, curve), per_run(RANDOM, curve))
            )
    counts = resample_counts(len(images), settings.resamples, settings.seed)
    tests: list[dict] = []
    comparisons: list[Comparison] = []
    for a, b in [*combinations(methods, 2), *((name, RANDOM) for name in methods)]:
        for curve in CURVES:
            tests.append({"curve": curve, "a": a, "b": b})
            comparisons.append(
                compare_paired_runs(counts, stats[a][curve], stats[b][curve], ratio_score, settings.seed)
            )
    for test, comparison, p_holm in zip(
        tests, comparisons, holm([c.p_value for c in comparisons]), strict=True
    ):
        test.update(
            a_area=comparison.a, b_area=comparison.b, difference=comparison.difference,
            ci_low=comparison.ci_low, ci_high=comparison.ci_high, p_value=comparison.p_value,
            p_holm=p_holm,
            more_faithful=_more_faithful(test["curve"], test["a"], test["b"], comparison.difference, p_holm),
        )  # fmt: skip
    table["tests"] = tests
    table["settings"] = {
        **settings.describe(len(tests)),
        "interval": "95% interval of the mean over runs (Student's t, runs - 1 degrees of freedom)",
        "test": "paired bootstrap over images and runs (the same images and runs drawn for both sides), "
        "two-sided",
        "alpha": ALPHA,
    }
    return table


def seeds_lines(table: Mapping[str, Any]) -> list[str]:
    """The table for the console (areas and gaps x100, as the scores' tables)."""
    if not table:
        return ["faithfulness over seeds: the runs' tables share no image or method"]
    runs, images = table["runs"], table["images"]
    words = ", ".join(map(str, table["words"]))
    lines = [
        f"faithfulness over {runs} seeds, {images} images each (words per run: {words}); "
        "mean over seeds x100 [95% interval over seeds]; deletion: lower is faithful",
    ]
    header = (
        f"{'method':<22}  {'deletion':>22}  {'insertion':>22}  {'deletion gap':>22}  {'insertion gap':>22}"
    )
    lines += [header, "-" * len(header)]

    def cell(summary: Mapping[str, float] | None) -> str:
        if summary is None:
            return f"{'':>22}"
        return (
            f"{100 * summary['mean']:6.1f} [{100 * summary['ci_low']:6.1f}, {100 * summary['ci_high']:6.1f}]"
        )

    for name, row in table["methods"].items():
        cells = [
            cell(row.get(key)) for key in ("deletion_auc", "insertion_auc", "deletion_gap", "insertion_gap")
        ]
        lines.append(f"{name:<22}  " + "  ".join(cells))
    if table.get("not_compared"):
        lines.append(f"not compared (not in every run's table): {', '.join(table['not_compared'])}")
    lines.append("paired tests over images and seeds (B - A x100 [95% interval], p Holm over all tests):")
    settings = table["settings"]
    if warning := floor_warning(settings["tests"], settings["resamples"]):
        lines.append(warning)
    for test in table["tests"]:
        verdict = f"  -> {test['more_faithful']}" if test["more_faithful"] else ""
        lines.append(
            f"  {test['curve']:<9} {test['a']} vs {test['b']}: {100 * test['difference']:+.1f} "
            f"[{100 * test['ci_low']:+.1f}, {100 * test['ci_high']:+.1f}]  p {test['p_value']:.3g}  "
            f"p Holm {test['p_holm']:.3g}{verdict}"
        )
    return lines


def seeds_section(resamples: int, seed: int):
    """``--aggregate``'s faithfulness section: the scores files -> (:func:`seeds_table` or None, lines).

    Every scores file's table is read and checked (:func:`captioning.explain.compare.check_table`);
    when only some runs hold one, none is aggregated and a line says so.
    """
    settings = BootstrapSettings(resamples=resamples, seed=seed)

    def section(paths: Sequence[Path]) -> tuple[dict | None, list[str]]:
        tables = [_table_of(Path(path)) for path in paths]
        if all(table is None for table in tables):
            return None, []
        if any(table is None for table in tables):
            missing = ", ".join(str(p) for p, t in zip(paths, tables, strict=True) if t is None)
            return None, [f"faithfulness over seeds: not aggregated, no table in {missing}"]
        checked = [t for t in tables if t is not None]
        check_bootstrap_fits(settings.resamples, len(common_images(checked)))  # (R, N) drawn at once
        table = seeds_table(checked, settings)
        return table, seeds_lines(table)

    return section


def _table_of(path: Path) -> dict | None:
    scores = read_json_file(path)
    if not isinstance(scores, dict) or "faithfulness" not in scores:
        return None
    return check_table(path, scores["faithfulness"])
