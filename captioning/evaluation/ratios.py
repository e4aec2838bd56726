"""Grounding and CHAIR as ratios of per-image sums, for the bootstrap of ``evaluate.py --compare``.

The scores table reports attention grounding per mention (the mass inside the named object's box,
the pointing game), CHAIR-i per mention and CHAIR-s per image with boxes: each is a sum over
images divided by a count over images. A results file's per-image scores
(``<name>_scores.per_image.json`` beside ``<name>_results.json``, as ``python train.py`` and
``evaluate.py`` write them) hold each image's share, from which these (sum, count) pairs are
rebuilt; or, given instances files, CHAIR is computed again from the captions themselves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captioning.evaluation.attributes import ATTRIBUTE_METRICS, attribute_hallucination
from captioning.evaluation.chair_table import chair_table
from captioning.evaluation.coco_files import EvaluationInputError
from captioning.evaluation.grounding import Instances
from captioning.evaluation.hallucination import chair
from captioning.utils.json_files import read_json_file
from captioning.utils.run_folder import scores_path_for

# metric -> (per-image field that says the image was measured, how to get (sum, count) from an entry)
RATIO_METRICS = (
    "grounding-mass",
    "grounding-pointing",
    "grounding-pointing-published",
    "CHAIR-i",
    "CHAIR-s",
    *ATTRIBUTE_METRICS,
)
_PRESENCE = {
    "grounding-mass": "grounding-words",
    "grounding-pointing": "grounding-words",
    "grounding-pointing-published": "grounding-pointing-published",
    "CHAIR-i": "CHAIR-mentions",
    "CHAIR-s": "CHAIR-s",
    **{metric: count for metric, (_, count) in ATTRIBUTE_METRICS.items()},
}


def _sum_and_count(metric: str, entry: Mapping[str, Any]) -> tuple[float, float]:
    if _PRESENCE[metric] not in entry:
        return 0.0, 0.0
    if metric.startswith("grounding-"):
        words = float(entry["grounding-words"])
        return (float(entry[metric]) * words if words else 0.0), words
    if metric == "CHAIR-i":
        return float(len(entry["hallucinated"])), float(entry["CHAIR-mentions"])
    if metric in ATTRIBUTE_METRICS:
        numerator, count = ATTRIBUTE_METRICS[metric]
        return float(entry[numerator]), float(entry[count])
    return float(entry["CHAIR-s"]), 1.0


def ratio_statistics(
    entries: Sequence[Mapping[str, Any]], image_ids: Sequence[int], where: str = "per-image scores"
) -> dict[str, np.ndarray]:
    """Per-image (sum, count) of each ratio metric that ``entries`` hold.

    Args:
        entries: per-image score entries (``{"image_id": ..., "grounding-words": ..., ...}``).
        image_ids: (N,) the images, in the row order wanted; each must have an entry.
        where: the file the entries came from, for error messages.
    Returns:
        metric -> (N, 2) float64, for each metric of ``RATIO_METRICS`` that at least one entry holds.
    Raises:
        EvaluationInputError: an image without an entry, or an entry whose fields are malformed.
    """
    by_id = {entry.get("image_id"): entry for entry in entries if isinstance(entry, Mapping)}
    missing = [image_id for image_id in image_ids if image_id not in by_id]
    if missing:
        raise EvaluationInputError(
            f"{where}: image_id {missing[0]}: no per-image scores (they belong to other results)"
        )
    result = {}
    for metric in RATIO_METRICS:
        if not any(_PRESENCE[metric] in by_id[image_id] for image_id in image_ids):
            continue
        rows = np.zeros((len(image_ids), 2))
        for row, image_id in enumerate(image_ids):
            try:
                rows[row] = _sum_and_count(metric, by_id[image_id])
            except (TypeError, ValueError, KeyError) as error:
                raise EvaluationInputError(
                    f"{where}: image_id {image_id}: {metric}: malformed ({error})"
                ) from None
        result[metric] = rows
    return result


# The published pointing game's mean over the classes mentioned: per image, each class's (hits,
# mentions). The mean over every category of the dataset is not rebuilt (the category list is not in
# a scores file).
CLASS_MEAN = "grounding-pointing-published-mentioned-classes"


def class_statistics(
    entries: Sequence[Mapping[str, Any]], image_ids: Sequence[int], where: str
) -> dict[str, np.ndarray]:
    """Per-image (published hits, mentions) of each class, from the entries' ``grounding-classes``.

    Returns:
        class -> (N, 2) float64 in the order of ``image_ids``; {} when no entry holds classes (scores
        written before the published pointing game).
    Raises:
        EvaluationInputError: an entry's ``grounding-classes`` is not ``{class: [hits, mentions]}``.
    """
    by_id = {entry.get("image_id"): entry for entry in entries if isinstance(entry, Mapping)}
    result: dict[str, np.ndarray] = {}
    for row, image_id in enumerate(image_ids):
        classes = by_id.get(image_id, {}).get("grounding-classes")
        if classes is None:
            continue
        try:
            for name, (hits, mentions) in classes.items():
                result.setdefault(str(name), np.zeros((len(image_ids), 2)))[row] = (
                    float(hits),
                    float(mentions),
                )
        except (AttributeError, TypeError, ValueError) as error:
            raise EvaluationInputError(
                f"{where}: image_id {image_id}: grounding-classes: malformed ({error})"
            ) from None
    return result


def aligned_classes(runs: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
    """The runs' class statistics over one class list (the union, sorted): (N, 2K) per run, the columns
    (hits, mentions) of each class in turn; [] when a run has none."""
    if not runs or not all(runs):
        return []
    names = sorted(set().union(*runs))
    images = len(next(iter(runs[0].values())))
    return [np.concatenate([run.get(name, np.zeros((images, 2))) for name in names], axis=1) for run in runs]


def per_image_scores_of(results: str | Path) -> Path:
    """Where the per-image scores of a results file are: ``x_results.json`` -> ``x_scores.per_image.json``."""
    scores = scores_path_for(results)
    return scores.with_name(scores.stem + ".per_image.json")


def read_ratio_statistics(
    results: str | Path, image_ids: Sequence[int]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """:func:`ratio_statistics` and :func:`class_statistics` from the per-image scores beside a results
    file; ({}, {}) when there are none.

    Raises:
        EvaluationInputError: the file is there but is not a JSON list of entries for these images.
    """
    path = per_image_scores_of(results)
    if not path.is_file():
        return {}, {}
    try:
        entries = read_json_file(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EvaluationInputError(f"{path}: not a readable per-image scores file ({error})") from None
    if not isinstance(entries, list):
        raise EvaluationInputError(
            f"{path}: expected a list of per-image scores, got {type(entries).__name__}"
        )
    return ratio_statistics(entries, image_ids, str(path)), class_statistics(entries, image_ids, str(path))


def chair_statistics(
    captions: Mapping[int, Sequence[str]],
    references: Mapping[int, Sequence[Sequence[str]]],
    instances: Instances,
    image_ids: Sequence[int],
    table: str = "released",
) -> dict[str, np.ndarray]:
    """CHAIR-i and CHAIR-s (sum, count) per image, computed from tokenised captions (images the
    instances do not cover count nothing), and the attribute metrics where the instances annotate
    attributes (:mod:`captioning.evaluation.attributes`).

    Args:
        captions: image id -> the caption's tokens.
        references: image id -> its references' tokens.
        instances: the boxes (:func:`captioning.evaluation.runner.load_boxes`).
        image_ids: (N,) the images, in row order.
        table: CHAIR's word table (:data:`captioning.config.CHAIR_TABLES`).
    Returns:
        ``{"CHAIR-i": (N, 2), "CHAIR-s": (N, 2)}``, and ``"attribute-precision"``, ``"attribute-recall"``
        and ``"attribute-wrong"`` (N, 2) with attribute annotations.
    """
    covered = {i: captions[i] for i in image_ids if i in instances.image_sizes}
    words = chair_table(table)
    result = chair(covered, references, instances, words)
    attributes = attribute_hallucination(covered, instances, words)
    entries = []
    for i in image_ids:
        entry: dict[str, Any] = {"image_id": i}
        if i in result.per_image:
            entry.update(result.per_image[i].to_json())
        if attributes is not None and i in attributes.per_image:
            entry.update(attributes.per_image[i].to_json())
        entries.append(entry)
    return {
        metric: rows
        for metric, rows in ratio_statistics(entries, image_ids).items()
        if metric.startswith(("CHAIR", "attribute-"))
    }
