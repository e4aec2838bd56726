"""Shapes: the built-in synthetic captioning dataset, small enough to train on a laptop.

Each image shows 1 to ``max_objects`` coloured shapes and gets 5 captions naming them and, for two
or more, how two of them sit (``captioning.data.shapes_scenes`` draws and captions one image).

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from captioning.config import DataConfig, ShapesDataConfig
from captioning.data.karpathy import read_karpathy
from captioning.data.readers import DatasetReader, check_data_paths, own_tokenizer, register_reader
from captioning.data.records import DatasetError, ImageRecord
from captioning.data.shapes_scenes import (
    CAPTIONS_PER_IMAGE,
    COLOR_WORDS,
    MAX_OBJECTS,
    RELATION_PHRASES,
    SHAPE_WORDS,
    ShapeObject,
    captions_for,
    place_objects,
    relation,
    render,
    shape_area,
)
from captioning.data.tokenizers import tokenize
from captioning.utils.files import atomic_write, refuse_links
from captioning.utils.json_files import read_json_file

# The first five are shapes_scenes' (its words, objects and relations), importable from here too.
__all__ = [
    "COLOR_WORDS",
    "RELATION_PHRASES",
    "SHAPE_WORDS",
    "ShapeObject",
    "relation",
    "FORMAT_VERSION",
    "SPLITS",
    "ObjectPlacer",
    "ShapesFiles",
    "ShapesReader",
    "generate_shapes",
    "read_shapes",
    "shapes_files",
    "write_shapes",
]

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
FORMAT_VERSION = 2  # raise when the output for given parameters changes, so old folders are regenerated


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
        return place_objects(rng, image_size, max_objects)

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
        image = render(objects, rng, image_size)
        image.save(files.root / _relative_path(split, image_id), format="PNG", compress_level=1)
        images.append(_GeneratedImage(image_id, split, objects, captions_for(objects, rng)))
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
                    "area": round(shape_area(obj), 2),
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
