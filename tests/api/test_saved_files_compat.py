"""Files written by an earlier layout of the package still load.

``tests/fixtures/pre_move/`` holds a tiny run folder (its configuration, vocabulary, history, scores
and two checkpoints), a model folder saved from its ``best.pt`` and the run's four test images, all
written by the code as it stood before the package was laid out by concept, and ``captions.json``:
the captions, log-probabilities and attention maps that code gave for those images. Checkpoints and
model folders hold only plain types (tensors, numbers, strings), never pickled classes, so moving a
module must change nothing a saved file says: ``captioning.load`` and the three tools read all of
them and give the same captions and attention.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tool_runs import REPO, in_process

import captioning

FIXTURES = REPO / "tests" / "fixtures" / "pre_move"
IMAGES = sorted(str(path) for path in (FIXTURES / "images").glob("*.png"))
EXPECTED = json.loads((FIXTURES / "captions.json").read_text())


@pytest.mark.parametrize("saved", sorted(EXPECTED))
def test_load_gives_the_captions_and_attention_of_the_code_that_wrote_it(saved: str) -> None:
    model = captioning.load(FIXTURES / saved)
    captions = model.caption(IMAGES, beam_size=2)
    assert [c.text for c in captions] == [e["text"] for e in EXPECTED[saved]]
    for caption, expected in zip(captions, EXPECTED[saved], strict=True):
        assert caption.log_prob == pytest.approx(expected["log_prob"], abs=1e-4)
        attention = np.asarray(expected["attention"], dtype=np.float32)
        np.testing.assert_allclose(caption.attention.reshape(len(attention), -1), attention, atol=1e-4)


@pytest.mark.parametrize("saved", ["run/checkpoints/best.pt", "model"])
def test_evaluate_captions_images_with_an_old_checkpoint_and_model_folder(saved: str, tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    run = in_process(
        "evaluate.py",
        "--checkpoint",
        FIXTURES / saved,
        "--images",
        FIXTURES / "images",
        "--results",
        results,
        "--beam-size",
        2,
        "--no-progress",
    )
    assert run.returncode == 0, run.stderr
    written = sorted(json.loads(results.read_text()), key=lambda row: str(row["image_id"]))
    assert [row["caption"] for row in written] == [e["text"] for e in EXPECTED[saved]]


@pytest.mark.parametrize("saved", ["run/checkpoints/best_scst.pt", "model"])
def test_visualize_draws_figures_from_an_old_checkpoint_and_model_folder(saved: str, tmp_path: Path) -> None:
    run = in_process(
        "visualize.py",
        "--checkpoint",
        FIXTURES / saved,
        "--out-dir",
        tmp_path / "figures",
        "--beam-size",
        2,
        "--no-progress",
        IMAGES[0],
    )
    assert run.returncode == 0, run.stderr
    figures = list((tmp_path / "figures").glob("*.png"))
    assert len(figures) == 1 and figures[0].stat().st_size > 1000


@pytest.mark.slow
def test_train_resumes_from_an_old_checkpoint(tmp_path: Path) -> None:
    """``train.py --resume`` reads an old run's configuration and last checkpoint and trains on."""
    folder = shutil.copytree(FIXTURES / "run", tmp_path / "run")
    shapes = tmp_path / "shapes"
    run = in_process(
        "train.py",
        "--config",
        folder / "config.yaml",
        "--resume",
        folder / "checkpoints" / "last.pt",
        "--output-dir",
        folder,
        "--scst-epochs",
        2,
        "--no-test",
        "--no-progress",
        "--set",
        f"data.root={shapes}",
    )
    assert run.returncode == 0, run.stderr
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [(row["stage"], row["epoch"]) for row in history["epochs"]] == [
        ("xe", 1),
        ("scst", 1),
        ("scst", 2),
    ]
