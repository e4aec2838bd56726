"""Fewer captions than ``num_return`` asked for are said where the result is read: ``missing`` on the
API's captions, one warning line from evaluate.py --images and visualize.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from tool_runs import REPO, in_process

import captioning

pytestmark = pytest.mark.usefixtures("single_thread")

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"
# A nucleus of one word: every draw is the greedy caption, so 3 draws give 1 distinct caption.
ONE_WORD_NUCLEUS = {"strategy": "sample", "num_return": 3, "top_p": 1e-6}


@pytest.fixture
def photos(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(folder / "red.png")
    Image.new("RGB", (30, 40), (30, 30, 200)).save(folder / "blue.png")
    return folder


def test_the_api_says_how_many_captions_are_missing():
    model = captioning.load(FIXTURE)
    pictures = [np.zeros((16, 16, 3), np.uint8), np.full((16, 16, 3), 200, np.uint8)]
    for caption in model.caption(pictures, **ONE_WORD_NUCLEUS):
        assert len(caption.ranked) == 1 and caption.missing == 2
    several = model.caption(pictures, strategy="sample", num_return=3, temperature=3.0)
    for caption in several:  # drawn hot: distinct captions
        assert caption.missing == 3 - len(caption.ranked)
        assert all(other.missing == 0 for other in caption.alternatives)
    assert all(c.missing == 0 for c in model.caption(pictures, strategy="beam"))


def test_evaluate_images_warns_in_one_line_when_captions_are_missing(photos, tmp_path):
    results = tmp_path / "captions.json"
    flags = ["--strategy", "sample", "--num-return", "3", "--top-p", "1e-6", "--no-progress"]
    run = in_process(
        "evaluate.py", "--checkpoint", FIXTURE, "--images", photos, "--results", results, *flags, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, run.stderr
    assert "2 of 2 images" in warnings[0] and "the 3 captions" in warnings[0] and "num_return" in warnings[0]
    assert "has 1" in warnings[0]
    ranked = json.loads((tmp_path / "captions_ranked.json").read_text(encoding="utf-8"))
    assert len(ranked) == 2  # one row per image: what the warning says
    plenty = in_process(
        "evaluate.py", "--checkpoint", FIXTURE, "--images", photos, "--results", results, "--strategy",
        "beam", "--beam-size", "3", "--num-return", "2", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    rows = json.loads((tmp_path / "captions_ranked.json").read_text(encoding="utf-8"))
    assert plenty.returncode == 0 and (len(rows) == 4) == ("warning:" not in plenty.stderr), plenty.stderr


def test_visualize_warns_in_one_line_when_captions_are_missing(photos, tmp_path):
    flags = ["--checkpoint", FIXTURE, "--out-dir", tmp_path / "figures", "--no-progress"]
    run = in_process(
        "visualize.py", photos / "red.png", *flags, "--num-return", "3", "--set", "decode.strategy=sample",
        "--set", "decode.top_p=1e-6", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "1 of 1 images" in warnings[0] and "red.png has 1" in warnings[0]
