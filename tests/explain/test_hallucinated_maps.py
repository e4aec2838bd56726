"""Where a map peaks at a hallucinated mention: on the co-occurring class's object, on a wrong object
(which), or nowhere; on constructed boxes and maps whose peaks are placed by hand."""

from __future__ import annotations

import numpy as np

from captioning.evaluation.grounding import Instances, ObjectBox
from captioning.explain.hallucinated_maps import (
    co_occurring_classes,
    hallucination_peaks,
    peak_lines,
    peak_object,
)
from captioning.explain.plausibility import Explained, mention_rows
from captioning.visualization.faithfulness_table import faithfulness_html

# 90 x 90 pixel images on a 3 x 3 grid (30-pixel cells). Image 1: a large circle over the top-left 2 x 2
# cells with a small triangle tucked in its corner cell (row 1, column 1, inside the circle's box too);
# image 2: a circle in the bottom-right cell. Images 3-12: a circle with a square, so the square's
# co-occurring class is the circle; 13-22: triangles alone.
CIRCLE = ObjectBox("circle", (0.0, 0.0, 60.0, 60.0), {"color": "red"})
TRIANGLE = ObjectBox("triangle", (35.0, 35.0, 20.0, 20.0), {"color": "blue"})
OBJECTS = {1: [TRIANGLE, CIRCLE], 2: [ObjectBox("circle", (60.0, 60.0, 30.0, 30.0))]}
OBJECTS.update(
    {i: [ObjectBox("circle", (0, 0, 9, 9)), ObjectBox("square", (10, 10, 5, 5))] for i in range(3, 13)}
)
OBJECTS.update({i: [ObjectBox("triangle", (0, 0, 9, 9))] for i in range(13, 23)})
INSTANCES = Instances(
    {i: (90.0, 90.0) for i in OBJECTS}, OBJECTS, ("circle", "square", "triangle", "diamond")
)


def cell(row: int, col: int, value: float = 1.0) -> np.ndarray:
    weights = np.zeros(9)
    weights[row * 3 + col] = value
    return weights


def test_the_co_occurring_class_is_the_one_a_class_most_probably_appears_beside():
    # P(square | circle) = 10 / 12, P(square | triangle) = 0 / 11; P(circle | square) = 1; the triangle
    # appears beside the circle in 1 of the circle's 12 images: P(triangle | circle) = 1/12
    assert co_occurring_classes(INSTANCES) == {"square": "circle", "circle": "square", "triangle": "circle"}
    # the square (in 10 images) too rare to count: the circle's is the triangle, P(circle | triangle) = 1/11
    assert co_occurring_classes(INSTANCES, min_images=11) == {
        "square": "circle",
        "triangle": "circle",
        "circle": "triangle",
    }


def _co_occurring_by_loops(images: list[set[str]], min_images: int) -> dict[str, str]:
    """For each category c, the d != c in min_images images or more maximising (P(c | d), images with
    both), the first name on ties, counted image by image."""
    names = sorted(set().union(*images))
    partners = {}
    for c in names:
        best = None
        for d in names:
            with_d = [classes for classes in images if d in classes]
            both = sum(1 for classes in with_d if c in classes)
            if d == c or len(with_d) < min_images or not both:
                continue
            if best is None or (both / len(with_d), both) > best[:2]:
                best = (both / len(with_d), both, d)
        if best is not None:
            partners[c] = best[2]
    return partners


def test_the_co_occurring_classes_of_many_categories_equal_a_count_image_by_image():
    rng = np.random.default_rng(4)
    names = [f"c{k:02d}" for k in range(40)]
    images = [
        {names[int(k)] for k in rng.choice(40, size=int(rng.integers(0, 5)), p=np.linspace(2, 1, 40) / 60)}
        for _ in range(600)
    ]  # some categories rare (under min_images), many ties of ratio and count
    instances = Instances(
        {i: (10.0, 10.0) for i in range(len(images))},
        {i: [ObjectBox(name, (0.0, 0.0, 1.0, 1.0)) for name in classes] for i, classes in enumerate(images)},
    )
    for min_images in (1, 10, 40):
        assert co_occurring_classes(instances, min_images) == _co_occurring_by_loops(images, min_images)
    assert co_occurring_classes(Instances({}, {})) == {}


def test_the_peak_lands_on_the_smallest_box_holding_its_cell():
    objects = OBJECTS[1]
    assert peak_object(cell(0, 0), objects, (90.0, 90.0), (3, 3)) is CIRCLE
    assert peak_object(cell(1, 1), objects, (90.0, 90.0), (3, 3)) is TRIANGLE  # inside both boxes
    assert peak_object(cell(2, 2), objects, (90.0, 90.0), (3, 3)) is None  # background
    assert peak_object(np.zeros(9) - 1.0, objects, (90.0, 90.0), (3, 3)) is None  # nothing positive


def test_each_method_s_maps_at_hallucinated_squares_are_counted_by_where_they_peak():
    words = ["a", "circle", "and", "a", "square"]
    # image 1: "square" is hallucinated; the three methods peak on the circle, the triangle, background;
    # at the grounded "circle" the first peaks on the circle, the second on the triangle, the third nowhere
    maps_one = {
        "on_cause": np.stack([cell(0, 0)] * 4 + [cell(0, 0)]),
        "on_decoy": np.stack([cell(0, 0), cell(1, 1)] + [cell(0, 0)] * 2 + [cell(1, 1)]),
        "nowhere": np.stack([cell(0, 0), cell(2, 2)] + [cell(0, 0)] * 2 + [cell(2, 2, 0.5)]),
    }
    # image 2: hallucinated too; every method peaks on its circle (bottom-right cell)
    maps_two = {name: np.stack([cell(2, 2)] * 5) for name in maps_one}
    explained = [Explained(1, words, maps_one, (3, 3)), Explained(2, words, maps_two, (3, 3))]
    rows = mention_rows(explained, INSTANCES)
    assert [(row["image_id"], row["category"], row["hallucinated"]) for row in rows] == [
        (1, "circle", False), (1, "square", True), (2, "circle", False), (2, "square", True),
    ]  # fmt: skip
    peaks = hallucination_peaks(explained, INSTANCES, rows, list(maps_one))
    assert peaks["co_occurring_classes"] == {"square": "circle"}
    methods = peaks["methods"]
    assert methods["on_cause"] == {
        "mentions": 2, "co_occurring": 2, "wrong_object": 0, "nowhere": 0, "wrong_object_classes": {},
        "grounded": {"mentions": 2, "named_object": 2, "other_object": 0, "nowhere": 0},
    }  # fmt: skip
    assert methods["on_decoy"] == {
        "mentions": 2, "co_occurring": 1, "wrong_object": 1, "nowhere": 0,
        "wrong_object_classes": {"triangle": 1},
        "grounded": {"mentions": 2, "named_object": 1, "other_object": 1, "nowhere": 0},
    }  # fmt: skip
    assert methods["nowhere"] == {
        "mentions": 2, "co_occurring": 1, "wrong_object": 0, "nowhere": 1, "wrong_object_classes": {},
        "grounded": {"mentions": 2, "named_object": 1, "other_object": 0, "nowhere": 1},
    }  # fmt: skip
    # a partner given by the caller: the square now co-occurs with the triangle
    given = hallucination_peaks(explained, INSTANCES, rows, ["on_decoy"], {"square": "triangle"})
    assert (
        given["methods"]["on_decoy"]["co_occurring"] == 1
        and given["methods"]["on_decoy"]["wrong_object"] == 1
    )
    assert given["methods"]["on_decoy"]["wrong_object_classes"] == {"circle": 1}
    # the console lines and the page's table say the counts
    lines = peak_lines(peaks)
    assert "square beside circle" in lines[0]
    assert any("on_decoy" in line and "wrong object 1 (triangle 1)" in line for line in lines)
    page = faithfulness_html({"methods": {}, "hallucination_peaks": peaks})
    decoy_row = page.split('<tr class="peaks" data-method="on_decoy">')[1].split("</tr>")[0]
    assert decoy_row.count('<td class="number">') == 8 and "triangle 1" in decoy_row
    assert any(
        "on_decoy" in line and "grounded: of 2, on their object 1, another 1" in line for line in lines
    )


def test_no_hallucinated_mention_gives_zero_counts_and_no_table():
    explained = [Explained(2, ["a", "circle"], {"attention": np.stack([cell(2, 2)] * 2)}, (3, 3))]
    peaks = hallucination_peaks(explained, INSTANCES, mention_rows(explained, INSTANCES), ["attention"])
    assert peaks["methods"]["attention"]["mentions"] == 0 and peaks["co_occurring_classes"] == {}
    assert peak_lines(peaks) == [] and "peaks at hallucinated" not in faithfulness_html(
        {"hallucination_peaks": peaks}
    )
