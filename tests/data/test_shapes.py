"""Shapes, the built-in synthetic dataset: determinism, caption truth, boxes, and its three file formats."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest
from PIL import Image
from pycocotools.coco import COCO

from captioning.data.coco import read_coco
from captioning.data.shapes import (
    COLOR_WORDS,
    RELATION_PHRASES,
    SHAPE_WORDS,
    SPLITS,
    ShapeObject,
    generate_shapes,
    read_shapes,
    relation,
)

SMALL = {"num_train": 10, "num_val": 3, "num_test": 3, "image_size": 64}
# The word of a relation phrase that tells which relation it is.
RELATION_OF_WORD = {
    "left": "left",
    "right": "right",
    "above": "above",
    "over": "above",
    "below": "below",
    "under": "below",
}


def test_relation_words_cover_every_phrase():
    for name, phrases in RELATION_PHRASES.items():
        for phrase in phrases:
            assert [RELATION_OF_WORD[w] for w in phrase.split() if w in RELATION_OF_WORD] == [name]


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _objects_by_image(instances_file: Path) -> dict[int, list[ShapeObject]]:
    data = json.loads(instances_file.read_text())
    names = {c["id"]: c["name"] for c in data["categories"]}
    objects = defaultdict(list)
    for a in data["annotations"]:
        shape = ShapeObject(names[a["category_id"]], a["color"], a["size"], tuple(a["bbox"]))
        objects[a["image_id"]].append(shape)
    return objects


def test_same_seed_gives_identical_files(tmp_path):
    first = generate_shapes(tmp_path / "a", seed=3, **SMALL)
    second = generate_shapes(tmp_path / "b", seed=3, **SMALL)
    hashes = _hashes(first.root)
    assert len(hashes) == 16 + 6  # images + Karpathy, instances, 3 captions files, manifest
    assert hashes == _hashes(second.root)


def test_different_seed_differs(tmp_path):
    first = _hashes(generate_shapes(tmp_path / "a", seed=0, **SMALL).root)
    second = _hashes(generate_shapes(tmp_path / "b", seed=1, **SMALL).root)
    assert first["dataset_shapes.json"] != second["dataset_shapes.json"]
    assert first["train/000001.png"] != second["train/000001.png"]


def test_existing_folder_is_reused_unless_parameters_change(tmp_path):
    files = generate_shapes(tmp_path, **SMALL)
    written = files.split_file.stat().st_mtime_ns
    generate_shapes(tmp_path, **SMALL)
    assert files.split_file.stat().st_mtime_ns == written
    generate_shapes(tmp_path, **{**SMALL, "num_test": 4})
    assert len(read_shapes(tmp_path)) == 17


def test_splits_sizes_and_images(tiny_shapes, shapes_records):
    counts = {split: sum(r.split == split for r in shapes_records) for split in SPLITS}
    assert counts == {"train": 12, "val": 4, "test": 4}
    assert [r.image_id for r in shapes_records] == list(range(1, 21))
    for record in shapes_records[:3]:
        with Image.open(record.path) as image:
            assert (image.format, image.mode, image.size) == ("PNG", "RGB", (64, 64))
        assert record.path.parent.name == record.split


def test_five_distinct_captions_name_every_object(tiny_shapes, shapes_records):
    objects = _objects_by_image(tiny_shapes.instances)
    for record in shapes_records:
        assert len(record.captions) == 5 and len(set(record.captions)) == 5
        for caption in record.captions:
            bigrams = set(pairwise(caption))
            for obj in objects[record.image_id]:
                assert (obj.color, obj.shape) in bigrams, (caption, obj)


def test_relations_in_captions_agree_with_boxes(tiny_shapes, shapes_records):
    objects = _objects_by_image(tiny_shapes.instances)
    checked = 0
    for record in shapes_records:
        by_words = {(o.color, o.shape): o for o in objects[record.image_id]}
        for caption in record.captions:
            spots = [i for i, word in enumerate(caption) if word in RELATION_OF_WORD]
            if len(objects[record.image_id]) == 1:
                assert not spots, caption
                continue
            if not spots:
                continue
            (spot,) = spots
            before = [by_words[pair] for pair in pairwise(caption[:spot]) if pair in by_words]
            after = [by_words[pair] for pair in pairwise(caption[spot + 1 :]) if pair in by_words]
            assert relation(before[-1], after[0]) == RELATION_OF_WORD[caption[spot]], caption
            checked += 1
    assert checked > 10


def test_relation_uses_dominant_offset():
    left = ShapeObject("circle", "red", "small", (0, 0, 10, 10))
    assert relation(left, ShapeObject("square", "blue", "small", (30, 10, 10, 10))) == "left"
    assert relation(left, ShapeObject("square", "blue", "small", (10, 30, 10, 10))) == "above"
    assert relation(ShapeObject("square", "blue", "small", (10, 30, 10, 10)), left) == "below"


def test_boxes_inside_image_and_apart(tiny_shapes):
    for boxes in _objects_by_image(tiny_shapes.instances).values():
        assert 1 <= len(boxes) <= 3
        for obj in boxes:
            x, y, w, h = obj.box
            assert 0 <= x and 0 <= y and x + w <= 64 and y + h <= 64
            assert obj.shape in SHAPE_WORDS and obj.color in COLOR_WORDS
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                (ax, ay, aw, ah), (bx, by, bw, bh) = a.box, b.box
                assert ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay


def test_instances_and_captions_files_load_with_pycocotools(tiny_shapes, shapes_records):
    with contextlib.redirect_stdout(io.StringIO()):
        instances = COCO(str(tiny_shapes.instances))
        val = COCO(str(tiny_shapes.captions["val"]))
    assert [c["name"] for c in instances.loadCats(instances.getCatIds())] == list(SHAPE_WORDS)
    assert len(instances.getImgIds()) == 20
    assert all(a["iscrowd"] == 0 and a["area"] > 0 for a in instances.dataset["annotations"])
    assert (tiny_shapes.root / instances.imgs[1]["file_name"]).is_file()
    assert sorted(val.getImgIds()) == [r.image_id for r in shapes_records if r.split == "val"]


def test_coco_reader_on_captions_files_matches_karpathy_reader(tiny_shapes, shapes_records):
    from_coco = read_coco(tiny_shapes.captions.values(), tiny_shapes.root)
    assert [(r.image_id, r.path, r.split, r.captions) for r in from_coco] == [
        (r.image_id, r.path, r.split, r.captions) for r in shapes_records
    ]


def test_single_object_images(tmp_path):
    records = read_shapes(generate_shapes(tmp_path, max_objects=1, **SMALL).root)
    for record in records:
        assert not any(word in RELATION_OF_WORD for caption in record.captions for word in caption)


def test_bad_parameters(tmp_path):
    with pytest.raises(ValueError, match="max_objects"):
        generate_shapes(tmp_path, max_objects=5)
    with pytest.raises(ValueError, match="image_size"):
        generate_shapes(tmp_path, image_size=16)
