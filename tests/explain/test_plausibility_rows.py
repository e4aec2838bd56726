"""Word classes, grounding per method and the maps at hallucinated mentions, on constructed boxes."""

from __future__ import annotations

import numpy as np
import pytest

from captioning.evaluation.grounding import Instances, ObjectBox
from captioning.explain.plausibility import (
    Explained,
    entropy,
    grounding_rows,
    hallucination_summary,
    mention_rows,
    word_classes,
)

# a 100 x 100 image with a dog in its top-left quarter; the grid is 2 x 2
INSTANCES = Instances(
    {1: (100.0, 100.0)},
    {1: [ObjectBox("dog", (0.0, 0.0, 50.0, 50.0), {"color": "brown"})]},
    ("dog", "cat"),
)


def test_word_classes():
    assert word_classes(["a", "brown", "dog", "and", "a", "teddy", "bear", "sleeping"], INSTANCES) == [
        "function", "attribute", "object", "function", "function", "object", "object", "other",
    ]  # fmt: skip


def test_grounding_and_hallucinated_mentions_per_method():
    words = ["a", "dog", "and", "a", "cat"]
    on_dog = np.array([[0.25] * 4, [1.0, 0.0, 0.0, 0.0], [0.25] * 4, [0.25] * 4, [0.0, 0.0, 0.0, 1.0]])
    flat = np.full((5, 4), 0.25)
    flat[1] = [-3.0, 1.0, 1.0, 1.0]  # negative scores are no evidence: the dog cell counts as 0
    item = Explained(1, words, {"sharp": on_dog, "flat": flat}, (2, 2))
    rows = grounding_rows([item], INSTANCES)
    assert rows["sharp"] == {
        "mass": 1.0,
        "pointing": 1.0,
        "pointing_published": 1.0,
        "pointing_published_classes": 0.5,  # over dog and cat (never named: 0), as TorchRay averages
        "mentions": 1,
    }
    assert rows["flat"]["mass"] == 0.0 and rows["flat"]["pointing"] == 0.0
    mentions = mention_rows([item], INSTANCES, references={1: [["a", "dog"]]})
    assert [(m["word"], m["category"], m["hallucinated"]) for m in mentions] == [
        (1, "dog", False),
        (4, "cat", True),
    ]
    cat = mentions[1]["sharp"]
    assert cat == {"entropy": 0.0, "peak": 1.0, "object_mass": 0.0}  # sure, and on no annotated object
    summary = hallucination_summary(mentions, ["sharp", "flat"])
    assert (
        summary["sharp"]["grounded"]["object_mass"] == 1.0
        and summary["sharp"]["hallucinated"]["mentions"] == 1
    )
    assert summary["flat"]["hallucinated"]["entropy"] == pytest.approx(1.0)  # a flat map: nowhere
    # a cat named in the references is in the image for CHAIR
    assert not mention_rows([item], INSTANCES, references={1: [["a", "cat"]]})[1]["hallucinated"]


def test_entropy_is_normalised():
    assert entropy(np.array([0.25, 0.25, 0.25, 0.25])) == pytest.approx(1.0)
    assert entropy(np.array([0.0, 3.0, 0.0, -1.0])) == 0.0


def test_each_methods_row_carries_both_pointing_games():
    """A map peaking on the cell beside the dog's box: its centre (75, 25) is 25 px from the box, so
    the strict rule misses, and the published one hits with a 30 px tolerance, not with 15."""
    beside = np.full((5, 4), 0.25)
    beside[1] = [0.0, 1.0, 0.0, 0.0]
    item = Explained(1, ["a", "dog", "and", "a", "cat"], {"beside": beside}, (2, 2))
    lenient = grounding_rows([item], INSTANCES, tolerance=30)["beside"]
    assert lenient["pointing"] == 0.0
    assert lenient["pointing_published"] == 1.0 and lenient["pointing_published_classes"] == 0.5  # cat: 0
    assert grounding_rows([item], INSTANCES, tolerance=15)["beside"]["pointing_published"] == 0.0
