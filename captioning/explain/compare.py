"""``evaluate.py --compare A B`` (or ``--compare A1 A2 ... --against B1 B2 ...``): the faithfulness
rows of the systems' scores, paired bootstrap.

When every results file has scores beside it (``x_results.json`` -> ``x_scores.json``) that hold a
faithfulness table (``evaluate.py --faithfulness``), each method's deletion and insertion areas, and
the random control's, are compared over the images every run explained: the mean over their words
(each image's per-image area weighted by its number of words, ``words``; 1 when a row does not say),
averaged over a side's runs, B - A, its 95% interval and p-value from the same paired bootstrap as
the metrics (:func:`captioning.evaluation.significance.compare_groups`: the images in id order,
resampled with their words, and with several runs a side the runs too: the variance between seeds);
the p-values are adjusted together by Holm's method.

Every table is read with the project's JSON reader and its shape checked (:func:`check_table`) before
any caption is scored: a malformed one is refused in one line naming the file and the entry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from captioning.config.decode import MAX_DECODE_LENGTH
from captioning.evaluation.coco_files import EvaluationInputError
from captioning.evaluation.compare import check_bootstrap_fits
from captioning.evaluation.significance import Comparison, compare_groups, holm, ratio_score, resample_counts
from captioning.utils.json_files import read_json_file
from captioning.utils.run_folder import scores_path_for

CURVES = ("deletion", "insertion")
MAX_WORDS = MAX_DECODE_LENGTH  # a row's explained words: one caption's, at most decode.max_length


def _refuse(path: Path, entry: str, value: Any, what: str) -> EvaluationInputError:
    return EvaluationInputError(f"{path}: faithfulness{entry}: {value!r:.60} {what}")


def _area(path: Path, entry: str, row: Mapping[str, Any], key: str) -> None:
    if key not in row:
        raise _refuse(path, entry, key, "missing (each method's entry holds deletion_auc and insertion_auc)")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _refuse(path, f"{entry}.{key}", value, "is not a finite number")
    if not 0 <= value <= 1:
        raise _refuse(path, f"{entry}.{key}", value, "is not an area in [0, 1] (a curve of probabilities)")


def check_table(path: Path, table: Any) -> dict:
    """``table``, the ``faithfulness`` of the scores file ``path``, when it has the shape the comparison
    reads: ``methods`` an object, ``per_image`` a list of objects each with an integer ``image_id``
    (once), an optional positive integer ``words``, and for every method and ``random`` an object of
    finite ``deletion_auc`` and ``insertion_auc``.

    Raises:
        EvaluationInputError: one line naming the file and the first entry that breaks the shape.
    """
    if not isinstance(table, dict):
        raise _refuse(path, "", type(table).__name__, "is not an object")
    methods = table.get("methods", {})
    if not isinstance(methods, dict):
        raise _refuse(path, ".methods", methods, "is not an object of methods")
    rows = table.get("per_image")
    if not isinstance(rows, list):
        raise _refuse(path, ".per_image", rows, "is not a list of per-image rows")
    seen: set[int] = set()
    for index, row in enumerate(rows):
        entry = f".per_image[{index}]"
        if not isinstance(row, dict):
            raise _refuse(path, entry, row, "is not an object")
        image_id = row.get("image_id")
        if isinstance(image_id, bool) or not isinstance(image_id, int):
            raise _refuse(path, f"{entry}.image_id", image_id, "is not an integer image id")
        if image_id in seen:
            raise _refuse(path, f"{entry}.image_id", image_id, "is given twice")
        seen.add(image_id)
        words = row.get("words", 1)
        if isinstance(words, bool) or not isinstance(words, int) or not 1 <= words <= MAX_WORDS:
            raise _refuse(
                path, f"{entry}.words", words, f"is not a number of words in [1, {MAX_WORDS}] (a caption's)"
            )
        for name in [*methods, "random"]:
            areas = row.get(name)
            if not isinstance(areas, dict):
                raise _refuse(path, f"{entry}.{name}", areas, "is not an object of areas")
            for curve in CURVES:
                _area(path, f"{entry}.{name}", areas, f"{curve}_auc")
    return table


def faithfulness_of(results: Path) -> dict | None:
    """The faithfulness table of the scores beside ``results`` (checked: :func:`check_table`), or None
    when there are no such scores or they hold no table.

    Raises:
        JsonError: the scores are not JSON or pass a bound of the project's reader (one line).
        EvaluationInputError: the scores or their table are not of the shape the comparison reads.
    """
    path = scores_path_for(results)
    if not path.is_file():
        return None
    scores = read_json_file(path)
    if not isinstance(scores, dict):
        raise EvaluationInputError(f"{path}: {type(scores).__name__}, not a scores object")
    if "faithfulness" not in scores:
        return None
    return check_table(path, scores["faithfulness"])


def common_images(tables: Sequence[Mapping[str, Any]]) -> list[int]:
    """The image ids every table's ``per_image`` rows hold, in id order."""
    ids = [{row["image_id"] for row in table["per_image"]} for table in tables]
    return sorted(set.intersection(*ids)) if ids else []


def methods_not_shared(tables: Sequence[Mapping[str, Any]]) -> list[str]:
    """The methods some tables hold and others do not (not compared), in the order first met."""
    held = [set(table.get("methods", {})) for table in tables]
    every = set.intersection(*held) if held else set()
    met = dict.fromkeys(name for table in tables for name in table.get("methods", {}))
    return [name for name in met if name not in every]


def check_comparable(
    a: Sequence[Mapping[str, Any] | None],
    b: Sequence[Mapping[str, Any] | None],
    results: Sequence[Path],
    resamples: int,
) -> None:
    """Before any caption is scored: when every run's scores hold a table (``a`` and ``b`` from
    :func:`faithfulness_of`, None for a run without one; ``results`` the runs' files in the same
    order), the tables share an image, and the bootstrap's (R, N) draws over the shared images fit.

    Raises:
        EvaluationInputError: the first table that holds no image, or none of the images of the runs
            before it (naming its file); ``resamples`` draws that do not fit in memory.
    """
    tables = [*a, *b]
    if not tables or any(table is None for table in tables):
        return  # not compared (a run has no table): said where the rows are printed
    shared: set[int] | None = None
    for path, table in zip(results, tables, strict=True):
        assert table is not None
        ids = {row["image_id"] for row in table["per_image"]}
        shared = ids if shared is None else shared & ids
        if not shared:
            what = "holds no image" if not ids else "shares no image with the runs before it"
            raise EvaluationInputError(
                f"{scores_path_for(path)}: faithfulness.per_image {what}: the maps cannot be compared"
            )
    check_bootstrap_fits(resamples, len(shared or ()))


def faithfulness_comparison(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], resamples: int, seed: int
) -> tuple[dict[str, Comparison], int]:
    """Each method every table has (and ``random``): its ``deletion`` and ``insertion`` area, B's runs
    against A's (one table per run, at least one a side, each checked by :func:`check_table`), over the
    images every table explained: (comparisons, images)."""
    tables = [*a, *b]
    rows = [{row["image_id"]: row for row in table["per_image"]} for table in tables]
    common = common_images(tables)
    if not common or not a or not b:
        return {}, 0
    methods = [
        name for name in tables[0].get("methods", {}) if all(name in t.get("methods", {}) for t in tables)
    ] + ["random"]
    counts = resample_counts(len(common), resamples, seed)  # (R, N) shared by every run and row

    def statistics(run: Mapping[Any, Mapping[str, Any]], name: str, curve: str) -> np.ndarray:
        """(N, 2) per image: its area summed over its words, and its words."""
        words = np.array([run[image].get("words", 1) for image in common], dtype=np.float64)
        areas = np.array([run[image][name][f"{curve}_auc"] for image in common], dtype=np.float64)
        return np.stack([areas * words, words], axis=1)

    comparisons = {}
    for name in methods:
        for curve in CURVES:
            sides = [
                [statistics(run, name, curve) for run in side] for side in (rows[: len(a)], rows[len(a) :])
            ]
            comparisons[f"{name} {curve}"] = compare_groups(counts, sides[0], sides[1], ratio_score, seed)
    adjusted = holm([c.p_value for c in comparisons.values()])
    adjusted_rows = {
        key: replace(c, p_holm=p) for (key, c), p in zip(comparisons.items(), adjusted, strict=True)
    }
    return adjusted_rows, len(common)
