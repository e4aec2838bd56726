"""Object hallucination: CHAIR (Rohrbach et al., "Object Hallucination in Image Captioning", 2018).

A caption hallucinates an object when it names a category that is not in the image. The objects
in an image are, as in the paper, the categories of its annotated instances together with the
categories its reference captions name. Words are matched to categories by one table: by default
the authors' released table and rules (``released``,
:class:`captioning.evaluation.chair_table.ReleasedChairTable`), which published CHAIR numbers
come from; or this project's extended table (``extended``, :mod:`captioning.evaluation.coco_words`:
more synonyms, phrases before their head nouns), which grounding uses. Either is extended with the
instances file's own category names (Shapes' ``circle``, ``squares``).

Only categories of the instances file count: on COCO the 80 categories, on Shapes its four
shapes, so a Shapes caption saying "man" is not a hallucination of a category Shapes never
annotates.

- CHAIR-i = hallucinated mentions / all mentions of those categories (a category named twice
  counts twice, as in the paper's code);
- CHAIR-s = captions with at least one hallucinated mention / all captions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from captioning.evaluation.chair_table import ReleasedChairTable, chair_table
from captioning.evaluation.coco_words import CategoryWords
from captioning.evaluation.grounding import Instances


@dataclass
class ImageHallucination:
    """What one caption mentions and which of those mentions are not in the image.

    Attributes:
        mentioned: category of each mention, in caption order (repeats kept).
        hallucinated: the mentions (categories, in caption order) of objects not in the image.
    """

    mentioned: list[str] = field(default_factory=list)
    hallucinated: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Per-image fields: ``CHAIR-i`` (None without mentions), ``CHAIR-s`` (0 or 1), ``hallucinated``,
        and ``CHAIR-mentions`` (how many mentions CHAIR-i divides by)."""
        chair_i = len(self.hallucinated) / len(self.mentioned) if self.mentioned else None
        return {
            "CHAIR-i": chair_i,
            "CHAIR-s": float(bool(self.hallucinated)),
            "hallucinated": list(self.hallucinated),
            "CHAIR-mentions": len(self.mentioned),
        }


@dataclass
class Hallucination:
    """CHAIR over a set of captions.

    Attributes:
        per_image: image id -> :class:`ImageHallucination`.
    """

    per_image: dict[int, ImageHallucination]

    def to_json(self) -> dict[str, Any]:
        """``CHAIR-i`` (None when no caption mentions an object), ``CHAIR-s`` and the counts behind them."""
        mentions = sum(len(image.mentioned) for image in self.per_image.values())
        hallucinated = sum(len(image.hallucinated) for image in self.per_image.values())
        captions = sum(bool(image.hallucinated) for image in self.per_image.values())
        return {
            "CHAIR-i": hallucinated / mentions if mentions else None,
            "CHAIR-s": captions / len(self.per_image) if self.per_image else None,
            "CHAIR-mentions": mentions,
            "CHAIR-hallucinated": hallucinated,
        }


def chair_vocabulary(instances: Instances) -> tuple[str, ...]:
    """The categories CHAIR counts: the instances file's categories, else those of its annotations."""
    if instances.categories:
        return instances.categories
    return tuple(sorted({obj.category for objects in instances.objects.values() for obj in objects}))


WordTable = CategoryWords | ReleasedChairTable  # anything with with_categories(names) and mentions(tokens)


def chair(
    captions: Mapping[int, Sequence[str]],
    references: Mapping[int, Sequence[Sequence[str]]],
    instances: Instances,
    table: WordTable | None = None,
) -> Hallucination:
    """CHAIR of tokenised captions.

    Args:
        captions: image id -> the generated caption's lower-case tokens.
        references: image id -> its reference captions' tokens (their mentions are in the image);
            an image may be missing (no references).
        instances: the annotated objects (:func:`captioning.evaluation.grounding.load_instances`).
        table: the words that name each category (the instances file's names are added); None:
            the released table (:func:`captioning.evaluation.chair_table.chair_table`).
    Returns:
        :class:`Hallucination` with one entry per caption.
    Raises:
        ValueError: a caption's image is not in the instances file.
    """
    vocabulary = set(chair_vocabulary(instances))
    words = (chair_table("released") if table is None else table).with_categories(vocabulary)
    per_image: dict[int, ImageHallucination] = {}
    for image_id, tokens in captions.items():
        if image_id not in instances.image_sizes:
            raise ValueError(f"image {image_id!r} is not in the instances file")
        present = {obj.category for obj in instances.objects.get(image_id, [])}
        for reference in references.get(image_id, ()):
            present.update(category for _, category in words.mentions(reference))
        mentioned = [category for _, category in words.mentions(tokens) if category in vocabulary]
        per_image[image_id] = ImageHallucination(mentioned, [c for c in mentioned if c not in present])
    return Hallucination(per_image)


def add_per_image(per_image: list[dict[str, Any]], hallucination: Hallucination) -> list[dict[str, Any]]:
    """The per-image score entries (``{"image_id": ..., ...}``) with each image's CHAIR fields added."""
    return [
        {**entry, **hallucination.per_image[entry["image_id"]].to_json()}
        if entry.get("image_id") in hallucination.per_image
        else entry
        for entry in per_image
    ]


def add_chair(
    scores: dict[str, Any],
    captions: Mapping[int, Sequence[str]],
    references: Mapping[int, Sequence[str]],
    instances: Instances,
    table: WordTable | None = None,
) -> None:
    """Add CHAIR to a scores dict in place: the overall fields, and each ``per_image`` entry's.

    Args:
        scores: the scores JSON being built (with a ``per_image`` list, if any).
        captions: image id -> the generated caption's tokens.
        references: image id -> raw reference captions (tokenised here as the metrics' Python path does).
        instances: the annotated objects.
        table: the words that name each category; None: the released table.
    """
    from captioning.data.tokenizers import tokenize

    result = chair(
        captions, {i: [tokenize(ref) for ref in refs] for i, refs in references.items()}, instances, table
    )
    scores.update(result.to_json())
    if "per_image" in scores:
        scores["per_image"] = add_per_image(scores["per_image"], result)


def chair_line(scores: Mapping[str, Any]) -> str | None:
    """One console line with CHAIR-i and CHAIR-s, or None when they were not computed."""
    if "CHAIR-s" not in scores:
        return None
    if scores["CHAIR-s"] is None:  # no scored image is in the instances files
        return "object hallucination: none of the images has boxes in the instances files"
    chair_i = "n/a" if scores["CHAIR-i"] is None else f"{scores['CHAIR-i']:.4f}"
    return (
        f"object hallucination: CHAIR-i {chair_i}, CHAIR-s {scores['CHAIR-s']:.4f} "
        f"({scores['CHAIR-hallucinated']} of {scores['CHAIR-mentions']} object mentions not in the image)"
    )
