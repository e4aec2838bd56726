"""Attention grounding: does the model look at an object when it names it?

For every generated word that names an annotated object of its image (a category name, a plural,
a synonym, or an attribute value such as a Shapes colour), two numbers are measured on that
word's attention map:

- mass: the share of the attention inside the union of the named objects' boxes, each grid
  cell's weight spread uniformly over the cell's area (so a box covering half a cell gets half
  that cell's weight);
- pointing game: whether the centre of the most attended cell lies inside one of those boxes
  (edges included). When several cells share the maximum, the word scores the share of them that
  hit, the expected hit of breaking the tie at random: a flat map scores the chance rate, not
  whatever the first cell happens to cover.

Boxes of zero width or height cover nothing and are left out of both.

The attention grid covers the whole image (the encoder resizes without cropping): cell (r, c) of a
(gh, gw) grid spans x in [c W/gw, (c+1) W/gw) and y in [r H/gh, (r+1) H/gh).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captioning.evaluation.metrics import EvaluationInputError, read_coco_file

# Annotation fields of the COCO format; any other field is an attribute (Shapes writes color, size).
_COCO_FIELDS = frozenset(["id", "image_id", "category_id", "bbox", "area", "iscrowd", "segmentation",
                          "keypoints", "num_keypoints"])

# Word -> COCO category it names. Plurals of these and of category names are derived by rule.
DEFAULT_SYNONYMS: Mapping[str, str] = {
    **dict.fromkeys(["man", "woman", "boy", "girl", "people", "person", "child", "kid", "guy", "lady", "men",
                     "women", "player", "children", "baby", "skier", "surfer", "skateboarder", "snowboarder"],
                    "person"),
    "puppy": "dog", "puppies": "dog", "kitten": "cat", "bike": "bicycle", "motorbike": "motorcycle",
    "plane": "airplane", "aeroplane": "airplane", "jet": "airplane", "television": "tv", "sofa": "couch",
    "phone": "cell phone", "cellphone": "cell phone", "table": "dining table", "ball": "sports ball",
    "hotdog": "hot dog", "hydrant": "fire hydrant", "teddy": "teddy bear", "plant": "potted plant",
    "racket": "tennis racket", "racquet": "tennis racket", "doughnut": "donut", "ski": "skis",
    "ship": "boat", "pony": "horse", "lamb": "sheep", "calf": "cow", "cattle": "cow",
    # the head nouns of two-word categories, as captions say them
    "light": "traffic light", "stoplight": "traffic light", "sign": "stop sign", "glass": "wine glass",
    "bat": "baseball bat", "glove": "baseball glove", "mitt": "baseball glove", "meter": "parking meter",
    "dryer": "hair drier", "hairdryer": "hair drier", "drier": "hair drier",
}
_IRREGULAR_SINGULAR = {"people": "person", "men": "man", "women": "woman", "children": "child", "mice": "mouse",
                       "knives": "knife", "geese": "goose", "feet": "foot", "teeth": "tooth"}


@dataclass(frozen=True)
class ObjectBox:
    """One annotated object.

    Attributes:
        category: category name, lower case (``"dog"``, ``"circle"``).
        bbox: (x, y, width, height) in pixels, COCO convention.
        attributes: the annotation's extra fields, e.g. ``{"color": "red", "size": "large"}``.
    """

    category: str
    bbox: tuple[float, float, float, float]
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Instances:
    """Boxes of a COCO instances file.

    Attributes:
        image_sizes: image id -> (width, height) in pixels.
        objects: image id -> its annotated objects (empty list for images without any).
    """

    image_sizes: dict[int, tuple[float, float]]
    objects: dict[int, list[ObjectBox]]


MAX_PIXELS = 10 ** 7  # image sides and box coordinates beyond this are not images


def load_instances(instances_file: str | Path) -> Instances:
    """Read a COCO instances file (through pycocotools) into :class:`Instances`.

    Raises:
        EvaluationInputError: one line naming the file and the entry: not JSON, missing lists or
            keys, a box that is not four numbers with non-negative size, an unknown image or category.
    """
    coco = read_coco_file(instances_file, {"images": ["id", "width", "height"], "categories": ["id", "name"],
                                           "annotations": ["image_id", "category_id", "bbox"]})
    image_sizes: dict[int, tuple[float, float]] = {}
    for image_id, image in coco.imgs.items():
        size = (image["width"], image["height"])
        if not all(_is_number(v) and 0 < v <= MAX_PIXELS for v in size):
            raise EvaluationInputError(f"{instances_file}: image {image_id}: width and height must be positive "
                                       f"and at most {MAX_PIXELS}, got {size[0]!r:.40} x {size[1]!r:.40}")
        image_sizes[image_id] = (float(size[0]), float(size[1]))
    objects: dict[int, list[ObjectBox]] = {image_id: [] for image_id in image_sizes}
    for index, annotation in enumerate(coco.dataset["annotations"]):
        where = f"{instances_file}: annotations[{index}]"
        bbox = annotation["bbox"]
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)
                and bbox[2] >= 0 and bbox[3] >= 0):
            raise EvaluationInputError(f"{where}: bbox must be [x, y, width, height] with width, height >= 0")
        if not all(abs(v) <= MAX_PIXELS for v in bbox):  # sums of such values overflow to inf, then NaN scores
            raise EvaluationInputError(f"{where}: bbox values must be within +-{MAX_PIXELS} pixels, "
                                       f"got {bbox!r:.80}")
        if annotation["image_id"] not in image_sizes:
            raise EvaluationInputError(f"{where}: image_id {annotation['image_id']!r} is not in 'images'")
        if annotation["category_id"] not in coco.cats:
            raise EvaluationInputError(f"{where}: category_id {annotation['category_id']!r} is not in 'categories'")
        attributes = {k: v for k, v in annotation.items() if k not in _COCO_FIELDS}
        objects[annotation["image_id"]].append(ObjectBox(str(coco.cats[annotation["category_id"]]["name"]).lower(),
                                                         tuple(float(v) for v in bbox), attributes))
    return Instances(image_sizes, objects)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value)


class WordMatcher:
    """Finds the objects a word names.

    A word names an object when it is the object's category name, a plural of it, or a synonym
    (``DEFAULT_SYNONYMS``: man/women/kid -> person, puppy -> dog, bike -> bicycle, ...), or when it
    equals one of the object's attribute values for the attribute keys given (by default
    ``color``: on Shapes, ``red`` names the red objects).

    Args:
        synonyms: word -> category name.
        attributes: annotation fields whose values are words that name the object.
    """

    def __init__(self, synonyms: Mapping[str, str] = DEFAULT_SYNONYMS, attributes: Sequence[str] = ("color",)):
        self.synonyms = {word.lower(): category.lower() for word, category in synonyms.items()}
        self.attributes = tuple(attributes)

    def categories(self, word: str) -> set[str]:
        """The category names ``word`` may name (itself, its singular forms, their synonyms)."""
        forms = {word} | _singulars(word)
        return forms | {self.synonyms[form] for form in forms if form in self.synonyms}

    def matches(self, word: str, objects: Sequence[ObjectBox]) -> list[ObjectBox]:
        """The objects among ``objects`` that ``word`` names (empty when it names none)."""
        word = word.lower()
        categories = self.categories(word)
        return [obj for obj in objects if obj.category in categories
                or any(str(obj.attributes.get(key, "")).lower() == word for key in self.attributes)]


def _singulars(word: str) -> set[str]:
    """Possible singulars of an English plural (``boxes`` -> box, ``knives`` -> knife, ``puppies`` -> puppy)."""
    forms = set()
    if word in _IRREGULAR_SINGULAR:
        forms.add(_IRREGULAR_SINGULAR[word])
    if word.endswith("ies") and len(word) > 3:
        forms.add(word[:-3] + "y")
    if word.endswith("ves") and len(word) > 3:
        forms.update([word[:-3] + "f", word[:-3] + "fe"])
    if word.endswith(("ses", "xes", "zes", "ches", "shes")):  # boxes, glasses, benches; not skies -> ski
        forms.add(word[:-2])
    if word.endswith("s") and not word.endswith("ss") and len(word) > 1:
        forms.add(word[:-1])
    return forms


def box_coverage(boxes: Sequence[tuple[float, float, float, float]], image_size: tuple[float, float],
                 grid: tuple[int, int]) -> np.ndarray:
    """Fraction of each grid cell's area covered by the union of ``boxes``.

    Args:
        boxes: (x, y, width, height) boxes in pixels; parts outside the image are ignored.
        image_size: (width, height) of the image the grid covers.
        grid: (gh, gw) rows and columns of cells.
    Returns:
        (gh, gw) values in [0, 1].
    """
    width, height = image_size
    rows, cols = grid
    if not boxes:
        return np.zeros(grid)
    boxes_xyxy = np.array([(x, y, x + w, y + h) for x, y, w, h in boxes], dtype=np.float64)  # (B, 4)
    boxes_xyxy[:, [0, 2]] = boxes_xyxy[:, [0, 2]].clip(0, width)
    boxes_xyxy[:, [1, 3]] = boxes_xyxy[:, [1, 3]].clip(0, height)
    # Split the image at every cell and box edge: each elementary rectangle lies in one cell and is
    # either inside the union or outside it, so the union's area per cell is exact.
    x_cells = np.arange(cols + 1) * (width / cols)
    y_cells = np.arange(rows + 1) * (height / rows)
    xs = np.unique(np.concatenate([x_cells, boxes_xyxy[:, [0, 2]].ravel()]))  # (X,)
    ys = np.unique(np.concatenate([y_cells, boxes_xyxy[:, [1, 3]].ravel()]))  # (Y,)
    x_mid, y_mid = (xs[:-1] + xs[1:]) / 2, (ys[:-1] + ys[1:]) / 2  # (X-1,), (Y-1,)
    inside_x = (x_mid[None, :] > boxes_xyxy[:, 0:1]) & (x_mid[None, :] < boxes_xyxy[:, 2:3])  # (B, X-1)
    inside_y = (y_mid[None, :] > boxes_xyxy[:, 1:2]) & (y_mid[None, :] < boxes_xyxy[:, 3:4])  # (B, Y-1)
    covered = (inside_y[:, :, None] & inside_x[:, None, :]).any(axis=0)  # (Y-1, X-1)
    area = np.diff(ys)[:, None] * np.diff(xs)[None, :] * covered  # (Y-1, X-1)
    col = np.minimum((x_mid / (width / cols)).astype(int), cols - 1)  # cell column of each piece
    row = np.minimum((y_mid / (height / rows)).astype(int), rows - 1)
    cell_area = np.zeros(grid)
    np.add.at(cell_area, (row[:, None], col[None, :]), area)
    return np.clip(cell_area / ((width / cols) * (height / rows)), 0.0, 1.0)


def grounding_scores(
    items: Iterable[tuple[int, Sequence[str], np.ndarray, tuple[int, int]]],
    instances: Instances,
    matcher: WordMatcher,
) -> dict[str, float | int | None]:
    """Attention mass in, and pointing-game hits on, the objects that generated words name.

    Args:
        items: ``(image_id, words, attention, grid)`` per image: the T generated words, their
            attention maps (T, gh*gw) (row-major cells) or (T, gh, gw), and grid = (gh, gw).
        instances: the images' boxes (:func:`load_instances`).
        matcher: decides which objects a word names.
    Returns:
        ``{"grounding-mass": mean share of attention inside the named boxes, "grounding-pointing":
        share of words whose most attended cell centre is inside a named box, "grounding-words":
        number of words counted}``; the first two are None when no word names an object.
    Raises:
        ValueError: an image without instances, or attention whose shape does not fit words and grid.
    """
    masses: list[float] = []
    hits: list[float] = []
    for image_id, words, attention, grid in items:
        if image_id not in instances.image_sizes:
            raise ValueError(f"image {image_id!r} is not in the instances file")
        rows, cols = grid
        maps = np.asarray(attention, dtype=np.float64)
        if maps.ndim == 2 and maps.shape[1] == rows * cols:
            maps = maps.reshape(-1, rows, cols)  # (T, gh, gw)
        if maps.shape != (len(words), rows, cols):
            raise ValueError(f"image {image_id!r}: attention of shape {tuple(np.shape(attention))} does not hold "
                             f"one {rows}x{cols} map per word for {len(words)} words")
        image_size = instances.image_sizes[image_id]
        width, height = image_size
        for word, weights in zip(words, maps):
            named = matcher.matches(word, instances.objects.get(image_id, []))
            boxes = [obj.bbox for obj in named if obj.bbox[2] > 0 and obj.bbox[3] > 0]
            if not boxes:
                continue
            total = weights.sum()
            inside = (weights * box_coverage(boxes, image_size, grid)).sum()
            masses.append(float(inside / total) if total > 0 else 0.0)
            peak_rows, peak_cols = np.nonzero(weights >= weights.max() - 1e-9 * abs(weights.max()))
            centres = zip((peak_cols + 0.5) * width / cols, (peak_rows + 0.5) * height / rows)
            hits.append(float(np.mean([any(x <= cx <= x + w and y <= cy <= y + h for x, y, w, h in boxes)
                                       for cx, cy in centres])))
    return {
        "grounding-mass": float(np.mean(masses)) if masses else None,
        "grounding-pointing": float(np.mean(hits)) if hits else None,
        "grounding-words": len(masses),
    }
