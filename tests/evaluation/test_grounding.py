"""Attention grounding: hand-made attention maps with known answers, word matching, instances files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from messages import raises_naming

from captioning.evaluation.coco_files import EvaluationInputError
from captioning.evaluation.grounding import (
    Instances,
    ObjectBox,
    WordMatcher,
    box_coverage,
    grounding_scores,
    load_instances,
)


def one_image(*objects: ObjectBox, size: tuple[float, float] = (100.0, 100.0)) -> Instances:
    categories = tuple(sorted({obj.category for obj in objects}))  # the file's: those of its objects
    return Instances(image_sizes={1: size}, objects={1: list(objects)}, categories=categories)


def peak(grid: tuple[int, int], *cells_and_weights: tuple[int, int, float]) -> np.ndarray:
    """A (gh, gw) attention map with the given weights in the given cells."""
    weights = np.zeros(grid)
    for row, col, weight in cells_and_weights:
        weights[row, col] = weight
    return weights


def score(instances: Instances, words: list[str], maps: list[np.ndarray], grid: tuple[int, int]) -> dict:
    return grounding_scores([(1, words, np.stack(maps), grid)], instances, WordMatcher())


# Every rate 1 (the published pointing game hits too: the maximum lies in the box), or every rate None.
HIT = dict.fromkeys(
    [
        "grounding-mass",
        "grounding-pointing",
        "grounding-pointing-published",
        "grounding-pointing-published-classes",
        "grounding-pointing-published-mentioned-classes",
    ],
    1.0,
)
NONE = dict.fromkeys(HIT)

DOG = ObjectBox("dog", (25.0, 25.0, 25.0, 25.0))  # exactly cell (1, 1) of a 4x4 grid on 100x100


def test_all_mass_in_the_box_cell():
    result = score(one_image(DOG), ["dog"], [peak((4, 4), (1, 1, 1.0))], (4, 4))
    assert result == {**HIT, "grounding-words": 1}


def test_uniform_attention_gives_the_box_area_fraction():
    box = ObjectBox("dog", (10.0, 20.0, 30.0, 40.0))
    result = score(one_image(box), ["dog"], [np.full((4, 4), 1 / 16)], (4, 4))
    assert result["grounding-mass"] == pytest.approx(30 * 40 / 100**2)


def test_box_over_half_a_cell_gets_half_its_mass_and_argmax_outside_misses():
    half = ObjectBox("dog", (0.0, 0.0, 12.5, 25.0))  # the left half of cell (0, 0)
    result = score(one_image(half), ["dog"], [peak((4, 4), (0, 0, 0.4), (3, 3, 0.6))], (4, 4))
    assert result["grounding-mass"] == pytest.approx(0.2)
    assert result["grounding-pointing"] == 0.0


def test_argmax_inside_a_box_that_misses_most_of_the_mass_is_a_hit():
    result = score(
        one_image(DOG), ["dog"], [peak((4, 4), (1, 1, 0.3), (0, 0, 0.25), (3, 3, 0.25), (2, 0, 0.2))], (4, 4)
    )
    assert result["grounding-mass"] == pytest.approx(0.3) and result["grounding-pointing"] == 1.0


def test_tied_peaks_score_the_share_of_them_that_hit():
    # A flat map must not "point" at whatever cell (0, 0) covers: ties score the expected hit.
    top_left = ObjectBox("dog", (0.0, 0.0, 25.0, 25.0))  # cell (0, 0) of a 4x4 grid
    flat = score(one_image(top_left), ["dog"], [np.full((4, 4), 1 / 16)], (4, 4))
    assert flat["grounding-pointing"] == pytest.approx(1 / 16)
    two = score(one_image(DOG), ["dog"], [peak((4, 4), (1, 1, 0.5), (3, 2, 0.5))], (4, 4))
    assert two["grounding-pointing"] == pytest.approx(0.5)


def test_zero_size_boxes_count_for_neither_score():
    point = ObjectBox("dog", (37.5, 37.5, 0.0, 0.0))  # exactly on the centre of cell (1, 1)
    result = score(one_image(point), ["dog"], [peak((4, 4), (1, 1, 1.0))], (4, 4))
    assert result == {**NONE, "grounding-words": 0}
    both = score(one_image(point, DOG), ["dog"], [peak((4, 4), (1, 1, 1.0))], (4, 4))
    assert both["grounding-words"] == 1 and both["grounding-mass"] == 1.0


def test_unnormalised_attention_is_taken_as_shares():
    result = score(one_image(DOG), ["dog"], [peak((4, 4), (1, 1, 3.0), (0, 0, 1.0))], (4, 4))
    assert result["grounding-mass"] == pytest.approx(0.75)


def test_overlapping_instances_count_their_union_once():
    people = one_image(
        ObjectBox("person", (0.0, 0.0, 50.0, 50.0)), ObjectBox("person", (25.0, 25.0, 50.0, 50.0))
    )
    result = score(people, ["men"], [np.full((4, 4), 1 / 16)], (4, 4))
    assert result["grounding-mass"] == pytest.approx((2 * 50 * 50 - 25 * 25) / 100**2)


def test_words_naming_nothing_in_the_image_are_not_counted():
    result = score(one_image(DOG), ["a", "cat", "on", "grass"], [np.full((4, 4), 1 / 16)] * 4, (4, 4))
    assert result == {**NONE, "grounding-words": 0}


def test_mean_over_words():
    instances = one_image(DOG, ObjectBox("person", (75.0, 75.0, 25.0, 25.0)))
    maps = [peak((4, 4), (1, 1, 1.0)), np.full((4, 4), 1 / 16), peak((4, 4), (0, 0, 1.0))]
    result = score(instances, ["puppy", "the", "woman"], maps, (4, 4))
    assert result["grounding-words"] == 2
    assert result["grounding-mass"] == pytest.approx(0.5) and result["grounding-pointing"] == 0.5


def test_non_square_grid_and_image():
    # 300x100 image, 2 rows x 3 columns: cells are 100 wide and 50 high.
    instances = one_image(ObjectBox("bicycle", (100.0, 0.0, 100.0, 50.0)), size=(300.0, 100.0))
    on_box = score(instances, ["bike"], [peak((2, 3), (0, 1, 1.0))], (2, 3))
    assert on_box["grounding-mass"] == 1.0 and on_box["grounding-pointing"] == 1.0
    below = score(instances, ["bikes"], [peak((2, 3), (1, 1, 1.0))], (2, 3))
    assert below["grounding-mass"] == 0.0 and below["grounding-pointing"] == 0.0
    uniform = score(instances, ["bicycle"], [np.full((2, 3), 1 / 6)], (2, 3))
    assert uniform["grounding-mass"] == pytest.approx(1 / 6)


def test_flat_and_grid_attention_agree():
    maps = np.random.default_rng(0).random((2, 3, 5))
    box = ObjectBox("dog", (13.0, 7.0, 41.0, 66.0))
    grid_result = grounding_scores([(1, ["dog", "dogs"], maps, (3, 5))], one_image(box), WordMatcher())
    flat_result = grounding_scores(
        [(1, ["dog", "dogs"], maps.reshape(2, 15), (3, 5))], one_image(box), WordMatcher()
    )
    assert grid_result == flat_result and grid_result["grounding-words"] == 2


def test_shape_mismatch_and_unknown_image_are_errors():
    with raises_naming(ValueError, "image 1", "(1, 4, 4)", "4x4", "2 words"):
        score(one_image(DOG), ["a", "dog"], [np.full((4, 4), 1 / 16)], (4, 4))
    with pytest.raises(ValueError, match="image 5"):
        grounding_scores([(5, ["dog"], np.ones((1, 16)), (4, 4))], one_image(DOG), WordMatcher())


def named(words: list[str], objects: list[ObjectBox], matcher: WordMatcher | None = None) -> list[ObjectBox]:
    """The objects that any mention in ``words`` names."""
    return [obj for _, objs in (matcher or WordMatcher()).mentions(words, objects) for obj in objs]


@pytest.mark.parametrize(
    ("words", "category"),
    [
        ("man", "person"),
        ("women", "person"),
        ("kids", "person"),
        ("people", "person"),
        ("player", "person"),
        ("puppy", "dog"),
        ("puppies", "dog"),
        ("dogs", "dog"),
        ("bike", "bicycle"),
        ("motorbike", "motorcycle"),
        ("plane", "airplane"),
        ("jets", "airplane"),
        ("television", "tv"),
        ("buses", "bus"),
        ("knives", "knife"),
        ("skis", "skis"),
        ("sandwiches", "sandwich"),
        ("benches", "bench"),
        ("ponies", "horse"),
        ("traffic lights", "traffic light"),
        ("stop sign", "stop sign"),
        ("wine glasses", "wine glass"),
        ("bat", "baseball bat"),
        ("meters", "parking meter"),
        ("baseball glove", "baseball glove"),
        ("boxes", "box"),
    ],
)
def test_synonyms_and_plurals(words: str, category: str):
    target = ObjectBox(category, (0.0, 0.0, 10.0, 10.0))
    other = ObjectBox("toaster", (0.0, 0.0, 10.0, 10.0))
    assert named(words.split(), [target, other]) == [target]


def test_plural_rules_do_not_invent_categories():
    skis = ObjectBox("skis", (0.0, 0.0, 10.0, 10.0))
    assert named(["skies"], [skis]) == []  # skies -> sky, not ski
    assert named(["ski"], [skis]) == [skis]


def test_colour_words_name_objects_of_that_colour():
    red = ObjectBox("circle", (0.0, 0.0, 10.0, 10.0), {"color": "red", "size": "small"})
    blue = ObjectBox("square", (50.0, 50.0, 10.0, 10.0), {"color": "blue", "size": "large"})
    assert named(["red"], [red, blue]) == [red]
    assert named(["circles"], [red, blue]) == [red]
    assert named(["green"], [red, blue]) == [] and named(["small"], [red, blue]) == []
    assert named(["large"], [red, blue], WordMatcher(attributes=("color", "size"))) == [blue]
    assert WordMatcher().mentions(["a", "small", "red", "circle"], [red, blue]) == [(2, [red]), (3, [red])]


TEDDY = ObjectBox("teddy bear", (0.0, 0.0, 25.0, 25.0))  # cell (0, 0) of a 4x4 grid on 100x100
BEAR = ObjectBox("bear", (75.0, 75.0, 25.0, 25.0))  # cell (3, 3)


def test_a_teddy_bear_is_one_mention_scored_on_its_noun():
    # "teddy" looks at the bear, "bear" at the teddy bear: only the phrase's noun is scored, on the teddy
    # bear.
    maps = [np.full((4, 4), 1 / 16), peak((4, 4), (3, 3, 1.0)), peak((4, 4), (0, 0, 1.0))]
    result = score(one_image(TEDDY, BEAR), ["a", "teddy", "bear"], maps, (4, 4))
    # the class mean is over the file's two categories, the bear never named counting 0
    assert result == {**HIT, "grounding-pointing-published-classes": 0.5, "grounding-words": 1}
    assert score(one_image(BEAR), ["a", "teddy", "bear"], maps, (4, 4))["grounding-words"] == 0


def test_a_hot_dog_is_not_a_dog():
    hot_dog = ObjectBox("hot dog", (0.0, 0.0, 25.0, 25.0))
    dog = ObjectBox("dog", (75.0, 75.0, 25.0, 25.0))
    maps = [np.full((4, 4), 1 / 16), peak((4, 4), (3, 3, 1.0)), peak((4, 4), (0, 0, 1.0))]
    assert score(one_image(dog), ["a", "hot", "dog"], maps, (4, 4))["grounding-words"] == 0
    assert score(one_image(hot_dog, dog), ["a", "hot", "dog"], maps, (4, 4))["grounding-pointing"] == 1.0


@pytest.mark.parametrize(
    ("words", "category"),
    [
        (["a", "man", "in", "glasses"], "wine glass"),
        (["a", "sign"], "stop sign"),
        (["a", "light"], "traffic light"),
        (["the", "lights"], "traffic light"),
        (["a", "glove"], "baseball glove"),
        (["a", "dryer"], "hair drier"),
    ],
)
def test_ambiguous_head_nouns_alone_are_not_scored(words: list[str], category: str):
    instances = one_image(ObjectBox(category, (25.0, 25.0, 25.0, 25.0)))
    result = score(instances, words, [peak((4, 4), (1, 1, 1.0))] * len(words), (4, 4))
    assert result["grounding-words"] == 0


def test_a_datasets_own_category_names_win():
    # A dataset's own category names name their objects even where the COCO table reads the word otherwise.
    sign = ObjectBox("sign", (25.0, 25.0, 25.0, 25.0))
    assert (
        score(one_image(sign), ["two", "signs"], [peak((4, 4), (1, 1, 1.0))] * 2, (4, 4))["grounding-words"]
        == 1
    )


def brute_force_coverage(boxes, size, grid, samples: int = 240) -> np.ndarray:
    """Cell coverage by sampling points on a fine lattice (an estimate to about 1/samples)."""
    width, height = size
    xs = (np.arange(samples) + 0.5) * width / samples
    ys = (np.arange(samples) + 0.5) * height / samples
    inside = np.zeros((samples, samples), dtype=bool)
    for x, y, w, h in boxes:
        inside |= (ys[:, None] >= y) & (ys[:, None] < y + h) & (xs[None, :] >= x) & (xs[None, :] < x + w)
    rows, cols = grid
    return inside.reshape(rows, samples // rows, cols, samples // cols).mean(axis=(1, 3))


box_strategy = st.tuples(st.floats(-20, 130), st.floats(-20, 130), st.floats(0, 80), st.floats(0, 80))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(box_strategy, max_size=4),
    st.sampled_from([(1, 1), (2, 3), (4, 4), (6, 8), (5, 6)]),
    st.sampled_from([(100.0, 100.0), (320.0, 240.0), (90.0, 150.0)]),
)
def test_coverage_matches_a_brute_force_estimate(boxes, grid, size):
    coverage = box_coverage(boxes, size, grid)
    assert coverage.shape == grid and (coverage >= 0).all() and (coverage <= 1).all()
    np.testing.assert_allclose(coverage, brute_force_coverage(boxes, size, grid), atol=0.05)


def test_shapes_instances_file(tiny_shapes):
    instances = load_instances(tiny_shapes.instances)
    data = json.loads(tiny_shapes.instances.read_text())
    assert set(instances.image_sizes) == {image["id"] for image in data["images"]}
    objects = [obj for image_objects in instances.objects.values() for obj in image_objects]
    assert len(objects) == len(data["annotations"])
    assert {obj.category for obj in objects} <= {"circle", "square", "triangle", "diamond"}
    assert all({"color", "size"} <= set(obj.attributes) for obj in objects)
    # Attention on each object's own cell points at it when the caption names its shape or colour.
    grid = (8, 8)
    items = []
    for image_id, image_objects in instances.objects.items():
        width, height = instances.image_sizes[image_id]
        obj = image_objects[0]
        x, y, w, h = obj.bbox
        row, col = int((y + h / 2) / height * grid[0]), int((x + w / 2) / width * grid[1])
        items.append(
            (
                image_id,
                [obj.category, obj.attributes["color"]],
                np.stack([peak(grid, (row, col, 1.0))] * 2),
                grid,
            )
        )
    result = grounding_scores(items, instances, WordMatcher())
    assert result["grounding-words"] >= 2 * len(items) and result["grounding-pointing"] == 1.0


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ([], ("COCO", "list")),
        ({"images": [], "categories": []}, ("'annotations'",)),
        (
            {"images": [{"id": 1, "width": 10}], "categories": [], "annotations": []},
            ("images[0]", "'height'"),
        ),
        (
            {"images": [{"id": 1, "width": 10, "height": 0}], "categories": [], "annotations": []},
            ("image 1", "width", "height", "10 x 0"),
        ),
        (
            {
                "images": [{"id": 1, "width": 10, "height": 10}],
                "categories": [{"id": 1, "name": "dog"}],
                "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 5]}],
            },
            ("annotations[0]", "bbox", "[x, y, width, height]"),
        ),
        (
            {
                "images": [{"id": 1, "width": 10, "height": 10}],
                "categories": [{"id": 1, "name": "dog"}],
                "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, -5, 5]}],
            },
            ("annotations[0]", "bbox", "width, height >= 0"),
        ),
        (
            {
                "images": [{"id": 1, "width": 10, "height": 10}],
                "categories": [{"id": 1, "name": "dog"}],
                "annotations": [{"id": 1, "image_id": 2, "category_id": 1, "bbox": [0, 0, 5, 5]}],
            },
            ("annotations[0]", "image_id 2", "'images'"),
        ),
        (
            {
                "images": [{"id": 1, "width": 10, "height": 10}],
                "categories": [{"id": 1, "name": "dog"}],
                "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [0, 0, 5, 5]}],
            },
            ("annotations[0]", "category_id 3", "'categories'"),
        ),
    ],
)
def test_load_instances_errors(tmp_path: Path, data, names: tuple[str, ...]):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data))
    with raises_naming(EvaluationInputError, path, *names):
        load_instances(path)


def test_load_instances_not_json(tmp_path: Path):
    path = tmp_path / "instances.json"
    path.write_text("{")
    with raises_naming(EvaluationInputError, path, "JSON"):
        load_instances(path)


def test_category_names_are_matched_whatever_their_spaces_and_case(tmp_path):
    """An instances file naming its categories " Circle " and "traffic  light" grounds "circle" and
    "traffic light" in a caption: the names are matched as words are, not as written."""
    data = {
        "images": [{"id": 1, "width": 100, "height": 100, "file_name": "a.png"}],
        "categories": [{"id": 1, "name": " Circle "}, {"id": 2, "name": "traffic  light"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 50, 50], "area": 2500, "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 2, "bbox": [50, 50, 50, 50], "area": 2500, "iscrowd": 0},
        ],
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data))
    instances = load_instances(path)
    assert instances.categories == ("circle", "traffic light")
    circle, light = instances.objects[1]
    assert (circle.category, light.category) == ("circle", "traffic light")
    words = ["a", "circle", "by", "a", "traffic", "light"]
    assert named(words, instances.objects[1]) == [circle, light]
