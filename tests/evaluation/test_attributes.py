"""Attribute hallucination: each colour-size-shape phrase of a caption judged against the image's objects.

Hand-computed cases on an instances file with attributes, then Shapes' own files: its references
describe every object right, and the same references with each colour swapped describe none.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from captioning.data.shapes import generate_shapes, read_shapes
from captioning.data.tokenizers import tokenize
from captioning.evaluation.attributes import add_attributes, attribute_hallucination, attribute_line
from captioning.evaluation.chair_table import chair_table
from captioning.evaluation.grounding import load_instances
from captioning.evaluation.hallucination import chair
from captioning.evaluation.ratios import chair_statistics, ratio_statistics
from captioning.evaluation.runner import add_boxed_scores, summary_lines

# image 1: a small red square and a large blue circle; image 2: a large green triangle.
OBJECTS = {
    1: [("square", {"color": "red", "size": "small"}), ("circle", {"color": "blue", "size": "large"})],
    2: [("triangle", {"color": "green", "size": "large"})],
}
CATEGORIES = ["circle", "square", "triangle", "diamond"]


def write_instances(path: Path, objects=OBJECTS) -> Path:
    ids = {name: i + 1 for i, name in enumerate(CATEGORIES)}
    annotations = [
        {
            "image_id": image_id,
            "category_id": ids[category],
            "bbox": [0, 0, 10, 10],
            "iscrowd": 0,
            **attributes,
        }
        for image_id, items in objects.items()
        for category, attributes in items
    ]
    path.write_text(
        json.dumps(
            {
                "images": [{"id": i, "width": 64, "height": 64} for i in objects],
                "categories": [{"id": i, "name": name} for name, i in ids.items()],
                "annotations": [dict(a, id=k + 1) for k, a in enumerate(annotations)],
            }
        )
    )
    return path


@pytest.fixture
def instances(tmp_path):
    return load_instances(write_instances(tmp_path / "instances.json"))


def judge(instances, captions: dict[int, str], table: str = "released"):
    result = attribute_hallucination(
        {i: tokenize(c) for i, c in captions.items()}, instances, chair_table(table)
    )
    assert result is not None
    return result


@pytest.mark.parametrize("table", ["released", "extended"])
def test_a_wrong_colour_is_a_wrong_phrase_that_chair_does_not_see(instances, table):
    captions = {1: "a small green square above a large blue circle", 2: "a large green triangle"}
    result = judge(instances, captions, table)
    one, two = result.per_image[1].to_json(), result.per_image[2].to_json()
    assert one["wrong-phrases"] == ["small green square"]
    assert (one["attribute-phrases"], one["attribute-correct"]) == (2, 1)
    assert (one["attribute-objects"], one["attribute-recalled"]) == (2, 1)  # the square is not described
    assert two["wrong-phrases"] == [] and two["attribute-recalled"] == 1
    overall = result.to_json()
    assert overall["attribute-precision"] == pytest.approx(2 / 3)
    assert overall["attribute-recall"] == pytest.approx(2 / 3)
    assert overall["attribute-wrong"] == pytest.approx(1 / 2) and overall["attribute-wrong-captions"] == 1
    # CHAIR finds nothing wrong: a square and a circle are both in image 1.
    hallucination = chair({i: tokenize(c) for i, c in captions.items()}, {}, instances, chair_table(table))
    assert hallucination.to_json()["CHAIR-hallucinated"] == 0


def test_each_attribute_and_the_object_itself_can_be_wrong(instances):
    result = judge(
        instances,
        {
            1: "a large red square and a small blue circle and a red triangle",  # size, size, no triangle
            2: "a green triangle",  # size left out: not wrong, and it describes the triangle
        },
    )
    assert result.per_image[1].wrong == ["large red square", "small blue circle", "red triangle"]
    assert result.per_image[1].recalled == 0
    assert result.per_image[2].wrong == [] and result.per_image[2].recalled == 1


def test_only_words_right_before_the_object_are_its_attributes(instances):
    result = judge(
        instances,
        {
            1: "the square is green and blue circles",  # "green" does not precede "square"; plural read
            2: "two shapes",  # no mention, no phrase
        },
    )
    assert [p.text for p in result.per_image[1].phrases] == ["blue circle"]
    assert result.per_image[1].wrong == [] and result.per_image[1].recalled == 1
    assert result.per_image[2].phrases == [] and result.per_image[2].to_json()["attribute-precision"] is None


def test_instances_without_attributes_give_no_attribute_scores(tmp_path):
    bare = {i: [(category, {}) for category, _ in items] for i, items in OBJECTS.items()}
    boxes = load_instances(write_instances(tmp_path / "bare.json", bare))
    assert attribute_hallucination({1: tokenize("a red square")}, boxes, chair_table("released")) is None
    scores: dict = {"per_image": [{"image_id": 1}]}
    add_attributes(scores, {1: tokenize("a red square")}, boxes, chair_table("released"))
    assert scores == {"per_image": [{"image_id": 1}]}


def test_scores_carry_the_numbers_per_image_and_in_the_summary(instances):
    words = {
        1: tokenize("a small green square above a large blue circle"),
        2: tokenize("a large green triangle"),
    }
    result: dict = {"per_image": [{"image_id": 1}, {"image_id": 2}, {"image_id": 9}]}
    add_boxed_scores(result, instances, words, {1: [], 2: []})
    assert result["attribute-images"] == 2 and result["attribute-precision"] == pytest.approx(2 / 3)
    assert result["per_image"][0]["wrong-phrases"] == ["small green square"]
    assert "attribute-phrases" not in result["per_image"][2]  # no boxes for image 9
    line = attribute_line(result)
    assert line.startswith("attribute hallucination: ")
    for number in (
        "precision 0.6667",
        "2 of 3 phrases",
        "recall 0.6667",
        "2 of 3 objects",
        "1 of 2 captions",
    ):
        assert number in line, (number, line)
    assert line in summary_lines({**result, "signature": "s"}, 3)
    # --compare rebuilds the same ratios from the per-image entries, or from the captions themselves.
    stored = ratio_statistics(result["per_image"][:2], [1, 2])
    computed = chair_statistics(words, {1: [], 2: []}, instances, [1, 2])
    for metric, value in (
        ("attribute-precision", 2 / 3),
        ("attribute-recall", 2 / 3),
        ("attribute-wrong", 0.5),
    ):
        np.testing.assert_array_equal(stored[metric], computed[metric])
        assert stored[metric][:, 0].sum() / stored[metric][:, 1].sum() == pytest.approx(value)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    files = generate_shapes(
        tmp_path_factory.mktemp("shapes"), seed=3, num_train=2, num_val=2, num_test=40, image_size=64
    )
    return files, [record for record in read_shapes(files.root) if record.split == "test"]


def test_shapes_references_describe_every_object_right(shapes):
    files, records = shapes
    boxes = load_instances(files.instances)
    for k in range(5):
        result = attribute_hallucination(
            {r.image_id: tokenize(r.raw[k]) for r in records}, boxes, chair_table("released")
        )
        assert result is not None
        overall = result.to_json()
        objects = sum(len(boxes.objects[r.image_id]) for r in records)
        assert overall["attribute-objects"] == objects and overall["attribute-phrases"] == objects
        assert overall["attribute-precision"] == overall["attribute-recall"] == 1.0
        assert overall["attribute-wrong"] == 0.0


def test_shapes_references_with_swapped_colours_are_caught(shapes):
    files, records = shapes
    boxes = load_instances(files.instances)
    swap = {"red": "green", "green": "blue", "blue": "yellow", "yellow": "purple", "purple": "red"}
    captions = {r.image_id: [swap.get(t, t) for t in tokenize(r.raw[0])] for r in records}
    result = attribute_hallucination(captions, boxes, chair_table("released"))
    assert result is not None
    for record in records:
        image = result.per_image[record.image_id]
        objects = boxes.objects[record.image_id]
        # A swapped phrase is wrong exactly when no object of the image has its shape, the swapped
        # colour and the size it names (if it names one).
        expected = [
            phrase.text
            for phrase in image.phrases
            if not any(
                obj.category == phrase.category
                and {word for word, _ in phrase.attributes}
                <= {obj.attributes["color"], obj.attributes["size"]}
                for obj in objects
            )
        ]
        assert image.wrong == expected and len(image.phrases) == len(objects)
    assert result.to_json()["attribute-wrong"] > 0.5
