"""Attention grounding: does the model look at an object when it names it?

For every mention in a generated caption of an annotated object of its image (a category name, a
plural, a synonym or phrase from :mod:`captioning.evaluation.coco_words`, or an attribute value such
as a Shapes colour), two numbers are measured on the attention map of the mention's last word
("bear" of "teddy bear": a phrase is one mention, and its words are not matched again alone):

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

from captioning.evaluation.coco_files import EvaluationInputError, read_coco_file
from captioning.evaluation.coco_words import COCO_WORDS, CategoryWords

# Annotation fields of the COCO format; any other field is an attribute (Shapes writes color, size).
_COCO_FIELDS = frozenset(
    ["id", "image_id", "category_id", "bbox", "area", "iscrowd", "segmentation", "keypoints", "num_keypoints"]
)


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
        categories: the file's category names, lower case (the objects that could be annotated).
    """

    image_sizes: dict[int, tuple[float, float]]
    objects: dict[int, list[ObjectBox]]
    categories: tuple[str, ...] = ()


MAX_PIXELS = 10**7  # image sides and box coordinates beyond this are not images


def load_instances(instances_file: str | Path) -> Instances:
    """Read a COCO instances file (through pycocotools) into :class:`Instances`.

    Raises:
        EvaluationInputError: one line naming the file and the entry: not JSON, missing lists or
            keys, a box that is not four numbers with non-negative size, an unknown image or category.
    """
    coco = read_coco_file(
        instances_file,
        {
            "images": ["id", "width", "height"],
            "categories": ["id", "name"],
            "annotations": ["image_id", "category_id", "bbox"],
        },
    )
    _check_categories(instances_file, coco.dataset["categories"])
    image_sizes: dict[int, tuple[float, float]] = {}
    for image_id, image in coco.imgs.items():
        size = (image["width"], image["height"])
        if not all(_is_number(v) and 0 < v <= MAX_PIXELS for v in size):
            raise EvaluationInputError(
                f"{instances_file}: image {image_id}: width and height must be positive "
                f"and at most {MAX_PIXELS}, got {size[0]!r:.40} x {size[1]!r:.40}"
            )
        image_sizes[image_id] = (float(size[0]), float(size[1]))
    objects: dict[int, list[ObjectBox]] = {image_id: [] for image_id in image_sizes}
    for index, annotation in enumerate(coco.dataset["annotations"]):
        where = f"{instances_file}: annotations[{index}]"
        bbox = annotation["bbox"]
        if not (
            isinstance(bbox, list)
            and len(bbox) == 4
            and all(_is_number(v) for v in bbox)
            and bbox[2] >= 0
            and bbox[3] >= 0
        ):
            raise EvaluationInputError(f"{where}: bbox must be [x, y, width, height] with width, height >= 0")
        # sums of such values overflow to inf, then NaN scores
        if not all(abs(v) <= MAX_PIXELS for v in bbox):
            raise EvaluationInputError(
                f"{where}: bbox values must be within +-{MAX_PIXELS} pixels, got {bbox!r:.80}"
            )
        if annotation["image_id"] not in image_sizes:
            raise EvaluationInputError(f"{where}: image_id {annotation['image_id']!r} is not in 'images'")
        if annotation["category_id"] not in coco.cats:
            raise EvaluationInputError(
                f"{where}: category_id {annotation['category_id']!r} is not in 'categories'"
            )
        attributes = {k: v for k, v in annotation.items() if k not in _COCO_FIELDS}
        x, y, width, height = (float(v) for v in bbox)
        objects[annotation["image_id"]].append(
            ObjectBox(
                str(coco.cats[annotation["category_id"]]["name"]).lower(), (x, y, width, height), attributes
            )
        )
    categories = tuple(str(category["name"]).lower() for category in coco.cats.values())
    return Instances(image_sizes, objects, categories)


def _check_categories(instances_file: str | Path, categories: Sequence[Mapping[str, Any]]) -> None:
    """Every category has its own id and a non-empty name that is text: a number or an empty name would
    become a word CHAIR matches, and a repeated id would silently rename the first category's objects.

    Raises:
        EvaluationInputError: ``<file>: categories[i]: ...``.
    """
    seen: dict[Any, int] = {}
    for index, category in enumerate(categories):
        where = f"{instances_file}: categories[{index}]"
        name, category_id = category["name"], category["id"]
        if not isinstance(name, str) or not name.strip():
            raise EvaluationInputError(f"{where}: name must be a non-empty string, got {name!r:.40}")
        if category_id in seen:
            raise EvaluationInputError(
                f"{where}: id {category_id!r:.40} is also the id of categories[{seen[category_id]}]"
            )
        seen[category_id] = index


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value)


class WordMatcher:
    """Finds the objects that a caption's words name.

    Category words come from a :class:`CategoryWords` table (by default the MS-COCO one:
    phrases before their head nouns, plurals, synonyms; see :mod:`captioning.evaluation.coco_words`),
    extended with the category names of the objects it is given, so that a dataset's own names
    (Shapes' ``circle``, ``squares``) name their objects. A word outside every category mention
    also names the objects whose value of one of ``attributes`` it equals (by default ``color``:
    on Shapes, ``red`` names the red objects).

    Args:
        table: the words and phrases that name each category.
        attributes: annotation fields whose values are words that name the object.
    """

    def __init__(self, table: CategoryWords = COCO_WORDS, attributes: Sequence[str] = ("color",)):
        self.table = table
        self.attributes = tuple(attributes)
        self._tables: dict[frozenset[str], CategoryWords] = {}

    def mentions(
        self, words: Sequence[str], objects: Sequence[ObjectBox]
    ) -> list[tuple[int, list[ObjectBox]]]:
        """The mentions in ``words`` (one caption) of objects among ``objects``.

        Returns:
            ``(index of the mention's last word, the objects it names)`` per mention that names at
            least one of ``objects``, in caption order.
        """
        names = frozenset(obj.category for obj in objects)
        if names not in self._tables:
            self._tables[names] = self.table.with_categories(names)
        lowered = [word.lower() for word in words]
        found: dict[int, list[ObjectBox]] = {}
        in_mentions: set[int] = set()
        for (start, end), category in self._tables[names].mentions(lowered):
            in_mentions.update(range(start, end))
            named = [obj for obj in objects if obj.category == category]
            if named:
                found[end - 1] = named
        for index, word in enumerate(lowered):
            if index not in in_mentions:
                named = [
                    obj
                    for obj in objects
                    if any(str(obj.attributes.get(key, "")).lower() == word for key in self.attributes)
                ]
                if named:
                    found[index] = named
        return sorted(found.items())


def word_boxes(
    words: Sequence[str], image_id: int, instances: Instances | None, matcher: WordMatcher | None = None
) -> list[list[tuple[float, float, float, float]]]:
    """The ground-truth boxes each word of a caption names (as grounding measures them), for drawing.

    Args:
        words: the caption's T words.
        image_id: the image's id in ``instances``.
        instances: the boxes (:func:`load_instances`); None or an image it does not cover gives no boxes.
        matcher: decides which words name which objects (default: the COCO table with ``color``).
    Returns:
        T lists of (x, y, width, height) boxes in the image's pixels; empty for most words.
    """
    boxes: list[list[tuple[float, float, float, float]]] = [[] for _ in words]
    if instances is None or image_id not in instances.image_sizes:
        return boxes
    for index, named in (matcher or WordMatcher()).mentions(words, instances.objects.get(image_id, [])):
        boxes[index] = [obj.bbox for obj in named if obj.bbox[2] > 0 and obj.bbox[3] > 0]
    return boxes


def box_coverage(
    boxes: Sequence[tuple[float, float, float, float]], image_size: tuple[float, float], grid: tuple[int, int]
) -> np.ndarray:
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


def grounding_per_image(
    items: Iterable[tuple[int, Sequence[str], np.ndarray, tuple[int, int]]],
    instances: Instances,
    matcher: WordMatcher,
) -> dict[int, tuple[list[float], list[float]]]:
    """Attention mass in, and pointing-game hits on, the objects that generated words name, per image.

    Args:
        items: ``(image_id, words, attention, grid)`` per image: the T generated words, their
            attention maps (T, gh*gw) (row-major cells) or (T, gh, gw), and grid = (gh, gw).
        instances: the images' boxes (:func:`load_instances`).
        matcher: decides which words name which objects.
    Returns:
        image id -> (the mass inside the named boxes of each mention, its pointing hit), in caption
        order; both lists are empty for an image whose caption names no annotated object.
    Raises:
        ValueError: an image without instances, or attention whose shape does not fit words and grid.
    """
    per_image: dict[int, tuple[list[float], list[float]]] = {}
    for image_id, words, attention, grid in items:
        if image_id not in instances.image_sizes:
            raise ValueError(f"image {image_id!r} is not in the instances file")
        rows, cols = grid
        maps = np.asarray(attention, dtype=np.float64)
        if maps.ndim == 2 and maps.shape[1] == rows * cols:
            maps = maps.reshape(-1, rows, cols)  # (T, gh, gw)
        if maps.shape != (len(words), rows, cols):
            raise ValueError(
                f"image {image_id!r}: attention of shape {tuple(np.shape(attention))} does not hold "
                f"one {rows}x{cols} map per word for {len(words)} words"
            )
        image_size = instances.image_sizes[image_id]
        width, height = image_size
        masses: list[float] = []
        hits: list[float] = []
        for index, named in matcher.mentions(words, instances.objects.get(image_id, [])):
            weights = maps[index]  # (gh, gw)
            boxes = [obj.bbox for obj in named if obj.bbox[2] > 0 and obj.bbox[3] > 0]
            if not boxes:
                continue
            total = weights.sum()
            inside = (weights * box_coverage(boxes, image_size, grid)).sum()
            masses.append(float(inside / total) if total > 0 else 0.0)
            peak_rows, peak_cols = np.nonzero(weights >= weights.max() - 1e-9 * abs(weights.max()))
            centres = zip((peak_cols + 0.5) * width / cols, (peak_rows + 0.5) * height / rows, strict=True)
            hits.append(
                float(
                    np.mean(
                        [
                            any(x <= cx <= x + w and y <= cy <= y + h for x, y, w, h in boxes)
                            for cx, cy in centres
                        ]
                    )
                )
            )
        per_image[image_id] = (masses, hits)
    return per_image


def image_grounding_json(masses: Sequence[float], hits: Sequence[float]) -> dict[str, float | int | None]:
    """``grounding-mass`` and ``grounding-pointing``, the means over the mentions (None without any),
    and ``grounding-words``, how many mentions there are."""
    return {
        "grounding-mass": float(np.mean(masses)) if masses else None,
        "grounding-pointing": float(np.mean(hits)) if hits else None,
        "grounding-words": len(masses),
    }


def grounding_scores(
    items: Iterable[tuple[int, Sequence[str], np.ndarray, tuple[int, int]]],
    instances: Instances,
    matcher: WordMatcher,
) -> dict[str, float | int | None]:
    """Attention mass in, and pointing-game hits on, the objects that generated words name.

    Args:
        items, instances, matcher: as for :func:`grounding_per_image`.
    Returns:
        ``{"grounding-mass": mean share of attention inside the named boxes, "grounding-pointing":
        share of mentions whose most attended cell centre is inside a named box, "grounding-words":
        number of mentions counted (one per phrase)}``; the first two are None when no word names
        an object. Every mention weighs the same, whichever image it is in.
    Raises:
        ValueError: an image without instances, or attention whose shape does not fit words and grid.
    """
    per_image = grounding_per_image(items, instances, matcher)
    masses = [mass for image_masses, _ in per_image.values() for mass in image_masses]
    hits = [hit for _, image_hits in per_image.values() for hit in image_hits]
    return image_grounding_json(masses, hits)
