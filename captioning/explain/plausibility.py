"""Plausibility beside faithfulness: do a method's maps land on the objects, and what do they do at
hallucinated words?

- word classes: each word of a caption is an ``object`` word (a category mention of the COCO word
  table, :mod:`captioning.evaluation.coco_words`, with the dataset's own category names), an
  ``attribute`` word (a colour or size, or a value of an attribute the instances file annotates), a
  ``function`` word (articles, prepositions, conjunctions, pronouns, auxiliaries) or ``other``;
- grounding: :func:`captioning.evaluation.grounding.grounding_per_image` on each method's maps (their
  positive part: a cell that lowers the word's probability is no evidence for it), mass in the named
  boxes and the pointing game;
- hallucination: each object mention of a category CHAIR counts, hallucinated when CHAIR finds the
  category neither among the image's annotated objects nor in its reference captions (the released
  table, as :func:`captioning.evaluation.hallucination.chair`), with its map's normalised entropy, peak
  and mass on any annotated object of the image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from captioning.evaluation.chair_table import chair_table
from captioning.evaluation.coco_words import COCO_WORDS
from captioning.evaluation.grounding import (
    Instances,
    WordMatcher,
    box_coverage,
    grounding_per_image,
    image_grounding_json,
    merged_grounding,
)
from captioning.evaluation.hallucination import chair_vocabulary
from captioning.evaluation.pointing import DEFAULT_TOLERANCE
from captioning.utils.shares import positive_shares

FUNCTION_WORDS = frozenset(
    """a an the this that these those some any each every of in on at by for with from to into onto
    over under above below near next behind beside between through across along around up down out off
    and or but nor so as than while its it their his her they he she we you is are was were be been being
    has have had there here who which what where""".split()
)
ATTRIBUTE_WORDS = frozenset(
    """red green blue yellow purple orange pink brown black white gray grey silver gold small large big
    little tall short long old young wooden metal""".split()
)
WORD_CLASSES = ("object", "attribute", "function", "other")


def word_classes(words: Sequence[str], instances: Instances | None = None) -> list[str]:
    """The class of each word (one of :data:`WORD_CLASSES`)."""
    lowered = [word.lower() for word in words]
    categories = chair_vocabulary(instances) if instances is not None else ()
    classes = ["other"] * len(words)
    attributes = set(ATTRIBUTE_WORDS)
    if instances is not None:
        attributes |= {
            str(value).lower()
            for objects in instances.objects.values()
            for obj in objects
            for value in obj.attributes.values()
            if isinstance(value, str)
        }
    for index, word in enumerate(lowered):
        if word in FUNCTION_WORDS:
            classes[index] = "function"
        elif word in attributes:
            classes[index] = "attribute"
    for (start, end), _ in COCO_WORDS.with_categories(categories).mentions(lowered):
        classes[start:end] = ["object"] * (end - start)
    return classes


def normalised(weights: np.ndarray) -> np.ndarray:
    """A map's positive part as shares summing to 1 over all its cells (uniform when nothing is
    positive), in the map's own shape."""
    weights = np.asarray(weights)
    return positive_shares(weights.reshape(-1)).reshape(weights.shape)


def entropy(weights: np.ndarray) -> float:
    """Entropy of the normalised map over its cells, divided by log P: 0 one cell, 1 uniform."""
    shares = normalised(weights).ravel()
    nonzero = shares[shares > 0]
    return float(-(nonzero * np.log(nonzero)).sum() / np.log(shares.size)) if shares.size > 1 else 0.0


@dataclass
class Explained:
    """One image's caption and its maps.

    Attributes:
        image_id: its id in the instances file.
        words: the caption's T words.
        maps: method -> (T, P) maps, row-major cells of ``grid``.
        grid: (gh, gw).
    """

    image_id: int
    words: list[str]
    maps: Mapping[str, np.ndarray]
    grid: tuple[int, int]


def grounding_rows(
    explained: Sequence[Explained], instances: Instances, tolerance: float = DEFAULT_TOLERANCE
) -> dict[str, dict]:
    """Per method: ``mass`` (share of the map's positive part in the named boxes), ``pointing`` (the
    strict rule: the most relevant cell's centre inside a named box; ties share the hit),
    ``pointing_published`` and ``pointing_published_classes`` (Zhang et al. 2016: the upsampled map's
    maximum within ``tolerance`` pixels of a named object's pixels, over mentions and averaged over
    every category of ``instances``, one never named counting 0, as TorchRay averages) and
    ``mentions``, over every object mention of the images in the instances file. The rules are the
    ones :mod:`captioning.evaluation.grounding` and :mod:`~captioning.evaluation.pointing` define,
    so each method's row reads beside the attention scores of ``evaluate.py``."""
    matcher = WordMatcher()
    covered = [item for item in explained if item.image_id in instances.image_sizes]
    methods = list(explained[0].maps) if explained else []
    rows: dict[str, dict] = {}
    for method in methods:
        per_image = grounding_per_image(
            (
                (item.image_id, item.words, np.clip(item.maps[method], 0.0, None), item.grid)
                for item in covered
            ),
            instances,
            matcher,
            tolerance,
        )
        scores = image_grounding_json(
            merged_grounding(per_image), classes=True, categories=instances.categories
        )
        rows[method] = {
            "mass": scores["grounding-mass"],
            "pointing": scores["grounding-pointing"],
            "pointing_published": scores["grounding-pointing-published"],
            "pointing_published_classes": scores["grounding-pointing-published-classes"],
            "mentions": scores["grounding-words"],
        }
    return rows


def mention_rows(
    explained: Sequence[Explained],
    instances: Instances,
    references: Mapping[int, Sequence[Sequence[str]]] | None = None,
) -> list[dict]:
    """One row per object mention CHAIR counts: ``image_id``, ``word`` (index of its last word),
    ``category``, ``hallucinated`` and per method its map's ``entropy``, ``peak`` and ``object_mass``."""
    vocabulary = set(chair_vocabulary(instances))
    table = chair_table("released").with_categories(vocabulary)
    rows = []
    for item in explained:
        if item.image_id not in instances.image_sizes:
            continue
        objects = instances.objects.get(item.image_id, [])
        present = {obj.category for obj in objects}
        for reference in (references or {}).get(item.image_id, ()):
            present.update(category for _, category in table.mentions(reference))
        boxes = [obj.bbox for obj in objects if obj.bbox[2] > 0 and obj.bbox[3] > 0]
        coverage = box_coverage(boxes, instances.image_sizes[item.image_id], item.grid).ravel()
        for (_, end), category in table.mentions([word.lower() for word in item.words]):
            if category not in vocabulary:
                continue
            row: dict = {
                "image_id": item.image_id,
                "word": end - 1,
                "category": category,
                "hallucinated": category not in present,
            }
            for method, maps in item.maps.items():
                shares = normalised(maps[end - 1])
                row[method] = {
                    "entropy": entropy(maps[end - 1]),
                    "peak": float(shares.max()),
                    "object_mass": float((shares * coverage).sum()),
                }
            rows.append(row)
    return rows


def hallucination_summary(rows: Sequence[dict], methods: Sequence[str]) -> dict[str, dict]:
    """Per method, the mean entropy, peak and object mass of hallucinated and of grounded mentions,
    with their counts (None for a group without mentions)."""
    summary: dict[str, dict] = {}
    for method in methods:
        summary[method] = {}
        for group, flag in (("hallucinated", True), ("grounded", False)):
            chosen = [row[method] for row in rows if row["hallucinated"] is flag and method in row]
            summary[method][group] = {
                "mentions": len(chosen),
                **{
                    key: (float(np.mean([value[key] for value in chosen])) if chosen else None)
                    for key in ("entropy", "peak", "object_mass")
                },
            }
    return summary
