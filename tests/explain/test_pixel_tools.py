"""The pixel-space protocol through the real tools on a tiny run: ``evaluate.py --faithfulness
--pixel-steps N`` (the pixel table beside the grid's, its settings in the signature, the two rankings)
and ``model.explain(pixel_steps=N)``; options and a missing captum refused before any decoding."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from messages import assert_naming
from tiny_models import tiny_checkpoint
from tool_runs import REPO, in_process

from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary):
    folder = tmp_path_factory.mktemp("pixel_run")
    return tiny_checkpoint(
        folder / "checkpoints" / "best.pt", tiny_shapes.root, shapes_vocab, encoder_weights="pretrained"
    )


def arguments(checkpoint: Path, tmp_path: Path) -> list:
    return [
        "--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress",
        "--results", tmp_path / "results.json", "--out", tmp_path / "scores.json",
    ]  # fmt: skip


def test_evaluate_sets_the_pixel_protocol_beside_the_grid(tmp_path: Path, checkpoint: Path):
    result = in_process(
        "evaluate.py", *arguments(checkpoint, tmp_path),
        "--faithfulness", "attention,occlusion", "--pixel-steps", "3",
        "--pixel-deletion-value", "0.5", "--random-seeds", "2", "--sanity-images", "0",
        "--faithfulness-figures", "0", "--faithfulness-images", "2",
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads((tmp_path / "scores.json").read_text())
    table = scores["faithfulness"]
    pixel = table["pixel"]
    assert set(pixel["methods"]) == {"attention", "occlusion"}
    words = table["random"]["words"]
    for row in pixel["methods"].values():
        assert 0 <= row["deletion_auc"] <= 1 and 0 <= row["insertion_auc"] <= 1 and row["words"] == words
        assert row["deletion_gap"] == pytest.approx(pixel["random"]["deletion_auc"] - row["deletion_auc"])
        low, high = row["deletion_auc_ci"]  # the grid table's intervals and tests, on the pixel areas
        assert low <= row["deletion_auc"] <= high and "deletion_gap_p_holm" in row
    assert len(pixel["per_image"]) == 2 and set(pixel["by_word_class"]) == set(table["by_word_class"])
    for curve in ("deletion", "insertion"):
        agreement = pixel["rank_agreement"][curve]
        assert (
            sorted(agreement["grid_order"]) == sorted(agreement["pixel_order"]) == ["attention", "occlusion"]
        )
        grid_first = agreement["grid_order"][0]
        other = "occlusion" if grid_first == "attention" else "attention"
        key = f"{curve}_auc"
        better = min if curve == "deletion" else max
        assert table["methods"][grid_first][key] == better(
            table["methods"][n][key] for n in (grid_first, other)
        )
    assert table["settings"]["pixel_steps"] == 3 and table["settings"]["pixel_deletion_value"] == 0.5
    assert "pixel_steps=3,pixel_deletion_value=0.5" in scores["signature"]
    assert "grid and pixel (RISE) protocols side by side" in result.stdout
    assert "deletion ranking, grid:" in result.stdout
    assert "faithfulness plan: 2 images" in result.stdout and "encoder images" in result.stdout


def test_model_explain_gives_pixel_curves(checkpoint: Path, tiny_shapes: ShapesFiles):
    import captioning

    model = captioning.load(checkpoint, device="cpu")
    images = sorted((tiny_shapes.root / "test").glob("*.png"))[:2]
    explanations = model.explain(images, methods=["attention"], pixel_steps=2)
    for explanation in explanations:
        words = len(explanation.caption.words)
        curves = explanation.curves
        assert curves.pixel_deletion["attention"].shape == (words, 3)
        assert curves.deletion["attention"].shape == (words, 11)  # the grid's too
        # nothing deleted yet and everything inserted: the image as it is, the same probability
        np.testing.assert_allclose(
            curves.pixel_deletion["attention"][:, 0], curves.pixel_insertion["attention"][:, -1]
        )
        ends = (curves.pixel_deletion["attention"][:, [0, -1]].sum(1)) / 2
        expected = (curves.pixel_deletion["attention"].sum(1) - ends) / 2  # RISE's area over 2 steps
        np.testing.assert_allclose(curves.pixel_deletion_auc["attention"], expected)
    plain = model.explain(images, methods=["attention"])
    assert plain[0].curves.pixel_deletion == {}


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--pixel-steps", "-1"], ["--pixel-steps", "-1"]),
        (["--pixel-steps", "3", "--pixel-deletion-value", "nan"], ["pixel_deletion_value", "nan"]),
    ],
)
def test_bad_curve_options_are_refused_before_any_work(tmp_path: Path, checkpoint: Path, flags, names):
    result = in_process("evaluate.py", *arguments(checkpoint, tmp_path), "--faithfulness", *flags, cwd=REPO)
    assert result.returncode == 2
    assert_naming(result.stderr.strip(), *names)
    assert not (tmp_path / "results.json").exists()


def test_a_missing_captum_is_refused_before_any_decoding(tmp_path: Path, checkpoint: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "captum", None)  # as if the explain extra were not installed
    result = in_process("evaluate.py", *arguments(checkpoint, tmp_path), "--faithfulness", cwd=REPO)
    assert result.returncode == 2
    assert_naming(result.stderr.strip(), "--faithfulness", "captum", ".[explain]")
    assert not (tmp_path / "results.json").exists()
    # methods without captum still run
    fine = in_process(
        "evaluate.py", *arguments(checkpoint, tmp_path), "--faithfulness", "attention,occlusion",
        "--sanity-images", "0", "--faithfulness-figures", "0", "--curve-steps", "2", cwd=REPO,
    )  # fmt: skip
    assert fine.returncode == 0, fine.stderr[-2000:]
