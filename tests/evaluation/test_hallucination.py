"""CHAIR object hallucination: hand-computed values on captions with synonyms, plurals and phrases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captioning.data.tokenizers import tokenize
from captioning.evaluation.grounding import load_instances
from captioning.evaluation.hallucination import add_per_image, chair, chair_line
from captioning.evaluation.runner import load_boxes

# Every category named below except horse, so that "horse" is outside the vocabulary CHAIR counts.
CATEGORIES = ["person", "dog", "couch", "teddy bear", "bear", "hot dog", "cell phone", "car", "dining table"]
OBJECTS = {1: ["person", "dog"], 2: ["dining table", "hot dog"], 3: [], 4: ["person"]}
REFERENCES = {
    1: ["A man and his dog on a couch."],  # the couch is in the image through its reference only
    2: ["A hot dog on a plate."],
    3: ["An empty street at night."],
    4: ["A man leads a horse."],
}
CAPTIONS = {
    # person (women), dog (puppies), couch (sofa), teddy bear (not also a bear): the teddy bear is made up
    1: "two women and their puppies sit on a sofa next to a teddy bear",
    # hot dog (not a dog), cell phone (two words), dining table (table), car (cars): phone and cars made up
    2: "a hot dog and a cell phone on a table with cars",
    3: "an empty street",
    # person twice; horse is no category of this instances file, so it counts for nothing
    4: "a man and a woman riding a horse",
}


def write_instances(path: Path, categories: list[str], objects: dict[int, list[str]]) -> Path:
    ids = {name: index + 1 for index, name in enumerate(categories)}
    annotations = [
        {"id": len(objects) * 10 + n, "image_id": image_id, "category_id": ids[name], "bbox": [0, 0, 10, 10]}
        for image_id, names in objects.items()
        for n, name in enumerate(names)
    ]
    path.write_text(
        json.dumps(
            {
                "images": [{"id": image_id, "width": 100, "height": 100} for image_id in objects],
                "categories": [{"id": i, "name": name} for name, i in ids.items()],
                "annotations": [dict(a, id=k + 1) for k, a in enumerate(annotations)],
            }
        )
    )
    return path


@pytest.fixture
def instances(tmp_path: Path):
    return load_instances(write_instances(tmp_path / "instances.json", CATEGORIES, OBJECTS))


def run_chair(instances, captions=CAPTIONS, references=REFERENCES):
    return chair(
        {i: tokenize(c) for i, c in captions.items()},
        {i: [tokenize(r) for r in refs] for i, refs in references.items()},
        instances,
    )


def test_chair_hand_computed(instances):
    result = run_chair(instances)
    # mentions: 4 + 4 + 0 + 2 = 10; hallucinated: teddy bear, cell phone, car = 3; captions with one: 1, 2
    assert result.to_json() == {
        "CHAIR-i": pytest.approx(3 / 10),
        "CHAIR-s": pytest.approx(2 / 4),
        "CHAIR-mentions": 10,
        "CHAIR-hallucinated": 3,
    }
    assert result.per_image[1].mentioned == ["person", "dog", "couch", "teddy bear"]
    assert result.per_image[1].hallucinated == ["teddy bear"]
    assert result.per_image[2].mentioned == ["hot dog", "cell phone", "dining table", "car"]
    assert result.per_image[2].hallucinated == ["cell phone", "car"]
    assert result.per_image[4].mentioned == ["person", "person"]
    assert result.per_image[2].to_json() == {
        "CHAIR-i": 0.5,
        "CHAIR-s": 1.0,
        "hallucinated": ["cell phone", "car"],
        "CHAIR-mentions": 4,
    }
    assert result.per_image[3].to_json() == {
        "CHAIR-i": None,
        "CHAIR-s": 0.0,
        "hallucinated": [],
        "CHAIR-mentions": 0,
    }


def test_reference_mentions_count_as_present(instances):
    """Without its reference, image 1's couch (named only there) becomes a hallucination."""
    result = run_chair(instances, references={i: r for i, r in REFERENCES.items() if i != 1})
    assert result.per_image[1].hallucinated == ["couch", "teddy bear"]


def test_shapes_category_names(tmp_path: Path):
    """A dataset's own category names (Shapes' shape words) name their objects, plurals included."""
    shapes = load_instances(
        write_instances(
            tmp_path / "shapes.json",
            ["circle", "square", "triangle", "diamond"],
            {7: ["circle", "circle"], 8: ["square"]},
        )
    )
    result = chair(
        {7: tokenize("two red circles and a blue square"), 8: tokenize("a man and a green square")},
        {7: [tokenize("two red circles")]},
        shapes,
    )
    assert result.per_image[7].mentioned == ["circle", "square"]
    assert result.per_image[7].hallucinated == ["square"]
    assert result.per_image[8].mentioned == ["square"]  # "man" names no Shapes category
    assert result.to_json()["CHAIR-s"] == 0.5


def test_per_image_entries_gain_chair_fields(instances):
    result = run_chair(instances)
    entries = add_per_image([{"image_id": 2, "CIDEr-D": 1.5}], result)
    assert entries == [
        {
            "image_id": 2,
            "CIDEr-D": 1.5,
            "CHAIR-i": 0.5,
            "CHAIR-s": 1.0,
            "hallucinated": ["cell phone", "car"],
            "CHAIR-mentions": 4,
        }
    ]


def test_image_missing_from_instances(instances):
    with pytest.raises(ValueError, match="image 99"):
        chair({99: ["a", "dog"]}, {}, instances)


def test_several_instances_files_count_every_files_categories(tmp_path: Path):
    """Through ``load_boxes``, a category of the second file that no image holds still counts."""
    first = write_instances(tmp_path / "train.json", ["person", "dog"], {1: ["person", "dog"]})
    second = write_instances(tmp_path / "val.json", ["person", "dog", "car"], {2: ["dog"]})  # no car anywhere
    boxes = load_boxes([first, second])
    assert boxes.categories == ("person", "dog", "car")
    result = chair({1: tokenize("a man and a dog in a car"), 2: tokenize("a dog")}, {}, boxes)
    assert result.per_image[1].mentioned == ["person", "dog", "car"]
    assert result.per_image[1].hallucinated == ["car"]


def test_chair_line_without_covered_images():
    scores = {
        "CHAIR-i": None,
        "CHAIR-s": None,
        "CHAIR-mentions": 0,
        "CHAIR-hallucinated": 0,
        "CHAIR-images": 0,
    }
    assert chair_line(scores) == "object hallucination: none of the images has boxes in the instances files"
    assert chair_line({"CIDEr-D": 1.0}) is None
