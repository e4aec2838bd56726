"""Oracle and diversity measures of several captions per image, against independent computations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from test_visualize_cli import checkpoint  # noqa: F401 (a fixture: an untrained tiny captioner on tiny Shapes)
from tool_runs import in_process

from captioning.evaluation.caption_sets import (
    caption_set_lines,
    caption_set_measures,
    distinct_ngrams,
    how_sets_were_drawn,
    mutual_bleu,
)
from captioning.evaluation.coco_files import EvaluationInputError

REFERENCES = {
    1: ["a red circle above a blue square", "a red circle over a square", "the circle is red"],
    2: ["two green triangles", "a pair of green triangles side by side", "green triangles"],
    3: ["a small yellow star", "a yellow star on black", "one star in yellow"],
}
SETS = {
    1: ["a red circle over a blue square", "a red square", "a blue circle above a red square"],
    2: ["two green triangles", "two green triangles side by side", "a green triangle"],
    3: ["a yellow star", "a star", "a yellow star on black"],
}


def test_oracle_cider_is_the_best_pycocoevalcap_cider_among_the_captions():
    measures = caption_set_measures(SETS, REFERENCES)
    # pycocoevalcap's CIDEr-D of the rank-r captions of all images, one call per rank
    by_rank = []
    for rank in range(3):
        _, per_image = Cider().compute_score(
            {i: refs for i, refs in REFERENCES.items()}, {i: [SETS[i][rank]] for i in REFERENCES}
        )
        by_rank.append(dict(zip(REFERENCES, per_image, strict=True)))
    oracle = sum(max(scores[i] for scores in by_rank) for i in REFERENCES) / 3
    assert measures["oracle CIDEr-D"] == pytest.approx(oracle, abs=1e-6)
    assert measures["oracle CIDEr-D"] > sum(by_rank[0].values()) / 3  # some image's best is not its first


def test_distinct_ngrams_count_by_hand():
    # image 1: 7 + 3 + 7 = 17 words; distinct words: a red circle over blue square above = 7
    assert distinct_ngrams([c.split() for c in SETS[1]], 1) == pytest.approx(7 / 17)
    bigrams = {
        ("a", "red"), ("red", "circle"), ("circle", "over"), ("over", "a"), ("a", "blue"),
        ("blue", "square"), ("red", "square"), ("blue", "circle"), ("circle", "above"), ("above", "a"),
    }  # fmt: skip
    assert distinct_ngrams([c.split() for c in SETS[1]], 2) == pytest.approx(len(bigrams) / 17)
    assert distinct_ngrams([[], []], 1) is None
    measures = caption_set_measures(SETS)
    expected = [distinct_ngrams([c.split() for c in SETS[i]], 2) for i in SETS]
    assert measures["distinct-2 per set"] == pytest.approx(sum(expected) / 3)
    assert measures["oracle CIDEr-D"] is None and measures["captions per image"] == 3


def li_distinct(captions: list[str], n: int) -> float:
    """Li et al. 2016's distinct-n written out: distinct n-grams over the number of generated words."""
    seen, words = [], 0
    for caption in captions:
        tokens = caption.split()
        words += len(tokens)
        for i in range(len(tokens) - n + 1):
            if tokens[i : i + n] not in seen:
                seen.append(tokens[i : i + n])
    return len(seen) / words


def test_distinct_n_over_the_corpus_and_per_set():
    # two images, three 3-word captions each: 5 and 6 distinct words per set, 7 over both
    sets = {
        1: ["a red circle", "a red square", "a blue circle"],
        2: ["a red square", "a blue square", "one green square"],
    }
    measures = caption_set_measures(sets)
    corpus = [caption for captions in sets.values() for caption in captions]
    assert measures["distinct-1"] == pytest.approx(li_distinct(corpus, 1)) == pytest.approx(7 / 18)
    assert measures["distinct-1 per set"] == pytest.approx(
        (li_distinct(sets[1], 1) + li_distinct(sets[2], 1)) / 2
    )
    assert measures["distinct-1 per set"] == pytest.approx(11 / 18)  # 0.611 against 0.389 over the corpus
    assert measures["distinct-2"] == pytest.approx(li_distinct(corpus, 2))
    assert measures["distinct-2 per set"] == pytest.approx(
        (li_distinct(sets[1], 2) + li_distinct(sets[2], 2)) / 2
    )


def test_the_sets_say_how_they_were_drawn():
    assert "again up to 5 rounds" in how_sets_were_drawn("sample")
    assert "raw" in how_sets_were_drawn("sample")
    assert "distinct hypotheses" in how_sets_were_drawn("beam")
    lines = caption_set_lines({"distinct-1": 0.5, "mBLEU-4": None, "sets": how_sets_were_drawn("sample")})
    assert lines[0].split() == ["distinct-1", "0.5000"] and lines[1].split() == ["mBLEU-4", "n/a"]
    assert lines[2].startswith("sets") and "distinct samples" in lines[2]


def test_mutual_bleu_is_each_caption_against_the_others():
    captions = [c.split() for c in SETS[2]]
    expected = []
    for k, caption in enumerate(SETS[2]):
        others = [c for j, c in enumerate(SETS[2]) if j != k]
        score, _ = Bleu(4).compute_score({0: others}, {0: [caption]}, verbose=0)
        expected.append(score[3])
    assert mutual_bleu(captions) == pytest.approx(sum(expected) / 3, abs=1e-9)
    same = ["a red circle above a blue square".split()] * 3
    assert mutual_bleu(same) == pytest.approx(1.0)  # identical captions: no diversity
    assert mutual_bleu(captions[:1]) is None
    assert caption_set_measures({1: ["a red circle"]})["mBLEU-4"] is None


def test_bad_sets_are_named():
    with pytest.raises(EvaluationInputError, match="image 2"):
        caption_set_measures({1: ["a"], 2: []})
    with pytest.raises(EvaluationInputError, match="image 3"):
        caption_set_measures({1: ["a"], 3: ["b"]}, {1: ["a"]})


@pytest.mark.slow
def test_evaluate_scores_the_first_caption_and_measures_the_sets(checkpoint: Path, tmp_path: Path):  # noqa: F811
    out, results = tmp_path / "scores.json", tmp_path / "test_results.json"
    common = ["--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress"]
    # the beam size from --set: --num-return is checked against it once the checkpoint is loaded
    options = ["--strategy", "beam", "--set", "decode.beam_size=3", "--set", "decode.min_length=0"]
    run = in_process(
        "evaluate.py", *common, *options, "--num-return", "3", "--out", out, "--results", results
    )
    assert run.returncode == 0, run.stderr[-3000:]
    scores = json.loads(out.read_text())
    rows = json.loads((tmp_path / "test_ranked.json").read_text())
    first = {row["image_id"]: row["caption"] for row in rows if row["rank"] == 1}
    assert {r["image_id"]: r["caption"] for r in json.loads(results.read_text())} == first
    sets: dict[int, list[str]] = {}
    for row in sorted(rows, key=lambda r: (r["image_id"], r["rank"])):
        sets.setdefault(row["image_id"], []).append(row["caption"])
    assert all(len(captions) == 3 == len(set(captions)) for captions in sets.values())
    measured = scores["caption sets"]
    expected = caption_set_measures(sets)
    for key in ("distinct-1", "distinct-2", "distinct-1 per set", "distinct-2 per set", "mBLEU-4"):
        assert measured[key] == pytest.approx(expected[key])
    assert measured["captions per image"] == pytest.approx(expected["captions per image"])
    assert measured["sets"] == how_sets_were_drawn("beam")
    assert measured["oracle CIDEr-D"] >= scores["CIDEr-D"] - 1e-9  # the best of three, the first among them
    # the first caption is scored as a one-caption system's output
    one = tmp_path / "one.json"
    run = in_process(
        "evaluate.py", *common, *options, "--out", one, "--results", tmp_path / "one_results.json"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(one.read_text())["CIDEr-D"] == pytest.approx(scores["CIDEr-D"])
    assert "caption sets" not in json.loads(one.read_text())
    assert not (tmp_path / "one_ranked.json").exists()
