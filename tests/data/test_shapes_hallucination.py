"""The hallucination testbed (``data.dataset=shapes_hallucination``): the co-occurrence prior holds in
train and val and is broken in test, its partner is small and partly covered, every box and covered
share is what the pixels show, and the same seed gives the same bytes."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from messages import raises_naming
from PIL import Image

from captioning.config import ConfigError, ShapesHallucinationDataConfig
from captioning.config.loading import load_config, parse_overrides
from captioning.data.shapes_hallucination import CoOccurrence, generate_shapes_hallucination
from captioning.data.shapes_scenes import _COLOR_RGB
from captioning.data.tokenizers import tokenize

SIZES = {"num_train": 120, "num_val": 10, "num_test": 40, "image_size": 96}


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory):
    return generate_shapes_hallucination(tmp_path_factory.mktemp("testbed"), seed=3, **SIZES)


def _images(files) -> dict[int, dict]:
    """image id -> {"split", "file", "objects": [annotation, ...], "captions": [...]}, from the files."""
    instances = json.loads(files.instances.read_text())
    names = {c["id"]: c["name"] for c in instances["categories"]}
    images: dict[int, dict] = {
        i["id"]: {
            "split": i["file_name"].split("/")[0],
            "file": i["file_name"],
            "objects": [],
            "captions": [],
        }
        for i in instances["images"]
    }
    for annotation in instances["annotations"]:
        images[annotation["image_id"]]["objects"].append(
            {**annotation, "name": names[annotation["category_id"]]}
        )
    for path in files.captions.values():
        for annotation in json.loads(path.read_text())["annotations"]:
            images[annotation["image_id"]]["captions"].append(annotation["caption"])
    return images


def test_the_prior_holds_in_train_and_val_and_is_broken_in_test(testbed):
    by_split = defaultdict(list)
    for image in _images(testbed).values():
        by_split[image["split"]].append({obj["name"] for obj in image["objects"]})
    seen = by_split["train"] + by_split["val"]
    with_circle = [classes for classes in seen if "circle" in classes]
    # P(square | circle) is the prior (0.95): at least 90% of ~65 images; squares also come alone
    assert len(with_circle) > 40
    assert sum("square" in classes for classes in with_circle) / len(with_circle) >= 0.9
    assert any("square" in classes and "circle" not in classes for classes in seen)
    assert len(by_split["test"]) == SIZES["num_test"]
    assert all("circle" in classes and "square" not in classes for classes in by_split["test"])
    decoys = sum(bool(classes & {"triangle", "diamond"}) for classes in by_split["test"])
    assert 0 < decoys < len(by_split["test"])


def test_the_partner_is_small_and_partly_under_the_circle(testbed):
    partners = 0
    for image in _images(testbed).values():
        circles = [obj for obj in image["objects"] if obj["name"] == "circle"]
        for obj in image["objects"]:
            if obj["name"] == "square" and circles:
                partners += 1
                x, y, w, h = obj["bbox"]
                cx, cy, cw, ch = circles[0]["bbox"]
                assert obj["size"] == "small" and w <= round(0.13 * 96 * 1.06) + 1
                assert x < cx + cw and cx < x + w and y < cy + ch and cy < y + h  # the boxes overlap
                assert 0.2 <= obj["covered"] <= 0.8, obj  # around 0.5 (+-0.15, nearest offset)
    assert partners > 30


def test_boxes_and_covered_shares_are_what_the_pixels_show(testbed):
    """Each object's visible pixels (its colour, within its box) fill its shape less the covered share,
    and none of its colour's pixels lie outside its box except another object's."""
    checked = 0
    for image in list(_images(testbed).values())[:60]:
        pixels = np.asarray(Image.open(testbed.root / image["file"]), dtype=np.int16)  # (S, S, 3)
        for obj in image["objects"]:
            near = np.abs(pixels - np.array(_COLOR_RGB[obj["color"]])).max(axis=2) <= 20  # (S, S)
            x, y, w, h = obj["bbox"]
            inside = near[y : y + h, x : x + w].sum()
            shape_area = {"circle": np.pi * w * w / 4, "square": w * w}.get(obj["name"], w * w / 2)
            visible = inside / shape_area
            assert visible == pytest.approx(1 - obj.get("covered", 0.0), abs=0.08), (image["file"], obj)
            others = [o for o in image["objects"] if o is not obj and o["color"] == obj["color"]]
            if not others:  # nothing else of this colour: no pixel of it outside the box
                assert near.sum() == inside, (image["file"], obj)
            checked += 1
    assert checked > 100


def test_every_caption_names_every_object_as_plain_shapes_does(testbed):
    for image in _images(testbed).values():
        assert len(image["captions"]) == 5
        for caption in image["captions"]:
            words = tokenize(caption)
            for obj in image["objects"]:  # every object, the covered partner too, by colour and shape
                assert any(
                    words[k] == obj["color"] and words[k + 1] == obj["name"] for k in range(len(words) - 1)
                ), (caption, obj)


def test_the_same_seed_gives_the_same_bytes(tmp_path, testbed):
    def digest(root: Path) -> str:
        hashed = hashlib.sha256()
        for path in sorted(root.rglob("*")):
            if path.is_file():
                hashed.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
        return hashed.hexdigest()

    again = generate_shapes_hallucination(tmp_path / "again", seed=3, **SIZES)
    assert digest(again.root) == digest(testbed.root)
    other = generate_shapes_hallucination(tmp_path / "other", seed=4, **SIZES)
    assert digest(other.root) != digest(testbed.root)
    weaker = generate_shapes_hallucination(tmp_path / "weaker", CoOccurrence(prior=0.5), seed=3, **SIZES)
    assert json.loads(weaker.manifest.read_text())["co_occurrence_prior"] == 0.5


def test_the_options_are_read_under_their_names_and_checked():
    overrides = parse_overrides(["data.dataset=shapes_hallucination", "data.shapes_prior=0.8"])
    config = load_config(None, overrides)
    assert type(config.data) is ShapesHallucinationDataConfig
    assert config.data.shapes_prior == 0.8 and config.data.root == "data/shapes_hallucination"
    with raises_naming(ConfigError, "data.shapes_partner", "data.shapes_cause"):
        ShapesHallucinationDataConfig(shapes_partner="circle")
    with raises_naming(ConfigError, "data.shapes_cause", "hexagon"):
        ShapesHallucinationDataConfig(shapes_cause="hexagon")
    with raises_naming(ConfigError, "data.shapes_prior", "1.5"):
        ShapesHallucinationDataConfig(shapes_prior=1.5)
    with raises_naming(ConfigError, "data.shapes_max_objects"):
        ShapesHallucinationDataConfig(shapes_max_objects=1)
