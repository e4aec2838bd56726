"""Caption metrics: equal to the official COCO toolkit with Java, within 1% of it without, honest about
what is unavailable; file readers; the CIDEr-D scorer for SCST rewards."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from messages import raises_naming
from nltk.translate.bleu_score import corpus_bleu
from pycocoevalcap.cider.cider import Cider

from captioning.data.tokenizers import tokenize
from captioning.evaluation.coco_files import EvaluationInputError, load_coco_references, load_results
from captioning.evaluation.metrics import CiderDScorer, score_captions
from captioning.evaluation.scorers import NLTK_BLEU, reported_metrics

needs_java = pytest.mark.skipif(
    shutil.which("java") is None, reason="needs a Java runtime (PTBTokenizer, METEOR)"
)
OFFICIAL_KEYS = {
    "BLEU-1": "Bleu_1",
    "BLEU-2": "Bleu_2",
    "BLEU-3": "Bleu_3",
    "BLEU-4": "Bleu_4",
    "METEOR": "METEOR",
    "ROUGE-L": "ROUGE_L",
    "CIDEr-D": "CIDEr",
}
IMAGES_PER_DATASET = 100  # of each of Flickr8k and Flickr30k test: METEOR on Java takes some seconds


def flickr_captions_file() -> Path | None:
    """The shared Flickr test captions: $CAPTIONING_FLICKR_CAPTIONS or ../shared/data beside the repo."""
    candidates = [
        os.environ.get("CAPTIONING_FLICKR_CAPTIONS"),
        Path(__file__).resolve().parents[2].parent / "shared" / "data" / "flickr_test_captions.json",
    ]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


@pytest.fixture(scope="module")
def flickr_images() -> dict[str, dict[int, list[str]]]:
    path = flickr_captions_file()
    if path is None:
        pytest.skip("flickr_test_captions.json not found (set CAPTIONING_FLICKR_CAPTIONS)")
    datasets = json.loads(path.read_text(encoding="utf-8"))["datasets"]
    # Ids of the second dataset shifted so the two can be scored as one set.
    return {
        name: {offset + image["id"]: image["captions"] for image in images}
        for offset, (name, images) in zip((0, 100_000), sorted(datasets.items()), strict=True)
    }


def first_against_rest(images: dict[int, list[str]]) -> tuple[dict[int, list[str]], dict[int, str]]:
    """Each image's first human caption as the candidate, the other four as references."""
    return {i: captions[1:] for i, captions in images.items()}, {
        i: captions[0] for i, captions in images.items()
    }


@pytest.fixture(scope="module")
def flickr_subset(flickr_images) -> tuple[dict[int, list[str]], dict[int, str]]:
    """The first images of each dataset; two candidates are made empty ("" and "...": no words)."""
    subset = {i: c for images in flickr_images.values() for i, c in list(images.items())[:IMAGES_PER_DATASET]}
    references, candidates = first_against_rest(subset)
    first, second = list(candidates)[:2]
    candidates[first], candidates[second] = "", "..."
    return references, candidates


def official_coco_eval(references: dict[int, list[str]], candidates: dict[int, str]) -> tuple[dict, dict]:
    """pycocoevalcap's COCOEvalCap on in-memory COCO objects (SPICE stubbed: its models are downloaded)."""
    import pycocoevalcap.eval as coco_eval
    from pycocotools.coco import COCO

    class NoSpice:
        def compute_score(self, gts, res):
            return 0.0, [0.0] * len(gts)

        def method(self):
            return "SPICE"

    ground_truth = {
        "images": [{"id": i} for i in references],
        "annotations": [
            {"image_id": i, "id": len(references) * k + n, "caption": caption}
            for n, (i, captions) in enumerate(references.items())
            for k, caption in enumerate(captions)
        ],
    }
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()):
        patch.setattr(coco_eval, "Spice", NoSpice)
        coco = COCO()
        coco.dataset = ground_truth
        coco.createIndex()
        results = coco.loadRes([{"image_id": i, "caption": c} for i, c in candidates.items()])
        evaluation = coco_eval.COCOEvalCap(coco, results)
        evaluation.evaluate()
    return evaluation.eval, evaluation.imgToEval


@pytest.fixture(scope="module")
def official(flickr_subset) -> tuple[dict, dict]:
    if shutil.which("java") is None:
        pytest.skip("needs a Java runtime")
    return official_coco_eval(*flickr_subset)


@needs_java
@pytest.mark.java
def test_java_path_equals_official_toolkit(flickr_subset, official, monkeypatch):
    import pycocoevalcap.spice.spice as spice_module

    def no_download():
        raise AssertionError("SPICE tried to download its models")

    monkeypatch.setattr(spice_module, "get_stanford_models", no_download)
    overall, per_image = official
    scores = score_captions(*flickr_subset, use_java=True, spice=True)
    for ours, theirs in OFFICIAL_KEYS.items():
        assert scores.overall[ours] == pytest.approx(overall[theirs], abs=1e-9), ours
        for image_id, values in per_image.items():
            assert scores.per_image[image_id][ours] == pytest.approx(values[theirs], abs=1e-9), (
                ours,
                image_id,
            )
    empty = [i for i, candidate in flickr_subset[1].items() if candidate in ("", "...")]
    assert all(scores.per_image[i][name] == 0.0 for i in empty for name in OFFICIAL_KEYS)
    assert scores.tokenizer == "ptb" and scores.overall[NLTK_BLEU] is not None
    if scores.overall["SPICE"] is None:  # its Stanford CoreNLP models are not installed here
        assert "SPICE" in scores.unavailable


@needs_java
@pytest.mark.java
def test_javaless_path_is_within_one_percent_of_official(flickr_subset, official):
    overall, _ = official
    scores = score_captions(*flickr_subset, use_java=False)
    for name in ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D"):
        relative = abs(scores.overall[name] - overall[OFFICIAL_KEYS[name]]) / overall[OFFICIAL_KEYS[name]]
        print(
            f"{name}: Java-less {scores.overall[name]:.6f}, official {overall[OFFICIAL_KEYS[name]]:.6f}, "
            f"relative difference {relative:.2e}"
        )
        assert relative < 0.01, name


def test_meteor_and_spice_unavailable_without_java():
    scores = score_captions(
        {1: ["a dog runs on grass", "a brown dog"], 2: ["a cat on a sofa"]},
        {1: "a dog runs", 2: "a cat sleeps"},
        use_java=False,
        spice=True,
    )
    assert scores.overall["METEOR"] is None and scores.overall["SPICE"] is None
    assert "Java" in scores.unavailable["METEOR"] and "Java" in scores.unavailable["SPICE"]
    keys = reported_metrics()
    assert all(scores.overall[name] is not None for name in keys if name not in ("METEOR", "SPICE"))
    assert all("METEOR" not in values for values in scores.per_image.values())
    data = scores.to_json()
    assert list(data)[: len(keys)] == list(keys)
    assert data["METEOR"] is None and data["unavailable"] == scores.unavailable
    assert json.loads(json.dumps(data)) == data
    table = scores.table()
    assert "METEOR" in table and "n/a" in table and "needs Java" in table


def test_spice_not_computed_unless_asked():
    scores = score_captions({1: ["a dog"]}, {1: "a dog"}, use_java=False)
    assert (
        scores.overall["SPICE"] is None
        and "not requested (evaluate.py --spice" in scores.unavailable["SPICE"]
    )


def test_use_java_without_java_is_an_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="java"):
        score_captions({1: ["a dog"]}, {1: "a dog"}, use_java=True)
    assert score_captions({1: ["a dog"]}, {1: "a dog"}).tokenizer == "python"  # auto-detect falls back


def test_empty_candidate_scores_zero():
    scores = score_captions(
        {1: ["a dog runs on the grass"], 2: ["a cat sits on a sofa"]},
        {1: "", 2: "a cat sits on a sofa"},
        use_java=False,
    )
    assert all(scores.per_image[1][name] == 0.0 for name in ("BLEU-1", "BLEU-4", "ROUGE-L", "CIDEr-D"))
    assert scores.per_image[2]["BLEU-4"] == pytest.approx(1.0, abs=1e-6)


def test_nltk_corpus_bleu_is_reported_under_its_own_key():
    references = {
        1: ["a dog runs on the green grass", "a brown dog running outside"],
        2: ["a cat sits on a red sofa", "the cat is on the couch"],
    }
    candidates = {1: "a dog runs on the grass", 2: "a cat sits on the sofa"}
    scores = score_captions(references, candidates, use_java=False)
    expected = corpus_bleu(
        [[tokenize(r) for r in references[i]] for i in (1, 2)], [tokenize(candidates[i]) for i in (1, 2)]
    )
    assert scores.overall[NLTK_BLEU] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("references", "candidates", "names"),
    [
        ({}, {}, ("references",)),
        ({1: ["a dog"]}, {1: "a dog", 2: "a cat"}, ("image 2", "references")),
        ({1: ["a dog"], 2: ["a cat"]}, {1: "a dog"}, ("image 2", "candidate")),
        ({1: []}, {1: "a dog"}, ("image 1", "references")),
        ({1: "a dog"}, {1: "a dog"}, ("image 1", "references")),
        ({1: ["a dog"]}, {1: None}, ("image 1", "candidate", "None")),
        ({1: ["a dog", 3]}, {1: "a dog"}, ("image 1", "reference")),
    ],
)
def test_invalid_references_or_candidates(references, candidates, names):
    with raises_naming(EvaluationInputError, *names):
        score_captions(references, candidates, use_java=False)


def test_scores_as_json_and_per_image_rows():
    scores = score_captions({7: ["a dog runs"], 9: ["a cat"]}, {7: "a dog runs", 9: "a dog"}, use_java=False)
    assert json.loads(json.dumps(scores.to_json()))["BLEU-1"] == scores.overall["BLEU-1"]
    per_image = scores.per_image_json()
    assert [entry["image_id"] for entry in per_image] == [7, 9] and "CIDEr-D" in per_image[0]


# ------------------------------------------------------------------ properties

words = st.sampled_from(
    [
        "a",
        "dog",
        "cat",
        "runs",
        "on",
        "the",
        "grass",
        "red",
        "ball",
        "man",
        "rides",
        "horse",
        "two",
        "birds",
        "sit",
        "wire",
    ]
)
captions = st.lists(words, min_size=4, max_size=12).map(" ".join)


@settings(max_examples=40, deadline=None)
@given(st.lists(captions, min_size=1, max_size=4))
def test_identical_candidate_scores_the_maximum(texts: list[str]):
    references = {i: [text] * 3 for i, text in enumerate(texts)}
    scores = score_captions(references, {i: text for i, text in enumerate(texts)}, use_java=False)
    for name in ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L"):
        assert scores.overall[name] == pytest.approx(1.0, abs=1e-6), name
    assert scores.overall[NLTK_BLEU] == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.text(max_size=40), min_size=1, max_size=3), st.text(max_size=40)),
        min_size=1,
        max_size=4,
    )
)
def test_any_unicode_scores_in_range(images):
    references = {i: refs for i, (refs, _) in enumerate(images)}
    candidates = {i: candidate for i, (_, candidate) in enumerate(images)}
    scores = score_captions(references, candidates, use_java=False)
    for name, value in scores.overall.items():
        if name in ("METEOR", "SPICE"):
            assert value is None
            continue
        upper = 10.0 if name == "CIDEr-D" else 1.0
        assert 0.0 <= value <= upper + 1e-12 and math.isfinite(value), name
        for per_image in scores.per_image.values():
            if name in per_image:
                assert 0.0 <= per_image[name] <= upper + 1e-12, name


# ------------------------------------------------------------------ files


def test_load_results_round_trip(tmp_path: Path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps([{"image_id": 3, "caption": "a dog"}, {"image_id": 1, "caption": ""}]))
    assert load_results(path) == {3: "a dog", 1: ""}


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("not json", ("JSON",)),
        ('{"image_id": 1, "caption": "a"}', ("list", "dict")),
        ('[{"image_id": 1}]', ("entry 0", "'caption'")),
        ('[{"caption": "a"}]', ("entry 0", "'image_id'")),
        ('[{"image_id": 1, "caption": "a"}, {"image_id": 1, "caption": "b"}]', ("entry 1", "image_id 1")),
        ('[{"image_id": "1", "caption": "a"}]', ("entry 0", "image_id", "'1'")),
        ('[{"image_id": 1.0, "caption": "a"}]', ("entry 0", "image_id", "1.0")),
        ('[{"image_id": true, "caption": "a"}]', ("entry 0", "image_id", "True")),
        ('[{"image_id": 1, "caption": ["a"]}]', ("entry 0", "caption", "['a']")),
        ('["a dog"]', ("entry 0", "object")),
    ],
)
def test_load_results_errors(tmp_path: Path, content: str, names: tuple[str, ...]):
    path = tmp_path / "results.json"
    path.write_text(content)
    with raises_naming(EvaluationInputError, path, *names):
        load_results(path)


def test_load_results_missing_file(tmp_path: Path):
    with raises_naming(EvaluationInputError, tmp_path / "absent.json"):
        load_results(tmp_path / "absent.json")


def test_load_coco_references(coco_dataset):
    (train, val), _ = coco_dataset
    assert load_coco_references(train) == {
        9: ["A dog runs on the grass.", "A brown dog, running!"],
        25: ["A cat sleeps on a sofa."],
    }
    assert load_coco_references(val)[73] == ["A red bus on a street."]


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ([], ("COCO", "list")),
        ({"images": []}, ("'annotations'",)),
        ({"annotations": [{"image_id": 1}]}, ("annotations[0]", "'caption'")),
        ({"annotations": [{"caption": "a dog"}]}, ("annotations[0]", "'image_id'")),
        ({"annotations": [{"image_id": 1, "caption": 5}]}, ("image 1", "caption")),
    ],
)
def test_load_coco_references_errors(tmp_path: Path, data, names: tuple[str, ...]):
    path = tmp_path / "captions.json"
    path.write_text(json.dumps(data))
    with raises_naming(EvaluationInputError, path, *names):
        load_coco_references(path)


# ------------------------------------------------------------------ CIDEr-D for SCST


def official_cider(references: dict[int, list[list[str]]], candidates: dict[int, list[str]]) -> np.ndarray:
    gts = {i: [" ".join(ref) for ref in refs] for i, refs in references.items()}
    res = {i: [" ".join(candidates[i])] for i in references}
    return np.asarray(Cider().compute_score(gts, res)[1])


def test_cider_d_scorer_equals_pycocoevalcap_on_flickr(flickr_images):
    images = dict(list(flickr_images[min(flickr_images)].items())[:300])
    references = {i: [tokenize(c) for c in captions[1:]] for i, captions in images.items()}
    candidates = {i: tokenize(captions[0]) for i, captions in images.items()}
    scorer = CiderDScorer(references)
    ours = scorer.scores(list(references), [candidates[i] for i in references])
    np.testing.assert_allclose(ours, official_cider(references, candidates), rtol=0, atol=1e-9)
    # Several samples per image, in any order, score as each would alone.
    ids = [i for i in reversed(references) for _ in range(3)]
    np.testing.assert_allclose(
        scorer.scores(ids, [candidates[i] for i in ids]), np.repeat(ours[::-1], 3), atol=1e-12
    )


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.lists(words, max_size=9), min_size=1, max_size=4), st.lists(words, max_size=9)),
        min_size=1,
        max_size=6,
    )
)
def test_cider_d_scorer_equals_pycocoevalcap(images):
    assume(any(ref for refs, _ in images for ref in refs))  # pycocoevalcap fails on a corpus without words
    references = {i: refs for i, (refs, _) in enumerate(images)}
    candidates = {i: candidate for i, (_, candidate) in enumerate(images)}
    ours = CiderDScorer(references).scores(list(references), [candidates[i] for i in references])
    np.testing.assert_allclose(ours, official_cider(references, candidates), rtol=0, atol=1e-9)
    assert ours.dtype == np.float64 and ours.shape == (len(images),)


def test_cider_d_scorer_errors():
    scorer = CiderDScorer({1: [["a", "dog"]]})
    with pytest.raises(KeyError, match="image 2"):
        scorer.scores([2], [["a", "dog"]])
    with raises_naming(ValueError, "2 image ids", "1 candidates"):
        scorer.scores([1, 1], [["a"]])
    with pytest.raises(EvaluationInputError):
        CiderDScorer({})
    assert scorer.scores([], []).shape == (0,)
