"""Shapes with a co-occurrence prior its test split breaks: a testbed where a captioner hallucinates.

In the training and validation images a *cause* class (``circle`` by default) almost always comes
with a *partner* class (``square``): with probability ``prior`` a small partner sits partly under the
cause (a share ``covered`` of its pixels hidden), so the partner's own pixels are weak evidence and
the cause predicts it. Images without the cause hold one to ``max_objects`` shapes of the other
classes, the partner among them, apart as in plain Shapes. Every test image holds the cause and no
partner: in a share ``decoy`` of them a small shape of a third class sits partly under the cause where
the partner would be (a look-alike), in the others nothing does. A model that learned the prior
names a partner that is not there, and CHAIR counts it, since every object has its box and class.

Captions are written as in plain Shapes (every object named by size, colour and shape); the
instances file gives each object its box, class, colour, size and, when something covers it,
``covered`` (the share of its pixels hidden). Everything follows from the seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from captioning.config import DataConfig, ShapesHallucinationDataConfig
from captioning.data.readers import register_reader
from captioning.data.shapes import FORMAT_VERSION, ShapesFiles, ShapesReader, write_shapes
from captioning.data.shapes_scenes import (
    COLOR_WORDS,
    MAX_OBJECTS,
    SHAPE_WORDS,
    SIZE_WORDS,
    ShapeObject,
    shape_mask,
)

VARIANT_VERSION = 1  # raise when the output for given parameters changes
_SIZE_FRACTION = {"small": 0.20, "large": 0.38}  # as plain Shapes: side of the box / side of the image
_SIZE_JITTER = 0.06
_GAP_FRACTION = 0.04
_RELATION_MARGIN = 0.08
_COVERED_SPREAD = 0.15  # an image's target covered share is drawn within this of the mean
_TRIES = 50


@dataclass(frozen=True)
class CoOccurrence:
    """The prior the training images carry and the test images break (see the module).

    Attributes:
        cause, partner: the two classes (shape words), different.
        prior: P(partner | cause) in train and val.
        cause_share: share of train and val images holding the cause.
        covered: mean share of the partner's (or the decoy's) pixels the cause covers.
        partner_side: side of the partner's (and the decoy's) box / side of the image.
        decoy: share of test images with a small third-class shape where the partner would be.
    """

    cause: str = "circle"
    partner: str = "square"
    prior: float = 0.95
    cause_share: float = 0.5
    covered: float = 0.5
    partner_side: float = 0.13
    decoy: float = 0.5

    def __post_init__(self) -> None:
        if self.cause not in SHAPE_WORDS or self.partner not in SHAPE_WORDS or self.cause == self.partner:
            raise ValueError(
                f"cause and partner must be two different shapes, got {self.cause!r}, {self.partner!r}"
            )

    @property
    def others(self) -> tuple[str, ...]:
        """The classes that are neither the cause nor the partner."""
        return tuple(shape for shape in SHAPE_WORDS if shape not in (self.cause, self.partner))


def generate_shapes_hallucination(
    root: str | Path,
    prior: CoOccurrence | None = None,
    seed: int = 0,
    num_train: int = 2000,
    num_val: int = 200,
    num_test: int = 200,
    image_size: int = 224,
    max_objects: int = 3,
) -> ShapesFiles:
    """Write the testbed under ``root`` (the files of plain Shapes), or reuse it if it was written with
    the same parameters. ``prior``: None, the defaults of :class:`CoOccurrence`; ``max_objects`` (2 to
    3) bounds every image's objects, the partner included."""
    prior = CoOccurrence() if prior is None else prior
    if not 2 <= max_objects <= MAX_OBJECTS:
        raise ValueError(f"max_objects must be between 2 and {MAX_OBJECTS}, got {max_objects}")
    if image_size < 32:
        raise ValueError(f"image_size must be >= 32, got {image_size}")
    parameters = {
        "format_version": FORMAT_VERSION,
        "variant": f"hallucination-{VARIANT_VERSION}",
        "seed": seed,
        "image_size": image_size,
        "max_objects": max_objects,
        **{f"co_occurrence_{key}": value for key, value in vars(prior).items()},
    }

    def place(rng: np.random.Generator, split: str) -> list[ShapeObject]:
        return place_co_occurring(rng, split, prior, image_size, max_objects)

    counts = {"train": num_train, "val": num_val, "test": num_test}
    return write_shapes(root, parameters, counts, place)


def place_co_occurring(
    rng: np.random.Generator, split: str, prior: CoOccurrence, image_size: int, max_objects: int
) -> list[ShapeObject]:
    """One image's objects in drawing order, with ``covered`` set (the module says what each split holds)."""
    test = split == "test"
    if not test and rng.random() >= prior.cause_share:  # an image without the cause
        classes = tuple(shape for shape in SHAPE_WORDS if shape != prior.cause)
        return _apart_objects(rng, image_size, int(rng.integers(1, max_objects + 1)), classes, [])
    with_partner = not test and rng.random() < prior.prior
    with_decoy = test and rng.random() < prior.decoy
    while True:
        cause = _free_object(rng, image_size, prior.cause, [], _side(rng, image_size))
        if cause is None:
            continue
        objects = [cause]
        if with_partner or with_decoy:
            shape = prior.partner if with_partner else prior.others[int(rng.integers(len(prior.others)))]
            covered = _tucked(rng, image_size, shape, cause, prior)
            if covered is None:
                continue
            objects = [covered, cause]  # drawn first: the cause covers it
        extra = int(rng.integers(0, max_objects - len(objects) + 1))
        placed = _apart_objects(rng, image_size, extra, prior.others, objects)
        if placed:
            return _with_covered(placed, image_size)


def _side(rng: np.random.Generator, image_size: int, size: str | None = None) -> tuple[str, int]:
    size = SIZE_WORDS[int(rng.integers(len(SIZE_WORDS)))] if size is None else size
    return size, round(image_size * _SIZE_FRACTION[size] * (1 + rng.uniform(-_SIZE_JITTER, _SIZE_JITTER)))


def _free_object(
    rng: np.random.Generator, image_size: int, shape: str, others: list[ShapeObject], sized: tuple[str, int]
) -> ShapeObject | None:
    """A shape of a random colour not used for ``shape`` yet, at a random position apart from ``others``
    (None when no position was found)."""
    size, side = sized
    gap = round(_GAP_FRACTION * image_size)
    used = {obj.color for obj in others if obj.shape == shape}
    colors = [color for color in COLOR_WORDS if color not in used]
    color = colors[int(rng.integers(len(colors)))]
    for _ in range(_TRIES):
        x, y = (int(v) for v in rng.integers(gap, image_size - side - gap + 1, size=2))
        candidate = ShapeObject(shape, color, size, (x, y, side, side))
        if all(_apart(candidate, other, gap, _RELATION_MARGIN * image_size) for other in others):
            return candidate
    return None


def _apart_objects(
    rng: np.random.Generator, image_size: int, count: int, classes: tuple[str, ...], placed: list[ShapeObject]
) -> list[ShapeObject]:
    """``placed`` plus ``count`` shapes of ``classes`` apart from everything (an empty list when they
    do not fit); with nothing placed yet, tries again until they fit."""
    while True:
        objects = list(placed)
        for _ in range(count):
            shape = classes[int(rng.integers(len(classes)))]
            obj = _free_object(rng, image_size, shape, objects, _side(rng, image_size))
            if obj is None:
                break
            objects.append(obj)
        if len(objects) == len(placed) + count:
            return objects
        if placed:
            return []


def _apart(first: ShapeObject, second: ShapeObject, gap: int, margin: float) -> bool:
    """Boxes at least ``gap`` apart and centre offsets whose dominant direction is clear (as plain
    Shapes places its objects)."""
    x1, y1, w1, h1 = first.box
    x2, y2, w2, h2 = second.box
    separated = x1 + w1 + gap <= x2 or x2 + w2 + gap <= x1 or y1 + h1 + gap <= y2 or y2 + h2 + gap <= y1
    (cx1, cy1), (cx2, cy2) = first.center, second.center
    return separated and abs(abs(cx1 - cx2) - abs(cy1 - cy2)) >= margin


def _tucked(
    rng: np.random.Generator, image_size: int, shape: str, cause: ShapeObject, prior: CoOccurrence
) -> ShapeObject | None:
    """A small ``shape`` beside ``cause``, partly under it: its centre offset along one axis by the
    distance whose covered share is nearest a target drawn around ``prior.covered``; None when no
    offset keeps it inside the image with a clear relation."""
    side = round(image_size * prior.partner_side * (1 + rng.uniform(-_SIZE_JITTER, _SIZE_JITTER)))
    target = float(
        np.clip(rng.uniform(prior.covered - _COVERED_SPREAD, prior.covered + _COVERED_SPREAD), 0, 0.9)
    )
    colors = [color for color in COLOR_WORDS if color != cause.color]  # told apart from the cause
    color = colors[int(rng.integers(len(colors)))]
    margin = _RELATION_MARGIN * image_size
    cause_mask = shape_mask(cause, image_size)
    cx, cy = cause.center
    reach = (cause.box[2] + side) / 2  # centre distance at which the boxes stop overlapping
    for axis in rng.permutation(4):
        dx, dy = ((1, 0), (-1, 0), (0, 1), (0, -1))[int(axis)]
        jitter = rng.uniform(-0.25, 0.25) * side
        best: tuple[float, ShapeObject] | None = None
        for distance in np.linspace(margin + abs(jitter), reach + side / 2, 12):
            x = round(cx + dx * distance + abs(dy) * jitter - side / 2)
            y = round(cy + dy * distance + abs(dx) * jitter - side / 2)
            if min(x, y) < 0 or max(x, y) + side > image_size:
                continue
            candidate = ShapeObject(shape, color, "small", (x, y, side, side))
            mask = shape_mask(candidate, image_size)
            share = float((mask & cause_mask).sum() / max(mask.sum(), 1))
            if best is None or abs(share - target) < abs(best[0] - target):
                best = (share, candidate)
        if best is not None:
            return best[1]
    return None


def _with_covered(objects: list[ShapeObject], image_size: int) -> list[ShapeObject]:
    """The objects with ``covered``: the share of each one's pixels that objects drawn after it fill."""
    masks = [shape_mask(obj, image_size) for obj in objects]
    result = []
    for index, (obj, mask) in enumerate(zip(objects, masks, strict=True)):
        later = np.zeros_like(mask)
        for other in masks[index + 1 :]:
            later |= other
        share = float((mask & later).sum() / max(mask.sum(), 1))
        result.append(ShapeObject(obj.shape, obj.color, obj.size, obj.box, share))
    return result


def co_occurrence_of(config: ShapesHallucinationDataConfig) -> CoOccurrence:
    """The prior a configuration's ``data.shapes_*`` options describe."""
    return CoOccurrence(
        cause=config.shapes_cause,
        partner=config.shapes_partner,
        prior=config.shapes_prior,
        cause_share=config.shapes_cause_share,
        covered=config.shapes_covered,
        partner_side=config.shapes_partner_side,
        decoy=config.shapes_decoy,
    )


@register_reader("shapes_hallucination", ShapesHallucinationDataConfig)
class ShapesHallucinationReader(ShapesReader):
    """The testbed under ``data.root``, generated there first unless a folder with the same options is
    there already."""

    def generate(self, config: DataConfig) -> None:
        assert isinstance(config, ShapesHallucinationDataConfig)  # read into its own class
        generate_shapes_hallucination(
            config.root,
            co_occurrence_of(config),
            seed=config.shapes_seed,
            num_train=config.shapes_train,
            num_val=config.shapes_val,
            num_test=config.shapes_test,
            image_size=config.shapes_image_size,
            max_objects=config.shapes_max_objects,
        )
