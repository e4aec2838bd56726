"""``evaluate.py --compare A B`` (or ``--compare A1 A2 ... --against B1 B2 ...``): the faithfulness
rows of the systems' scores, paired bootstrap.

When every results file has scores beside it (``x_results.json`` -> ``x_scores.json``) that hold a
faithfulness table (``evaluate.py --faithfulness``), each method's deletion and insertion areas, and
the random control's, are compared over the images every run explained: the mean of the per-image
areas (averaged over a side's runs), B - A, its 95% interval and p-value from the same paired
bootstrap as the metrics (:func:`captioning.evaluation.significance.group_bootstrap`), which with
several runs a side resamples the runs too (the variance between seeds).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captioning.evaluation.significance import Comparison, group_bootstrap
from captioning.utils.run_folder import scores_path_for


def faithfulness_of(results: Path) -> Mapping[str, Any] | None:
    """The faithfulness table of the scores beside ``results``, or None."""
    path = scores_path_for(results)
    if not path.is_file():
        return None
    try:
        scores = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # not ours to judge here: the metrics' comparison reads the results themselves
    table = scores.get("faithfulness") if isinstance(scores, dict) else None
    return table if isinstance(table, dict) and isinstance(table.get("per_image"), list) else None


def faithfulness_comparison(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], resamples: int, seed: int
) -> tuple[dict[str, Comparison], int]:
    """Each method every table has (and ``random``): its ``deletion`` and ``insertion`` area, B's runs
    against A's (one table per run, at least one a side), over the images every table explained:
    (comparisons, images)."""
    tables = [*a, *b]
    rows = [{row["image_id"]: row for row in table["per_image"]} for table in tables]
    common = [image for image in rows[0] if all(image in other for other in rows[1:])]
    if not common or not a or not b:
        return {}, 0
    methods = [
        name for name in tables[0].get("methods", {}) if all(name in t.get("methods", {}) for t in tables)
    ] + ["random"]

    def columns(run: Mapping[Any, Mapping[str, Any]]) -> dict[str, np.ndarray]:
        return {
            f"{name} {curve}": np.array([run[image][name][f"{curve}_auc"] for image in common])
            for name in methods
            for curve in ("deletion", "insertion")
        }

    runs = [columns(run) for run in rows]
    comparisons = group_bootstrap(runs[: len(a)], runs[len(a) :], resamples=resamples, seed=seed)
    return comparisons, len(common)
