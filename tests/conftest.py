"""Shared fixtures: tiny datasets written in each real format, read back through the real readers.

- ``make_image(path, mode="RGB", size=(40, 30))``: write an image (format from the suffix).
- ``write_json(path, data)``: write a JSON file.
- ``karpathy_dataset``: a Karpathy ``dataset_coco.json`` (5 images: train, restval, val, test)
  and its images, as ``(split_file, image_root)``.
- ``coco_dataset``: ``captions_train2014.json`` and ``captions_val2014.json`` in the standard
  ``train2014/COCO_train2014_....jpg`` layout, as ``(annotation_files, image_root)``.
- ``tiny_shapes``: a Shapes folder (12/4/4 images of 64 px), generated once per session.
- ``shapes_records``, ``shapes_vocab``: its records and a vocabulary (min_count 1) counted on train.
- ``process_state`` (every test): puts back what a tool run in this process changes, and every
  registry's entries (tests/tool_runs.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PIL import Image
from tool_runs import kept_process_state, kept_registries

from captioning.data import build_vocabulary
from captioning.data.records import ImageRecord
from captioning.data.shapes import ShapesFiles, generate_shapes, read_shapes
from captioning.data.vocab import Vocabulary

_FILL = {"RGB": (200, 40, 40), "L": 128, "CMYK": (0, 200, 200, 30), "RGBA": (0, 0, 255, 128), "P": 3}


@pytest.fixture
def make_image() -> Callable[..., Path]:
    """Factory: ``make_image(path, mode="RGB", size=(40, 30))`` writes a solid image, creating folders."""

    def make(path: Path, mode: str = "RGB", size: tuple[int, int] = (40, 30)) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new(mode, size, _FILL[mode]).save(path)
        return path

    return make


@pytest.fixture
def write_json() -> Callable[[Path, object], Path]:
    """Factory: ``write_json(path, data)`` writes ``data`` as UTF-8 JSON."""

    def write(path: Path, data: object) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        return path

    return write


def _karpathy_image(imgid: int, cocoid: int, split: str, folder: str, raws: list[str]) -> dict:
    """One image entry in the exact published schema of ``dataset_coco.json``."""
    sentences = [
        {"tokens": raw.lower().replace(".", "").split(), "raw": raw, "imgid": imgid, "sentid": imgid * 10 + k}
        for k, raw in enumerate(raws)
    ]
    return {
        "filepath": folder,
        "filename": f"COCO_{folder}_{cocoid:012d}.jpg",
        "imgid": imgid,
        "cocoid": cocoid,
        "split": split,
        "sentids": [s["sentid"] for s in sentences],
        "sentences": sentences,
    }


@pytest.fixture
def karpathy_dataset(tmp_path: Path, make_image, write_json) -> tuple[Path, Path]:
    image_root = tmp_path / "coco"
    images = [
        _karpathy_image(
            0,
            9,
            "train",
            "train2014",
            [
                "A dog runs on the grass.",
                "A brown dog running.",
                "The dog is outside.",
                "A dog plays.",
                "Dog on grass.",
            ],
        ),
        _karpathy_image(1, 25, "train", "train2014", ["A cat sleeps on a sofa.", "A cat on a couch."]),
        _karpathy_image(2, 30, "restval", "val2014", ["A man rides a horse.", "A horse and its rider."]),
        _karpathy_image(3, 42, "val", "val2014", ["Two birds on a wire.", "Birds sitting on a line."]),
        _karpathy_image(4, 73, "test", "val2014", ["A red bus on a street.", "A bus in the city."]),
    ]
    for entry in images:
        make_image(image_root / entry["filepath"] / entry["filename"], size=(48, 32))
    split_file = write_json(tmp_path / "dataset_coco.json", {"images": images, "dataset": "coco"})
    return split_file, image_root


@pytest.fixture
def coco_dataset(tmp_path: Path, make_image, write_json) -> tuple[list[Path], Path]:
    image_root = tmp_path / "coco"

    def annotation_file(folder: str, image_ids: list[int], captions: dict[int, list[str]]) -> Path:
        images = [
            {
                "id": i,
                "file_name": f"COCO_{folder}_{i:012d}.jpg",
                "width": 48,
                "height": 32,
                "license": 1,
                "coco_url": "",
                "date_captured": "",
                "flickr_url": "",
            }
            for i in image_ids
        ]
        for image in images:
            make_image(image_root / folder / image["file_name"], size=(48, 32))
        annotations = [
            {"image_id": i, "id": i * 100 + k, "caption": caption}
            for i in image_ids
            for k, caption in enumerate(captions[i])
        ]
        data = {
            "info": {"description": "COCO 2014 Dataset"},
            "licenses": [],
            "images": images,
            "annotations": annotations,
        }
        return write_json(tmp_path / "annotations" / f"captions_{folder}.json", data)

    train = annotation_file(
        "train2014",
        [9, 25],
        {9: ["A dog runs on the grass.", "A brown dog, running!"], 25: ["A cat sleeps on a sofa."]},
    )
    val = annotation_file(
        "val2014",
        [30, 42, 73],
        {30: ["A man rides a horse."], 42: ["Two birds on a wire."], 73: ["A red bus on a street."]},
    )
    return [train, val], image_root


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory: pytest.TempPathFactory) -> ShapesFiles:
    return generate_shapes(
        tmp_path_factory.mktemp("shapes"), seed=0, num_train=12, num_val=4, num_test=4, image_size=64
    )


@pytest.fixture(scope="session")
def shapes_records(tiny_shapes: ShapesFiles) -> list[ImageRecord]:
    return read_shapes(tiny_shapes.root)


@pytest.fixture(scope="session")
def shapes_vocab(shapes_records: list[ImageRecord]) -> Vocabulary:
    return build_vocabulary(shapes_records, min_count=1)


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for a module of tiny models: they gain nothing from more, and on a busy
    machine waiting threads spin (10-30x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def process_state() -> Iterator[None]:
    """Puts back, after each test, what a tool run in this process changes for the whole process
    (``tool_runs.kept_process_state``): later tests in the same worker see it as a subprocess would
    have left it; and every registry as it was (``kept_registries``)."""
    with kept_process_state(), kept_registries():
        yield
