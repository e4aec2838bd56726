"""What one Shapes image shows and says: its objects placed, drawn and captioned.

Each image shows 1 to ``max_objects`` non-overlapping coloured shapes on a light, mildly noisy
background. Each gets 5 varied captions that name every object by size, colour and shape and,
for two or more objects, state a spatial relation between two of them that is true for their
box centres (left/right when the horizontal offset dominates, above/below otherwise; placement
keeps the two offsets clearly apart so that the relation is also plain to the eye). Everything
follows from the image's random generator. ``captioning.data.shapes`` writes them as a dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from captioning.config.data import SHAPE_CLASSES

SHAPE_WORDS = SHAPE_CLASSES  # ("circle", "square", "triangle", "diamond")
COLOR_WORDS = ("red", "green", "blue", "yellow", "purple")
SIZE_WORDS = ("small", "large")
# The phrases saying where the first object is relative to the second; keys are `relation` results.
RELATION_PHRASES = {
    "left": ("to the left of", "left of"),
    "right": ("to the right of", "right of"),
    "above": ("above", "over"),
    "below": ("below", "under"),
}
CAPTIONS_PER_IMAGE = 5
MAX_OBJECTS = 3  # objects an image holds at most

_COLOR_RGB = {
    "red": (214, 39, 40),
    "green": (44, 160, 44),
    "blue": (31, 90, 200),
    "yellow": (232, 186, 20),
    "purple": (140, 70, 180),
}
_SIZE_FRACTION = {"small": 0.20, "large": 0.38}  # side of the shape's box / side of the image
_SIZE_JITTER = 0.06  # relative spread of the side within a size class
_GAP_FRACTION = 0.04  # least free space between two boxes, and between a box and the border
_RELATION_MARGIN = 0.08  # least | |dx| - |dy| | between two centres, so the relation is unambiguous
_BACKGROUND = (236, 236, 230)
_NOISE = 5  # grey levels of uniform noise, on 2x2 pixel blocks

# Each template fixes its wording: whether sizes are named (``a``/``w`` with the size, ``a_``/``w_``
# without) and which relation phrase it uses. The variety between an image's five captions comes
# from the templates; within one template the caption follows from the image alone, so a model
# can learn to say exactly what a reference says.
_SINGLE_TEMPLATES = (
    "{a}",
    "there is one {w}",
    "a picture of {a_}",
    "one {w} on a plain background",
    "a single {w_}",
    "an image showing {a}",
)
_GROUP_TEMPLATES = (
    ("{a} {rel} {b}{rest}", 0),
    ("there is {a_} {rel} {b_}{rest_}", 1),
    ("{a} is {rel} {b}{rest}", 0),
    ("{all}", 0),
    ("{count} shapes: {all_}", 0),
    ("{a_} sits {rel} {b_}{rest_}", 1),
)
_COUNT_WORDS = {2: "two", 3: "three"}


@dataclass(frozen=True)
class ShapeObject:
    """One drawn shape; ``box`` is ``(x, y, width, height)`` in pixels, as in COCO; ``covered`` the share
    of its pixels that objects drawn after it cover (0: whole; written to the instances file when above 0)."""

    shape: str
    color: str
    size: str
    box: tuple[int, int, int, int]
    covered: float = 0.0

    @property
    def center(self) -> tuple[float, float]:
        x, y, width, height = self.box
        return x + width / 2, y + height / 2


def relation(first: ShapeObject, second: ShapeObject) -> str:
    """Where ``first`` is relative to ``second``: ``left``, ``right``, ``above`` or ``below`` (by centres)."""
    (x1, y1), (x2, y2) = first.center, second.center
    dx, dy = x1 - x2, y1 - y2
    if abs(dx) > abs(dy):
        return "left" if dx < 0 else "right"
    return "above" if dy < 0 else "below"


def place_objects(rng: np.random.Generator, image_size: int, max_objects: int) -> list[ShapeObject]:
    """Distinct (colour, shape) objects at random free positions; retries until all fit."""
    count = int(rng.integers(1, max_objects + 1))
    gap = round(_GAP_FRACTION * image_size)
    margin = _RELATION_MARGIN * image_size
    while True:
        kinds = rng.choice(len(COLOR_WORDS) * len(SHAPE_WORDS), size=count, replace=False)
        objects: list[ShapeObject] = []
        for kind in kinds:
            size = SIZE_WORDS[int(rng.integers(len(SIZE_WORDS)))]
            side = round(image_size * _SIZE_FRACTION[size] * (1 + rng.uniform(-_SIZE_JITTER, _SIZE_JITTER)))
            for _ in range(50):
                x, y = (int(v) for v in rng.integers(gap, image_size - side - gap + 1, size=2))
                color, shape = divmod(int(kind), len(SHAPE_WORDS))
                candidate = ShapeObject(SHAPE_WORDS[shape], COLOR_WORDS[color], size, (x, y, side, side))
                if all(_apart(candidate, other, gap, margin) for other in objects):
                    objects.append(candidate)
                    break
            else:
                break  # no room left: draw a fresh set
        if len(objects) == count:
            return objects


def _apart(first: ShapeObject, second: ShapeObject, gap: int, margin: float) -> bool:
    """Boxes at least ``gap`` apart and centre offsets whose dominant direction is clear."""
    x1, y1, w1, h1 = first.box
    x2, y2, w2, h2 = second.box
    separated = x1 + w1 + gap <= x2 or x2 + w2 + gap <= x1 or y1 + h1 + gap <= y2 or y2 + h2 + gap <= y1
    (cx1, cy1), (cx2, cy2) = first.center, second.center
    return separated and abs(abs(cx1 - cx2) - abs(cy1 - cy2)) >= margin


def draw_shape(draw: ImageDraw.ImageDraw, obj: ShapeObject, fill: Any) -> None:
    """Draw ``obj``'s shape filled with ``fill`` (a colour, or 1 on a mode "1" mask)."""
    x, y, side, _ = obj.box
    right, bottom, middle_x, middle_y = x + side - 1, y + side - 1, x + (side - 1) / 2, y + (side - 1) / 2
    if obj.shape == "circle":
        draw.ellipse((x, y, right, bottom), fill=fill)
    elif obj.shape == "square":
        draw.rectangle((x, y, right, bottom), fill=fill)
    elif obj.shape == "triangle":
        draw.polygon([(middle_x, y), (right, bottom), (x, bottom)], fill=fill)
    else:  # diamond
        draw.polygon([(middle_x, y), (right, middle_y), (middle_x, bottom), (x, middle_y)], fill=fill)


def shape_mask(obj: ShapeObject, image_size: int) -> np.ndarray:
    """(S, S) bool: the pixels ``obj``'s shape fills."""
    mask = Image.new("1", (image_size, image_size), 0)
    draw_shape(ImageDraw.Draw(mask), obj, 1)
    return np.asarray(mask, dtype=bool)


def render(objects: list[ShapeObject], rng: np.random.Generator, image_size: int) -> Image.Image:
    """The (S, S) RGB image of ``objects``, drawn in order on the noisy background; colours jittered."""
    image = Image.new("RGB", (image_size, image_size), _BACKGROUND)
    draw = ImageDraw.Draw(image)
    for obj in objects:
        jittered = np.array(_COLOR_RGB[obj.color]) + rng.integers(-12, 13, 3)
        draw_shape(draw, obj, tuple(int(c) for c in np.clip(jittered, 0, 255)))
    # Mild grey noise on 2x2 blocks: texture for the encoder, and PNGs stay small.
    half = (image_size + 1) // 2
    noise = rng.integers(-_NOISE, _NOISE + 1, size=(half, half, 1), dtype=np.int16)
    noise = noise.repeat(2, axis=0).repeat(2, axis=1)[:image_size, :image_size]  # (S, S, 1)
    pixels = np.asarray(image, dtype=np.int16) + noise  # (S, S, 3)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def shape_area(obj: ShapeObject) -> float:
    """The area in pixels of ``obj``'s shape (its instances entry's ``area``)."""
    side = obj.box[2]
    return {"circle": math.pi * side * side / 4, "square": float(side * side)}.get(obj.shape, side * side / 2)


def _phrase(obj: ShapeObject, with_size: bool) -> str:
    """``"small red circle"`` or ``"red circle"``."""
    return " ".join(([obj.size] if with_size else []) + [obj.color, obj.shape])


def _salience_order(objects: list[ShapeObject]) -> list[ShapeObject]:
    """Large objects first, then from left to right: the order every caption names them in."""
    return sorted(objects, key=lambda obj: (obj.size != "large", obj.center[0], obj.center[1]))


def captions_for(objects: list[ShapeObject], rng: np.random.Generator) -> list[str]:
    """Five captions, each from a different template, naming every object (the first two by relation)."""
    if len(objects) == 1:
        forms = {"w": _phrase(objects[0], True), "w_": _phrase(objects[0], False)}
        forms.update(a=f"a {forms['w']}", a_=f"a {forms['w_']}")
        template_ids = rng.permutation(len(_SINGLE_TEMPLATES))[:CAPTIONS_PER_IMAGE]
        return [_SINGLE_TEMPLATES[i].format(**forms) for i in template_ids]
    order = _salience_order(objects)
    full = [f"a {_phrase(obj, True)}" for obj in order]
    short = [f"a {_phrase(obj, False)}" for obj in order]
    options = RELATION_PHRASES[relation(order[0], order[1])]
    captions = []
    for template_id in rng.permutation(len(_GROUP_TEMPLATES))[:CAPTIONS_PER_IMAGE]:
        template, relation_choice = _GROUP_TEMPLATES[template_id]
        captions.append(
            template.format(
                a=full[0],
                b=full[1],
                a_=short[0],
                b_=short[1],
                rel=options[relation_choice],
                rest="".join(f" and {phrase}" for phrase in full[2:]),
                rest_="".join(f" and {phrase}" for phrase in short[2:]),
                all=" and ".join([", ".join(full[:-1]), full[-1]]),
                all_=" and ".join([", ".join(short[:-1]), short[-1]]),
                count=_COUNT_WORDS[len(objects)],
            )
        )
    return captions
