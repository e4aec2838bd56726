"""CHAIR through ``evaluate.py --instances`` equals the released code's rules (Rohrbach et al.,
``utils/chair.py``) on captions where two of them matter: ``"train track"`` is one of its two-word
names (so "train tracks" names no train, in a caption or in a reference), and Pattern's
``singularize`` returns an -ie plural unchanged (``"doggies"`` and ``"collies"`` name no dog).

The reference below follows the released code's steps itself: tokens, singulars, two-word names,
the synonym table (the same file), ground truth from the boxes and the reference captions, then
CHAIR-i over mentions and CHAIR-s over captions.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import nltk
import pytest
from test_hallucination import write_instances
from tool_runs import in_process

from captioning.evaluation.chair_table import chair_table

CAPTIONS = {
    1: "a dog walking along the train tracks",
    2: "a train on the train tracks",
    3: "two doggies and a collie on a couch",
    4: "a cat and a train near the tracks",
    5: "collies playing with a frisbee",
}
REFERENCES = {
    1: ["a dog walks beside the train tracks"],
    2: ["a train stopped on the tracks"],
    3: ["two small dogs on a sofa"],
    4: ["a cat sitting near train tracks"],  # "train tracks": no train in the ground truth
    5: ["two dogs play with a frisbee"],
}
OBJECTS = {1: ["dog"], 2: ["train"], 3: ["dog", "couch"], 4: ["cat"], 5: ["frisbee"]}
# The released code's two-word names that these captions could meet.
DOUBLE_WORDS = {"train track", "hot dog", "home plate"}
IE_PLURALS = {"doggies", "collies"}  # Pattern: returned as they are


def released_chair() -> tuple[float, float]:
    synonyms: dict[str, str] = {}
    for line in files("captioning.evaluation").joinpath("chair_synonyms.txt").read_text("utf-8").splitlines():
        names = [name.strip() for name in line.split(",") if name.strip()]
        for name in names:
            synonyms[name] = names[0]

    def singular(word: str) -> str:
        if word in IE_PLURALS:
            return word
        parts_of_names = {part for name in DOUBLE_WORDS for part in name.split()}
        return (
            word[:-1]
            if word.endswith("s") and (word[:-1] in synonyms or word[:-1] in parts_of_names)
            else word
        )

    def objects_named(caption: str) -> list[str]:
        words = [singular(w) for w in nltk.tokenize.TreebankWordTokenizer().tokenize(caption.lower())]
        merged, index = [], 0
        while index < len(words):
            pair = " ".join(words[index : index + 2])
            if pair in DOUBLE_WORDS:
                merged.append(pair)
                index += 2
            else:
                merged.append(words[index])
                index += 1
        return [synonyms[word] for word in merged if word in synonyms]

    mentions = hallucinated = captions_with = 0
    for image, caption in CAPTIONS.items():
        truth = set(OBJECTS[image]) | {o for ref in REFERENCES[image] for o in objects_named(ref)}
        named = objects_named(caption)
        wrong = [name for name in named if name not in truth]
        mentions, hallucinated = mentions + len(named), hallucinated + len(wrong)
        captions_with += bool(wrong)
    return hallucinated / mentions, captions_with / len(CAPTIONS)


def test_the_reference_itself_sees_both_rules():
    chair_i, chair_s = released_chair()
    assert (chair_i, chair_s) == (pytest.approx(1 / 7), pytest.approx(1 / 5))  # only caption 4's train


def test_evaluate_gives_the_released_chair_on_train_tracks_and_ie_plurals(tmp_path: Path):
    annotations = tmp_path / "captions.json"
    annotations.write_text(
        json.dumps(
            {
                "images": [{"id": i} for i in CAPTIONS],
                "annotations": [
                    {"id": 10 * i + k, "image_id": i, "caption": ref}
                    for i, refs in REFERENCES.items()
                    for k, ref in enumerate(refs)
                ],
            }
        )
    )
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in CAPTIONS.items()]))
    instances = write_instances(tmp_path / "instances.json", chair_table("released").categories, OBJECTS)
    scores = tmp_path / "scores.json"
    run = in_process(
        "evaluate.py",
        "--annotations", annotations,
        "--results", results,
        "--instances", instances,
        "--no-java",
        "--out", scores,
        "--no-progress",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    written = json.loads(scores.read_text())
    chair_i, chair_s = released_chair()
    assert written["CHAIR-i"] == pytest.approx(chair_i)
    assert written["CHAIR-s"] == pytest.approx(chair_s)
