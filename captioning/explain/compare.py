"""``evaluate.py --compare A B``: the faithfulness rows of the two systems' scores, paired bootstrap.

When both results files have scores beside them (``x_results.json`` -> ``x_scores.json``) that hold a
faithfulness table (``evaluate.py --faithfulness``), each method's deletion and insertion areas, and
the random control's, are compared over the images both explained: the mean of the per-image areas,
B - A, its 95% interval and p-value from the same paired bootstrap as the metrics
(:func:`captioning.evaluation.significance.group_bootstrap`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    a: Mapping[str, Any], b: Mapping[str, Any], resamples: int, seed: int
) -> tuple[dict[str, Comparison], int]:
    """Each shared method's (and ``random``'s) ``deletion`` and ``insertion`` area, B against A, over
    the images both tables explained: (comparisons, images)."""
    rows_a = {row["image_id"]: row for row in a["per_image"]}
    rows_b = {row["image_id"]: row for row in b["per_image"]}
    common = [image for image in rows_a if image in rows_b]
    if not common:
        return {}, 0
    methods = [name for name in a.get("methods", {}) if name in b.get("methods", {})] + ["random"]

    def columns(rows: Mapping[Any, Mapping[str, Any]]) -> dict[str, np.ndarray]:
        return {
            f"{name} {curve}": np.array([rows[image][name][f"{curve}_auc"] for image in common])
            for name in methods
            for curve in ("deletion", "insertion")
        }

    return group_bootstrap([columns(rows_a)], [columns(rows_b)], resamples=resamples, seed=seed), len(common)
