"""One-to-one mention matching: each category mention of a caption matched to at most one object and
each object to at most one mention, so a duplicate or a second misdescription counts where the
attribute count (each phrase on its own) does not. Hand-built cases with counts worked out by hand,
and random cases against a brute-force matching written here."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from test_attributes import CATEGORIES, write_instances

from captioning.data.tokenizers import tokenize
from captioning.evaluation.attributes import Phrase, attribute_hallucination, attribute_line
from captioning.evaluation.chair_table import chair_table
from captioning.evaluation.grounding import load_instances
from captioning.evaluation.ratios import chair_statistics, ratio_statistics
from captioning.evaluation.runner import add_boxed_scores, summary_lines

# 1: one large red circle; 2: a small red square and a small green square; 3: a large blue triangle and
# a small yellow diamond; 4: a small red square only.
OBJECTS = {
    1: [("circle", {"color": "red", "size": "large"})],
    2: [("square", {"color": "red", "size": "small"}), ("square", {"color": "green", "size": "small"})],
    3: [("triangle", {"color": "blue", "size": "large"}), ("diamond", {"color": "yellow", "size": "small"})],
    4: [("square", {"color": "red", "size": "small"})],
}


@pytest.fixture
def boxes(tmp_path):
    return load_instances(write_instances(tmp_path / "instances.json", OBJECTS))


def judge(boxes, captions: dict[int, str]):
    result = attribute_hallucination(
        {i: tokenize(c) for i, c in captions.items()}, boxes, chair_table("released")
    )
    assert result is not None
    return result


def test_a_duplicate_and_a_second_misdescription_are_caught_where_phrases_pass(boxes):
    result = judge(
        boxes,
        {
            1: "a large red circle and a large red circle",  # one circle named twice
            2: "a small red square and a small red square",  # the green one called red
            3: "a large blue triangle and a small yellow diamond",  # right
            4: "a red square next to a circle",  # no circle in the image
        },
    )
    fields = {i: image.to_json() for i, image in result.per_image.items()}
    # the attribute count sees one wrong phrase (image 4's "red square" is right, its circle is bare)
    assert [fields[i]["attribute-wrong-caption"] for i in (1, 2, 3, 4)] == [0, 0, 0, 0]
    assert [fields[i]["attribute-wrong-one-to-one-caption"] for i in (1, 2, 3, 4)] == [1, 1, 0, 1]
    assert fields[1]["unmatched-mentions"] == [{"mention": "large red circle", "reason": "duplicate"}]
    assert fields[2]["unmatched-mentions"] == [{"mention": "small red square", "reason": "misdescribed"}]
    assert fields[3]["unmatched-mentions"] == []
    assert fields[4]["unmatched-mentions"] == [{"mention": "circle", "reason": "absent"}]
    assert [(fields[i]["attribute-mentions"], fields[i]["attribute-matched"]) for i in (1, 2, 3, 4)] == [
        (2, 1),
        (2, 1),
        (2, 2),
        (2, 1),
    ]
    overall = result.to_json()
    assert overall["attribute-wrong-one-to-one"] == pytest.approx(3 / 4)
    assert overall["attribute-wrong-one-to-one-captions"] == 3 and overall["attribute-wrong-captions"] == 0
    assert (overall["attribute-mentions"], overall["attribute-matched"]) == (8, 5)
    assert [overall[f"attribute-unmatched-{r}"] for r in ("duplicate", "misdescribed", "absent")] == [1, 1, 1]


def test_a_bare_mention_takes_whichever_object_is_left(boxes):
    # "a red square and a square": the bare one takes the green square; "a square and a red square"
    # as well, whichever comes first (the matching is over the whole caption, not greedy)
    for caption in ("a small red square and a square", "a square and a small red square"):
        fields = judge(boxes, {2: caption}).per_image[2].to_json()
        assert fields["unmatched-mentions"] == [] and fields["attribute-matched"] == 2
    fields = judge(boxes, {2: "a square and a square and a square"}).per_image[2].to_json()
    assert fields["unmatched-mentions"] == [{"mention": "square", "reason": "duplicate"}]


def test_scores_summary_and_compare_carry_the_one_to_one_count(boxes):
    words = {1: tokenize("a large red circle and a large red circle"), 3: tokenize("a large blue triangle")}
    result: dict = {"per_image": [{"image_id": 1}, {"image_id": 3}]}
    add_boxed_scores(result, boxes, words, {1: [], 3: []})
    assert result["attribute-wrong-one-to-one-captions"] == 1 and result["attribute-wrong-captions"] == 0
    line = attribute_line(result)
    for needle in (
        "0 of 2 captions with a wrong phrase",
        "1 of 2 misdescribe",
        "2 of 3 mentions",
        "1 duplicate",
    ):
        assert needle in line, (needle, line)
    assert line in summary_lines({**result, "signature": "s"}, 2)
    stored = ratio_statistics(result["per_image"], [1, 3])
    computed = chair_statistics(words, {1: [], 3: []}, boxes, [1, 3])
    np.testing.assert_array_equal(stored["attribute-wrong-one-to-one"], [[1, 1], [0, 1]])
    np.testing.assert_array_equal(computed["attribute-wrong-one-to-one"], [[1, 1], [0, 1]])


def _brute_force(mentions: list[tuple[str, str, str]], objects: list[tuple[str, str, str]]) -> dict[str, int]:
    """Left-over mentions per reason: per category, the largest number of mentions that can each get a
    different object they describe (tried over every assignment), the rest left over."""
    counts = {"duplicate": 0, "misdescribed": 0, "absent": 0}
    for category in {m[2] for m in mentions}:
        mine = [m for m in mentions if m[2] == category]
        theirs = [o for o in objects if o[2] == category]
        if not theirs:
            counts["absent"] += len(mine)
            continue
        best = 0
        for chosen in itertools.permutations(range(len(theirs)), min(len(mine), len(theirs))):
            for subset in itertools.permutations(range(len(mine)), len(chosen)):
                fits = sum(
                    all(word in ("", value) for word, value in zip(mine[m][:2], theirs[o][:2], strict=True))
                    for m, o in zip(subset, chosen, strict=True)
                )
                best = max(best, fits)
        left = len(mine) - best
        counts["misdescribed" if len(theirs) > best else "duplicate"] += left
    return counts


def test_random_captions_match_a_brute_force_count(tmp_path):
    rng = random.Random(5)
    sizes, colors = ("small", "large"), ("red", "green")
    objects, captions, truth = {}, {}, {}
    for image_id in range(1, 41):
        drawn = [
            (rng.choice(sizes), rng.choice(colors), rng.choice(CATEGORIES[:2]))
            for _ in range(rng.randint(1, 3))
        ]
        said = [
            (rng.choice(("", *sizes)), rng.choice(("", *colors)), rng.choice(CATEGORIES[:3]))
            for _ in range(rng.randint(1, 4))
        ]
        objects[image_id] = [(c, {"size": s, "color": k}) for s, k, c in drawn]
        captions[image_id] = " and ".join(" ".join(w for w in ("a", *m) if w) for m in said)
        truth[image_id] = _brute_force(said, drawn)
    boxes = load_instances(write_instances(tmp_path / "random.json", objects))
    result = attribute_hallucination(
        {i: tokenize(c) for i, c in captions.items()}, boxes, chair_table("released")
    )
    assert result is not None
    for image_id, expected in truth.items():
        reasons = [entry["reason"] for entry in result.per_image[image_id].to_json()["unmatched-mentions"]]
        assert {r: reasons.count(r) for r in expected} == expected, (captions[image_id], objects[image_id])
    assert sum(sum(t.values()) > 0 for t in truth.values()) > 10  # the cases left mentions over


def test_a_caption_repeating_a_mention_costs_its_distinct_mentions_not_its_length(tmp_path, monkeypatch):
    # 30 red and 30 green circles; a caption naming "a red circle" 3,000 times: 30 mentions get a red
    # circle, the other 2,970 are left over while green circles are free (misdescribed)
    objects = {1: [("circle", {"color": "red" if k % 2 else "green", "size": "small"}) for k in range(60)]}
    boxes = load_instances(write_instances(tmp_path / "many.json", objects))
    calls = []
    describes = Phrase.describes
    monkeypatch.setattr(Phrase, "describes", lambda self, obj: calls.append(1) or describes(self, obj))
    result = judge(boxes, {1: " and ".join(["a red circle"] * 3000)})
    fields = result.per_image[1].to_json()
    assert fields["attribute-matched"] == 30
    assert [entry["reason"] for entry in fields["unmatched-mentions"]] == ["misdescribed"] * 2970
    assert fields["wrong-phrases"] == [] and fields["attribute-correct"] == 3000
    assert fields["attribute-recalled"] == 30  # the red circles a correct phrase describes
    # the work is one distinct mention (and its bare form) against the 60 objects, a few times over
    assert len(calls) <= 4 * 60, len(calls)
