"""The hallucination testbed through the real commands: ``train.py --config
configs/shapes_hallucination.yaml`` shortened to a tiny run, then ``evaluate.py --faithfulness`` on its
test split; the scores carry CHAIR, the one-to-one count and where each method's maps peak at the
hallucinated mentions, and the counts agree with each other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tool_runs import REPO, in_process

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

TINY = {
    "data.shapes_train": 24,
    "data.shapes_val": 4,
    "data.shapes_test": 6,
    "data.shapes_image_size": 64,
    "model.encoder.image_size": 64,
    "model.decoder.embed_dim": 16,
    "model.decoder.hidden_dim": 32,
    "model.decoder.attention_dim": 16,
    "train.epochs": 1,
    "train.batch_size": 8,
    "train.scst_epochs": 0,
    "train.warmup_steps": 1,
    "decode.batch_size": 6,
    "decode.max_length": 12,
}


def test_the_testbed_trains_and_evaluates_with_its_counts(tmp_path: Path):
    flags = [
        arg
        for key, value in {
            **TINY,
            "data.root": tmp_path / "data",
            "train.output_dir": tmp_path / "run",
        }.items()
        for arg in ("--set", f"{key}={value}")
    ]
    trained = in_process(
        "train.py",
        "--config",
        REPO / "configs" / "shapes_hallucination.yaml",
        "--no-progress",
        *flags,
        cwd=REPO,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    test_scores = json.loads((tmp_path / "run" / "test_scores.json").read_text())
    assert test_scores["attribute-images"] == test_scores["images"] == 6
    assert (
        "attribute-wrong-one-to-one" in test_scores and "misdescribe an object one-to-one" in trained.stdout
    )
    manifest = json.loads((tmp_path / "data" / "shapes_manifest.json").read_text())
    assert manifest["variant"].startswith("hallucination") and manifest["co_occurrence_partner"] == "square"

    scores_path = tmp_path / "scores.json"
    evaluated = in_process(
        "evaluate.py",
        "--checkpoint", tmp_path / "run" / "checkpoints" / "best.pt", "--split", "test", "--no-java",
        "--no-progress", "--results", tmp_path / "results.json", "--out", scores_path,
        "--faithfulness", "attention,gradient", "--ig-steps", "2", "--curve-steps", "2",
        "--random-seeds", "1", "--sanity-images", "0",
        cwd=REPO,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    scores = json.loads(scores_path.read_text())
    # a mention of a class the image lacks is CHAIR's hallucination and one-to-one's "absent" alike
    assert scores["attribute-unmatched-absent"] == scores["CHAIR-hallucinated"]
    left_over = sum(scores[f"attribute-unmatched-{r}"] for r in ("duplicate", "misdescribed", "absent"))
    assert scores["attribute-mentions"] - scores["attribute-matched"] == left_over
    # a phrase no object fits is a mention no object takes: one-to-one finds every caption the phrases do
    assert scores["attribute-wrong-one-to-one-captions"] >= scores["attribute-wrong-captions"]
    per_image = json.loads(scores_path.with_name("scores.per_image.json").read_text())
    with_mentions = [entry for entry in per_image if entry.get("attribute-mentions")]
    assert (
        sum(bool(entry["unmatched-mentions"]) for entry in with_mentions)
        == scores["attribute-wrong-one-to-one-captions"]
    )
    peaks = scores["faithfulness"]["hallucination_peaks"]
    for method in ("attention", "gradient"):
        counts = peaks["methods"][method]
        # every hallucinated mention of the explained captions is counted once, in one place
        assert counts["mentions"] == scores["CHAIR-hallucinated"]
        assert counts["co_occurring"] + counts["wrong_object"] + counts["nowhere"] == counts["mentions"]
        assert sum(counts["wrong_object_classes"].values()) == counts["wrong_object"]
