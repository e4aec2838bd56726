"""Shapes: the built-in synthetic captioning dataset, small enough to train on a laptop.

Each image shows 1 to ``max_objects`` non-overlapping coloured shapes on a light, mildly noisy
background. Each gets 5 varied captions that name every object by size, colour and shape and,
for two or more objects, state a spatial relation between two of them that is true for their
box centres (left/right when the horizontal offset dominates, above/below otherwise; placement
keeps the two offsets clearly apart so that the relation is also plain to the eye).

``generate_shapes`` writes, under ``root``:

- ``train/``, ``val/``, ``test/``: the PNG images (``000001.png``, ...; ids count on across splits);
- ``dataset_shapes.json``: Karpathy's split format, read by the same reader as Flickr and COCO;
- ``instances_shapes.json``: COCO instances (a box per object, category = shape word) for grounding;
- ``captions_{split}.json``: COCO caption files, the references of the evaluation tools;
- ``shapes_manifest.json``: the generation parameters; a folder with the same ones is reused.

Everything is a function of the parameters: the same seed gives the same bytes in every file.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image, ImageDraw

from captioning.config import DataConfig, ShapesDataConfig
from captioning.config.data import SHAPE_CLASSES
from captioning.data.karpathy import read_karpathy
from captioning.data.readers import DatasetReader, check_data_paths, own_tokenizer, register_reader
from captioning.data.records import DatasetError, ImageRecord
from captioning.data.tokenizers import tokenize
from captioning.utils.files import atomic_write, refuse_links
from captioning.utils.json_files import read_json_file

logger = logging.getLogger(__name__)

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
SPLITS = ("train", "val", "test")
CAPTIONS_PER_IMAGE = 5
FORMAT_VERSION = 2  # raise when the output for given parameters changes, so old folders are regenerated

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
MAX_OBJECTS = 3


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


@dataclass(frozen=True)
class ShapesFiles:
    """The files of a generated Shapes folder."""

    root: Path
    split_file: Path  # dataset_shapes.json (Karpathy format), as DataConfig.split_file
    instances: Path  # instances_shapes.json (COCO instances), as DataConfig.instances
    captions: dict[str, Path]  # split -> captions_{split}.json (COCO captions)
    manifest: Path  # shapes_manifest.json (generation parameters)


class _GeneratedImage(NamedTuple):
    image_id: int
    split: str
    objects: list[ShapeObject]
    captions: list[str]


def relation(first: ShapeObject, second: ShapeObject) -> str:
    """Where ``first`` is relative to ``second``: ``left``, ``right``, ``above`` or ``below`` (by centres)."""
    (x1, y1), (x2, y2) = first.center, second.center
    dx, dy = x1 - x2, y1 - y2
    if abs(dx) > abs(dy):
        return "left" if dx < 0 else "right"
    return "above" if dy < 0 else "below"


def shapes_files(root: str | Path) -> ShapesFiles:
    """The file paths of a Shapes folder (generated or not)."""
    root = Path(root)
    return ShapesFiles(
        root=root,
        split_file=root / "dataset_shapes.json",
        instances=root / "instances_shapes.json",
        captions={split: root / f"captions_{split}.json" for split in SPLITS},
        manifest=root / "shapes_manifest.json",
    )


def generate_shapes(
    root: str | Path,
    seed: int = 0,
    num_train: int = 2000,
    num_val: int = 200,
    num_test: int = 200,
    image_size: int = 224,
    max_objects: int = 3,
) -> ShapesFiles:
    """Write the Shapes dataset under ``root``, or reuse it if it was written with the same parameters.

    Args:
        root: output folder (created).
        seed: everything (objects, colours, positions, noise, caption wording) follows from it.
        num_train, num_val, num_test: images per split.
        image_size: side of the square images in pixels (>= 32).
        max_objects: objects per image are drawn uniformly from 1..max_objects (1 to ``MAX_OBJECTS``).
    Returns:
        The paths of the written files.
    """
    if not 1 <= max_objects <= MAX_OBJECTS:
        raise ValueError(f"max_objects must be between 1 and {MAX_OBJECTS}, got {max_objects}")
    if image_size < 32:
        raise ValueError(f"image_size must be >= 32, got {image_size}")
    counts = {"train": num_train, "val": num_val, "test": num_test}
    parameters = {
        "format_version": FORMAT_VERSION,
        "seed": seed,
        "image_size": image_size,
        "max_objects": max_objects,
    }

    def place(rng: np.random.Generator, split: str) -> list[ShapeObject]:
        return _place_objects(rng, image_size, max_objects)

    return write_shapes(root, parameters, counts, place)


ObjectPlacer = Callable[
    [np.random.Generator, str], list[ShapeObject]
]  # (rng, split) -> objects, drawn in order


def write_shapes(
    root: str | Path, parameters: dict[str, Any], counts: dict[str, int], place: ObjectPlacer
) -> ShapesFiles:
    """Write a Shapes folder whose objects ``place`` chooses, or reuse one written with the same parameters.

    Args:
        root: output folder (created).
        parameters: the generation parameters, kept in the manifest; ``seed`` and ``image_size`` are
            read from them, and every other entry tells one folder from another (a variant's options).
        counts: split -> images.
        place: an image's objects from its generator and split, in drawing order (a later object
            covers an earlier one where they overlap).
    Returns:
        The paths of the written files.
    """
    files = shapes_files(root)
    seed, image_size = parameters["seed"], parameters["image_size"]
    parameters = {**parameters, **{f"num_{split}": counts[split] for split in SPLITS}}
    layout = _image_layout(counts)
    _refuse_links(files, layout)
    if _is_complete(files, parameters, layout):
        return files
    logger.info("generating Shapes (%d images, seed %d) in %s", len(layout), seed, files.root)
    files.manifest.unlink(missing_ok=True)  # an interrupted run must not look complete
    for split in SPLITS:
        (files.root / split).mkdir(parents=True, exist_ok=True)
    images = []
    for image_id, split, position in layout:
        rng = np.random.default_rng([seed, SPLITS.index(split), position])
        objects = place(rng, split)
        image = _render(objects, rng, image_size)
        image.save(files.root / _relative_path(split, image_id), format="PNG", compress_level=1)
        images.append(_GeneratedImage(image_id, split, objects, _captions(objects, rng)))
    _write_json(files.split_file, _karpathy_json(images))
    _write_json(files.instances, _instances_json(images, image_size))
    for split in SPLITS:
        _write_json(files.captions[split], _captions_json(images, split, image_size))
    _write_json(files.manifest, parameters)
    return files


def read_shapes(root: str | Path, tokenizer: Callable[[str], list[str]] | None = None) -> list[ImageRecord]:
    """Read a generated Shapes folder through the Karpathy reader (the path real datasets take);
    ``tokenizer``: as for :func:`read_karpathy` (None: the file's PTB tokens)."""
    return read_karpathy(shapes_files(root).split_file, root, tokenizer=tokenizer)


@register_reader("shapes", ShapesDataConfig)
class ShapesReader(DatasetReader):
    """Shapes under ``data.root``, generated there first unless a folder with the same ``data.shapes_*``
    parameters is there already."""

    writes_root = True

    def read(self, config: DataConfig) -> list[ImageRecord]:
        check_data_paths(config)
        self.generate(config)
        return read_shapes(config.root, own_tokenizer(config))

    def generate(self, config: DataConfig) -> None:
        """Write the dataset under ``config.root`` unless it is there already with these options."""
        assert isinstance(config, ShapesDataConfig)  # data.dataset shapes is read into its own class
        generate_shapes(
            config.root,
            seed=config.shapes_seed,
            num_train=config.shapes_train,
            num_val=config.shapes_val,
            num_test=config.shapes_test,
            image_size=config.shapes_image_size,
            max_objects=config.shapes_max_objects,
        )

    def default_instances(self, config: DataConfig) -> tuple[Path, ...]:
        """Shapes writes its own boxes (``instances.json``) beside the images."""
        return (shapes_files(config.root).instances,)

    def check_readable(self, config: DataConfig, generate: bool) -> None:
        if not generate and not shapes_files(config.root).manifest.is_file():
            raise DatasetError(
                f"{config.root}: no Shapes data there (data.root from the checkpoint is only read, "
                "never written to); pass --set data.root=DIR to read or generate it in DIR"
            )


def _image_layout(counts: dict[str, int]) -> list[tuple[int, str, int]]:
    """``(image_id, split, position in split)`` for every image; ids run 1..N over train, val, test."""
    layout = [(split, position) for split in SPLITS for position in range(counts[split])]
    return [(image_id, split, position) for image_id, (split, position) in enumerate(layout, start=1)]


def _file_name(image_id: int) -> str:
    return f"{image_id:06d}.png"


def _relative_path(split: str, image_id: int) -> str:
    """The image file relative to the root: the split's folder, then the file name."""
    return f"{split}/{_file_name(image_id)}"


def _refuse_links(files: ShapesFiles, layout: list[tuple[int, str, int]]) -> None:
    """Before the folder is read or written: ``root`` is a folder, and no split folder, image or JSON
    file in it is a link or an odd file (``refuse_links``), which would lead the writes out of it."""
    root, instead = files.root, "set data.root to another folder"
    if root.exists() and not root.is_dir():
        raise DatasetError(f"{root}: not a folder (data.root): Shapes is generated in a folder")
    paths = [files.split_file, files.instances, files.manifest, *files.captions.values()]
    for split in SPLITS:
        refuse_links(root / split, root, folder=True, instead=instead)
    for path in paths + [root / _relative_path(split, image_id) for image_id, split, _ in layout]:
        refuse_links(path, root, instead=instead)


def _is_complete(files: ShapesFiles, parameters: dict[str, Any], layout: list[tuple[int, str, int]]) -> bool:
    try:
        manifest = read_json_file(files.manifest)
    except (OSError, ValueError):
        return False
    needed = [files.split_file, files.instances, *files.captions.values()]
    needed += [files.root / _relative_path(split, image_id) for image_id, split, _ in layout]
    return manifest == parameters and all(path.is_file() for path in needed)


def _place_objects(rng: np.random.Generator, image_size: int, max_objects: int) -> list[ShapeObject]:
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


def _render(objects: list[ShapeObject], rng: np.random.Generator, image_size: int) -> Image.Image:
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


def _shape_area(obj: ShapeObject) -> float:
    side = obj.box[2]
    return {"circle": math.pi * side * side / 4, "square": float(side * side)}.get(obj.shape, side * side / 2)


def _phrase(obj: ShapeObject, with_size: bool) -> str:
    """``"small red circle"`` or ``"red circle"``."""
    return " ".join(([obj.size] if with_size else []) + [obj.color, obj.shape])


def _salience_order(objects: list[ShapeObject]) -> list[ShapeObject]:
    """Large objects first, then from left to right: the order every caption names them in."""
    return sorted(objects, key=lambda obj: (obj.size != "large", obj.center[0], obj.center[1]))


def _captions(objects: list[ShapeObject], rng: np.random.Generator) -> list[str]:
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


def _karpathy_json(images: list[_GeneratedImage]) -> dict:
    entries, sentence_id = [], 0
    for position, (image_id, split, _, captions) in enumerate(images):
        sentences = [
            {"tokens": tokenize(raw), "raw": raw, "imgid": position, "sentid": sentence_id + k}
            for k, raw in enumerate(captions)
        ]
        entries.append(
            {
                "filepath": split,
                "filename": _file_name(image_id),
                "imgid": position,
                "cocoid": image_id,
                "split": split,
                "sentids": [s["sentid"] for s in sentences],
                "sentences": sentences,
            }
        )
        sentence_id += len(sentences)
    return {"dataset": "shapes", "images": entries}


def _coco_image(image_id: int, split: str, image_size: int) -> dict:
    return {
        "id": image_id,
        "file_name": _relative_path(split, image_id),
        "width": image_size,
        "height": image_size,
    }


def _instances_json(images: list[_GeneratedImage], image_size: int) -> dict:
    annotations: list[dict[str, Any]] = []
    for image_id, _, objects, _ in images:
        for obj in objects:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": SHAPE_WORDS.index(obj.shape) + 1,
                    "bbox": list(obj.box),
                    "area": round(_shape_area(obj), 2),
                    "iscrowd": 0,
                    "color": obj.color,
                    "size": obj.size,
                    **({"covered": round(obj.covered, 4)} if obj.covered > 0 else {}),
                }
            )
    return {
        "info": {"description": "Shapes synthetic dataset: object boxes"},
        "licenses": [],
        "images": [_coco_image(image_id, split, image_size) for image_id, split, _, _ in images],
        "annotations": annotations,
        "categories": [
            {"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(SHAPE_WORDS)
        ],
    }


def _captions_json(images: list[_GeneratedImage], split: str, image_size: int) -> dict:
    in_split = [(image_id, captions) for image_id, image_split, _, captions in images if image_split == split]
    annotations = [
        {"id": image_id * CAPTIONS_PER_IMAGE + k, "image_id": image_id, "caption": caption}
        for image_id, captions in in_split
        for k, caption in enumerate(captions)
    ]
    return {
        "info": {"description": f"Shapes synthetic dataset: {split} captions"},
        "licenses": [],
        "images": [_coco_image(image_id, split, image_size) for image_id, _ in in_split],
        "annotations": annotations,
    }


def _write_json(path: Path, data: dict) -> None:
    """Write deterministic JSON (sorted keys) atomically (``atomic_write``, the project's one writer)."""
    text = json.dumps(data, sort_keys=True)
    atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
