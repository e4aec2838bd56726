"""Attention grounding: does the model look at an object when it names it?

For every mention in a generated caption of an annotated object of its image (a category name, a
plural, a synonym or phrase from :mod:`captioning.evaluation.coco_words`, or an attribute value such
as a Shapes colour), two numbers are measured on the attention map of the mention's last word
("bear" of "teddy bear": a phrase is one mention, and its words are not matched again alone):

- mass: the share of the attention inside the union of the named objects' boxes, each grid
  cell's weight spread uniformly over the cell's area (so a box covering half a cell gets half
  that cell's weight);
- the strict pointing game (``grounding-pointing``): whether the centre of the most attended cell
  lies inside one of those boxes (edges included). When several cells share the maximum, the word
  scores the share of them that hit, the expected hit of breaking the tie at random: a flat map
  scores the chance rate, not whatever the first cell happens to cover;
- the published pointing game (``grounding-pointing-published``; Zhang et al. 2016, "Top-down
  neural attention by excitation backprop", as TorchRay's benchmark computes it): the map is
  upsampled to the image's pixels (bilinear, pixel centres aligned), its maximum taken (the first
  in row-major order), and the mention hits when any ground-truth pixel lies strictly within
  ``tolerance`` pixels of it (default 15). The ground truth is the union of the named objects'
  segmentation masks (polygons or RLE, decoded with pycocotools), or their boxes for objects
  without a segmentation. Reported as the mean over mentions, as the mean over every category of the
  instances file of each category's accuracy (a category never mentioned counting 0, as TorchRay's
  ``PointingGame.accuracy`` averages; ``grounding-pointing-published-classes``) and as the mean over
  the classes mentioned (``grounding-pointing-published-mentioned-classes``).

The population is not the published game's: the published game scores every ground-truth category
of every image (the map for that category), here only the objects the generated caption names are
scored, each on its mention's map. A paper's pointing game is therefore not comparable with these
numbers.

Boxes of zero width or height cover nothing and are left out of all three.

The attention grid covers the whole image (the encoder resizes without cropping): cell (r, c) of a
(gh, gw) grid spans x in [c W/gw, (c+1) W/gw) and y in [r H/gh, (r+1) H/gh).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from captioning.evaluation.coco_files import EvaluationInputError, read_coco_file
from captioning.evaluation.coco_words import COCO_WORDS, CategoryWords
from captioning.evaluation.pointing import (
    DEFAULT_TOLERANCE,
    MAX_PIXELS,
    checked_segmentation,
    class_mean,
    dataset_class_mean,
    is_number,
    object_mask,
    published_hit,
)

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
        segmentation: the annotation's COCO segmentation (a list of polygons, or an RLE dict), None
            without one (the box stands for the object in the published pointing game).
    """

    category: str
    bbox: tuple[float, float, float, float]
    attributes: Mapping[str, Any] = field(default_factory=dict)
    segmentation: Any = None


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
        if not all(is_number(v) and 0 < v <= MAX_PIXELS for v in size):
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
            and all(is_number(v) for v in bbox)
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
        segmentation = checked_segmentation(
            where, annotation.get("segmentation"), image_sizes[annotation["image_id"]]
        )
        x, y, width, height = (float(v) for v in bbox)
        objects[annotation["image_id"]].append(
            ObjectBox(
                category_word(coco.cats[annotation["category_id"]]["name"]),
                (x, y, width, height),
                attributes,
                segmentation,
            )
        )
    categories = tuple(category_word(category["name"]) for category in coco.cats.values())
    return Instances(image_sizes, objects, categories)


def category_word(name: object) -> str:
    """A category's name as the words of a caption are matched: lower case, its words joined by one
    space (``" Traffic  light "`` -> ``"traffic light"``)."""
    return " ".join(str(name).split()).lower()


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


class ImageGrounding(NamedTuple):
    """One image's grounding, one entry per mention in caption order (all empty without mentions).

    Attributes:
        masses: the share of the mention's attention inside the named boxes.
        hits: the strict pointing game's (expected) hit: the most attended cell's centre in a box.
        published_hits: the published pointing game's hit (1.0 or 0.0), :mod:`captioning.evaluation.pointing`.
        classes: the mention's class: the named objects' category (categories joined by ``+`` when a
            word such as a colour names objects of several).
    """

    masses: list[float]
    hits: list[float]
    published_hits: list[float]
    classes: list[str]


def grounding_per_image(
    items: Iterable[tuple[int, Sequence[str], np.ndarray, tuple[int, int]]],
    instances: Instances,
    matcher: WordMatcher,
    tolerance: float = DEFAULT_TOLERANCE,
) -> dict[int, ImageGrounding]:
    """Attention mass in, and pointing-game hits on, the objects that generated words name, per image.

    Args:
        items: ``(image_id, words, attention, grid)`` per image: the T generated words, their
            attention maps (T, gh*gw) (row-major cells) or (T, gh, gw), and grid = (gh, gw).
        instances: the images' boxes (:func:`load_instances`).
        matcher: decides which words name which objects.
        tolerance: the published pointing game's tolerance in pixels.
    Returns:
        image id -> its :class:`ImageGrounding`.
    Raises:
        ValueError: an image without instances, or attention whose shape does not fit words and grid.
    """
    per_image: dict[int, ImageGrounding] = {}
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
        result = ImageGrounding([], [], [], [])
        masks: dict[int, np.ndarray] = {}  # id(object) -> its pixels, decoded once per image
        for index, named in matcher.mentions(words, instances.objects.get(image_id, [])):
            weights = maps[index]  # (gh, gw)
            present = [obj for obj in named if obj.bbox[2] > 0 and obj.bbox[3] > 0]
            boxes = [obj.bbox for obj in present]
            if not boxes:
                continue
            total = weights.sum()
            inside = (weights * box_coverage(boxes, image_size, grid)).sum()
            result.masses.append(float(inside / total) if total > 0 else 0.0)
            peak_rows, peak_cols = np.nonzero(weights >= weights.max() - 1e-9 * abs(weights.max()))
            centres = zip((peak_cols + 0.5) * width / cols, (peak_rows + 0.5) * height / rows, strict=True)
            result.hits.append(
                float(
                    np.mean(
                        [
                            any(x <= cx <= x + w and y <= cy <= y + h for x, y, w, h in boxes)
                            for cx, cy in centres
                        ]
                    )
                )
            )
            for obj in present:
                if id(obj) not in masks:
                    masks[id(obj)] = object_mask(obj.bbox, obj.segmentation, image_size)
            truth = np.logical_or.reduce([masks[id(obj)] for obj in present])  # (H, W)
            result.published_hits.append(float(published_hit(weights, truth, image_size, tolerance)))
            result.classes.append("+".join(sorted({obj.category for obj in present})))
        per_image[image_id] = result
    return per_image


def image_grounding_json(
    grounding: ImageGrounding, classes: bool = False, categories: Sequence[str] = ()
) -> dict[str, float | int | None]:
    """``grounding-mass``, ``grounding-pointing`` (strict) and ``grounding-pointing-published``, the
    means over the mentions (None without any), and ``grounding-words``, how many mentions there
    are; with ``classes``, also the published game's class means: ``grounding-pointing-published-classes``
    over every one of ``categories`` (a category never mentioned counts 0, as TorchRay averages) and
    ``grounding-pointing-published-mentioned-classes`` over the classes mentioned."""
    result: dict[str, float | int | None] = {
        "grounding-mass": float(np.mean(grounding.masses)) if grounding.masses else None,
        "grounding-pointing": float(np.mean(grounding.hits)) if grounding.hits else None,
        "grounding-pointing-published": (
            float(np.mean(grounding.published_hits)) if grounding.published_hits else None
        ),
    }
    if classes:
        result["grounding-pointing-published-classes"] = dataset_class_mean(
            grounding.published_hits, grounding.classes, categories
        )
        result["grounding-pointing-published-mentioned-classes"] = class_mean(
            grounding.published_hits, grounding.classes
        )
    result["grounding-words"] = len(grounding.masses)
    return result


def merged_grounding(per_image: Mapping[int, ImageGrounding]) -> ImageGrounding:
    """Every image's mentions as one :class:`ImageGrounding` (in the images' order)."""
    merged = ImageGrounding([], [], [], [])
    for grounding in per_image.values():
        merged.masses.extend(grounding.masses)
        merged.hits.extend(grounding.hits)
        merged.published_hits.extend(grounding.published_hits)
        merged.classes.extend(grounding.classes)
    return merged


def grounding_scores(
    items: Iterable[tuple[int, Sequence[str], np.ndarray, tuple[int, int]]],
    instances: Instances,
    matcher: WordMatcher,
    tolerance: float = DEFAULT_TOLERANCE,
) -> dict[str, float | int | None]:
    """Attention mass in, and pointing-game hits on, the objects that generated words name.

    Args:
        items, instances, matcher, tolerance: as for :func:`grounding_per_image`.
    Returns:
        ``{"grounding-mass": mean share of attention inside the named boxes, "grounding-pointing":
        share of mentions whose most attended cell centre is inside a named box (the strict rule),
        "grounding-pointing-published": share of mentions whose map maximum is within ``tolerance``
        pixels of a named object's pixels (Zhang et al. 2016), "grounding-pointing-published-classes":
        the same averaged over every category of ``instances`` (0 for one never mentioned),
        "grounding-pointing-published-mentioned-classes": averaged over the classes mentioned,
        "grounding-words": number of mentions counted (one per phrase)}``; the rates are None when
        no word names an object. In the mention means every mention weighs the same, whichever image
        it is in.
    Raises:
        ValueError: an image without instances, or attention whose shape does not fit words and grid.
    """
    per_image = grounding_per_image(items, instances, matcher, tolerance)
    return image_grounding_json(merged_grounding(per_image), classes=True, categories=instances.categories)
