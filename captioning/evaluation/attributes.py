"""Attribute hallucination: the colour, size (or any other attribute) a caption gives an object.

CHAIR (:mod:`captioning.evaluation.hallucination`) asks only whether a named category is in the
image, so on Shapes "a small red square" for a large green square scores as correct. When the
instances file annotates attributes of its objects (Shapes writes ``"color"`` and ``"size"`` beside
each box), each *attribute phrase* of a caption is checked against the image's objects as well:

- a phrase is a category mention (the CHAIR table's words) with the attribute words directly before
  it, "a small red square" -> ``square`` with ``size=small, color=red``; a mention with no attribute
  word before it is no phrase (CHAIR judges it). Only attributive phrases are read: "the square is
  red" gives no phrase, as its colour does not precede the noun;
- an attribute word is a value some object of the file has for a text-valued annotation field other
  than COCO's own (``id``, ``bbox``, ``area``, ...); a word that is a value of several fields may
  stand for any of them;
- a phrase is *correct* when some object of its image has its category and every attribute it
  names; otherwise it is *wrong* (a wrong colour, a wrong size, or a category not in the image);
- an object is *recalled* when a correct phrase of the caption describes it.

Three numbers, each a ratio of per-image sums (so ``evaluate.py --compare`` resamples them):

- ``attribute-precision`` = correct phrases / phrases;
- ``attribute-recall`` = recalled objects / objects (of the images with attribute annotations);
- ``attribute-wrong`` = captions with at least one wrong phrase / captions.

The numbers above judge each phrase on its own, so "a large red circle and a large red circle" for
one circle is two correct phrases. One-to-one matching counts what they cannot: every *mention* (a
category word CHAIR counts, with the attribute words before it, maybe none) is matched to at most one
object and every object to at most one mention that describes it (a maximum bipartite matching), and a
mention left over is one of

- ``duplicate``: every object it could name is named by another mention (the one circle above, named
  twice);
- ``misdescribed``: an object of its category is left over that it does not describe ("a small red
  square and a small red square" for a red and a green one: the second misdescribes the green one);
- ``absent``: no object of its category is in the image (a CHAIR hallucination, against the boxes).

- ``attribute-wrong-one-to-one`` = captions with a mention left over / captions, beside
  ``attribute-wrong``; with the counts ``attribute-mentions``, ``attribute-matched`` and
  ``attribute-unmatched-duplicate``/``-misdescribed``/``-absent``.

The numbers are computed only when the instances file has attribute annotations; COCO's have none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_bipartite_matching

from captioning.evaluation.grounding import Instances, ObjectBox
from captioning.evaluation.hallucination import WordTable, chair_vocabulary

# metric -> (per-image numerator field, per-image count field)
ATTRIBUTE_METRICS = {
    "attribute-precision": ("attribute-correct", "attribute-phrases"),
    "attribute-recall": ("attribute-recalled", "attribute-objects"),
    "attribute-wrong": ("attribute-wrong-caption", "attribute-captions"),
    "attribute-wrong-one-to-one": ("attribute-wrong-one-to-one-caption", "attribute-captions"),
}
UNMATCHED_REASONS = ("duplicate", "misdescribed", "absent")
ATTRIBUTE_COUNTS = (
    "attribute-phrases",
    "attribute-correct",
    "attribute-objects",
    "attribute-recalled",
    "attribute-wrong-captions",
    "attribute-images",
    "attribute-mentions",
    "attribute-matched",
    "attribute-wrong-one-to-one-captions",
    *(f"attribute-unmatched-{reason}" for reason in UNMATCHED_REASONS),
)


def attribute_words(instances: Instances) -> dict[str, frozenset[str]]:
    """Attribute word -> the annotation fields it is a value of (``{"red": {"color"}, "small": {"size"}}``):
    the one-word, lower-case text values of the objects' extra fields."""
    words: dict[str, set[str]] = {}
    for objects in instances.objects.values():
        for obj in objects:
            for key, value in obj.attributes.items():
                if isinstance(value, str) and value.strip() and len(value.split()) == 1:
                    words.setdefault(value.strip().lower(), set()).add(key)
    return {word: frozenset(keys) for word, keys in words.items()}


@dataclass(frozen=True)
class Phrase:
    """One attribute phrase: its category, and each attribute word with the fields it may stand for."""

    category: str
    attributes: tuple[tuple[str, frozenset[str]], ...]

    @property
    def text(self) -> str:
        return " ".join([*(word for word, _ in self.attributes), self.category])

    def describes(self, obj: ObjectBox) -> bool:
        """The object has this category and, for every attribute word, one of its fields has that value."""
        if obj.category != self.category:
            return False
        values = {
            key: str(value).strip().lower() for key, value in obj.attributes.items() if isinstance(value, str)
        }
        return all(any(values.get(key) == word for key in keys) for word, keys in self.attributes)


def attribute_phrases(
    tokens: Sequence[str],
    table: WordTable,
    words: Mapping[str, frozenset[str]],
    vocabulary: set[str],
    bare: bool = False,
) -> list[Phrase]:
    """The attribute phrases of one tokenised caption, in caption order.

    Args:
        tokens: the caption's tokens.
        table: the CHAIR word table, already extended with the instances' category names.
        words: :func:`attribute_words` of the instances.
        vocabulary: the categories counted (:func:`chair_vocabulary`).
        bare: also every mention without attribute words (a phrase naming none): all the mentions.
    """
    lowered = [token.lower() for token in tokens]
    phrases = []
    end_of_previous = 0
    for (start, end), category in table.mentions(tokens):
        if category not in vocabulary:
            continue
        first = start
        while first > end_of_previous and lowered[first - 1] in words:
            first -= 1
        if first < start or bare:
            phrases.append(Phrase(category, tuple((w, words[w]) for w in lowered[first:start])))
        end_of_previous = end
    return phrases


def match_one_to_one(mentions: Sequence[Phrase], objects: Sequence[ObjectBox]) -> list[str | None]:
    """Each mention's fate under a one-to-one matching of mentions to the objects they describe.

    Equal mentions (the same words) describe the same objects, so each distinct mention is judged
    against the objects once, and only as many of its copies as it describes objects enter the
    matching (the first ones, in caption order): no matching gives the others an object. The cost is
    bounded by distinct mentions x objects, whatever the caption repeats.

    Args:
        mentions: one caption's mentions (:func:`attribute_phrases` with ``bare``), in caption order.
        objects: its image's objects.
    Returns:
        Per mention: None when the maximum bipartite matching gives it an object, else why it is left
        over (one of :data:`UNMATCHED_REASONS`, see the module).
    """
    if not mentions:
        return []
    copies: dict[Phrase, list[int]] = {}  # distinct mention -> its positions in the caption
    for index, mention in enumerate(mentions):
        copies.setdefault(mention, []).append(index)
    fits = {mention: np.array([mention.describes(obj) for obj in objects], dtype=bool) for mention in copies}
    rows = [index for mention, where in copies.items() for index in where[: int(fits[mention].sum())]]
    matched_object = np.full(len(mentions), -1)  # (M,): the object each mention gets, -1 for none
    if rows:
        graph = np.stack([fits[mentions[index]] for index in rows]).astype(np.int8)  # (R, O)
        matched_object[rows] = maximum_bipartite_matching(csr_array(graph), perm_type="column")
    taken = set(int(index) for index in matched_object if index >= 0)
    left_over: dict[str, bool | None] = {}  # category -> an object of it left unmatched (None: none at all)
    for category in {mention.category for mention in mentions}:
        same_class = [k for k, obj in enumerate(objects) if obj.category == category]
        left_over[category] = any(k not in taken for k in same_class) if same_class else None
    fates: list[str | None] = []
    for mention, index in zip(mentions, matched_object, strict=True):
        free = left_over[mention.category]
        fates.append(
            None if index >= 0 else "absent" if free is None else "misdescribed" if free else "duplicate"
        )
    return fates


@dataclass
class ImageAttributes:
    """One caption's attribute phrases judged against its image's objects.

    Attributes:
        phrases: every attribute phrase, in caption order.
        wrong: the phrases no object of the image fits (their text).
        objects: the image's objects that have attribute annotations.
        recalled: how many of them a correct phrase describes.
        mentions: how many category mentions the caption makes (with or without attribute words).
        unmatched: ``(mention text, reason)`` of each mention one-to-one matching leaves over.
    """

    phrases: list[Phrase] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    objects: int = 0
    recalled: int = 0
    mentions: int = 0
    unmatched: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Per-image fields: the counts behind the three ratios, and ``wrong-phrases``."""
        correct = len(self.phrases) - len(self.wrong)
        return {
            "attribute-phrases": len(self.phrases),
            "attribute-correct": correct,
            "attribute-precision": correct / len(self.phrases) if self.phrases else None,
            "attribute-objects": self.objects,
            "attribute-recalled": self.recalled,
            "attribute-captions": 1,
            "attribute-wrong-caption": int(bool(self.wrong)),
            "wrong-phrases": list(self.wrong),
            "attribute-mentions": self.mentions,
            "attribute-matched": self.mentions - len(self.unmatched),
            "attribute-wrong-one-to-one-caption": int(bool(self.unmatched)),
            "unmatched-mentions": [{"mention": text, "reason": reason} for text, reason in self.unmatched],
        }


@dataclass
class AttributeHallucination:
    """Attribute hallucination over a set of captions: image id -> :class:`ImageAttributes`."""

    per_image: dict[int, ImageAttributes]

    def to_json(self) -> dict[str, Any]:
        """The three ratios (None where nothing was counted) and the counts behind them."""
        images = list(self.per_image.values())
        phrases = sum(len(i.phrases) for i in images)
        correct = phrases - sum(len(i.wrong) for i in images)
        objects = sum(i.objects for i in images)
        recalled = sum(i.recalled for i in images)
        return {
            "attribute-precision": correct / phrases if phrases else None,
            "attribute-recall": recalled / objects if objects else None,
            "attribute-wrong": sum(bool(i.wrong) for i in images) / len(images) if images else None,
            "attribute-phrases": phrases,
            "attribute-correct": correct,
            "attribute-objects": objects,
            "attribute-recalled": recalled,
            "attribute-wrong-captions": sum(bool(i.wrong) for i in images),
            "attribute-images": len(images),
            "attribute-wrong-one-to-one": (
                sum(bool(i.unmatched) for i in images) / len(images) if images else None
            ),
            "attribute-mentions": sum(i.mentions for i in images),
            "attribute-matched": sum(i.mentions - len(i.unmatched) for i in images),
            "attribute-wrong-one-to-one-captions": sum(bool(i.unmatched) for i in images),
            **{
                f"attribute-unmatched-{reason}": sum(r == reason for i in images for _, r in i.unmatched)
                for reason in UNMATCHED_REASONS
            },
        }


def attribute_hallucination(
    captions: Mapping[int, Sequence[str]], instances: Instances, table: WordTable
) -> AttributeHallucination | None:
    """Judge every caption's attribute phrases against its image's annotated objects.

    Args:
        captions: image id -> the generated caption's tokens (images the instances cover).
        instances: the annotated objects, with their attributes.
        table: the CHAIR word table (the instances' category names are added here).
    Returns:
        None when the instances have no attribute annotations (nothing to judge), else one entry
        per caption.
    Raises:
        ValueError: a caption's image is not in the instances file.
    """
    words = attribute_words(instances)
    if not words:
        return None
    vocabulary = set(chair_vocabulary(instances))
    table = table.with_categories(vocabulary)
    per_image = {}
    for image_id, tokens in captions.items():
        if image_id not in instances.image_sizes:
            raise ValueError(f"image {image_id!r} is not in the instances file")
        objects = instances.objects.get(image_id, [])
        phrases = attribute_phrases(tokens, table, words, vocabulary)
        # each distinct phrase judged once: a caption repeating one costs no more than saying it once
        fits = {phrase: any(phrase.describes(obj) for obj in objects) for phrase in set(phrases)}
        correct = {phrase for phrase, fit in fits.items() if fit}
        described = [obj for obj in objects if obj.attributes and any(p.describes(obj) for p in correct)]
        mentions = attribute_phrases(tokens, table, words, vocabulary, bare=True)
        fates = match_one_to_one(mentions, objects)
        per_image[image_id] = ImageAttributes(
            phrases,
            [phrase.text for phrase in phrases if not fits[phrase]],
            sum(1 for obj in objects if any(isinstance(v, str) for v in obj.attributes.values())),
            len(described),
            len(mentions),
            [(mention.text, fate) for mention, fate in zip(mentions, fates, strict=True) if fate is not None],
        )
    return AttributeHallucination(per_image)


def add_attributes(
    scores: dict[str, Any], captions: Mapping[int, Sequence[str]], instances: Instances, table: WordTable
) -> None:
    """Add attribute hallucination to a scores dict in place (overall fields and each ``per_image``
    entry's), when the instances have attribute annotations; nothing otherwise."""
    result = attribute_hallucination(captions, instances, table)
    if result is None:
        return
    scores.update(result.to_json())
    if "per_image" in scores:
        scores["per_image"] = [
            {**entry, **result.per_image[entry["image_id"]].to_json()}
            if entry.get("image_id") in result.per_image
            else entry
            for entry in scores["per_image"]
        ]


def attribute_line(scores: Mapping[str, Any]) -> str | None:
    """One console line with the three numbers, or None when they were not computed."""
    if "attribute-images" not in scores:
        return None
    precision, recall = scores.get("attribute-precision"), scores.get("attribute-recall")

    def number(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.4f}"

    return (
        f"attribute hallucination: precision {number(precision)} "
        f"({scores['attribute-correct']} of {scores['attribute-phrases']} phrases right), "
        f"recall {number(recall)} ({scores['attribute-recalled']} of {scores['attribute-objects']} objects), "
        f"{scores['attribute-wrong-captions']} of {scores['attribute-images']} captions with a wrong phrase"
        + _one_to_one_clause(scores)
    )


def _one_to_one_clause(scores: Mapping[str, Any]) -> str:
    """``"; 31 of 200 misdescribe an object one-to-one (...)"`` or "" for scores without the count."""
    if "attribute-wrong-one-to-one-captions" not in scores:
        return ""
    reasons = ", ".join(f"{scores.get(f'attribute-unmatched-{r}', 0)} {r}" for r in UNMATCHED_REASONS)
    return (
        f"; {scores['attribute-wrong-one-to-one-captions']} of {scores['attribute-images']} "
        f"misdescribe an object one-to-one ({scores['attribute-matched']} of {scores['attribute-mentions']} "
        f"mentions matched; left over: {reasons})"
    )
