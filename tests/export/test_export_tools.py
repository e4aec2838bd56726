"""``evaluate.py`` and ``visualize.py`` take an ONNX export as ``--checkpoint``: the same captions and
the same scores as from the checkpoint it was exported from, and the same attention figures; what needs
gradients (``--faithfulness``, ``--method``) is refused in one line before any work."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from messages import assert_naming
from PIL import Image
from tiny_models import tiny_checkpoint
from tool_runs import in_process

import captioning

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_shapes, shapes_vocab) -> tuple[Path, Path]:
    """A tiny LSTM over the pretrained encoder (captions that differ between images) and its export."""
    folder = tmp_path_factory.mktemp("tools")
    checkpoint = tiny_checkpoint(
        folder / "best.pt", tiny_shapes.root, shapes_vocab, "lstm", encoder_weights="pretrained"
    )
    return checkpoint, captioning.load(checkpoint, device="cpu").export(folder / "onnx")


def _evaluate(model: Path, out: Path, *flags: str):
    result = in_process(
        "evaluate.py", "--checkpoint", model, "--split", "test", "--no-java", "--no-progress",
        "--results", out, "--beam-size", "2", *flags, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(out.read_text()), json.loads(
        out.with_name(out.stem.replace("results", "scores") + ".json").read_text()
    )


def test_evaluate_scores_an_export_as_its_checkpoint(models, tmp_path):
    checkpoint, export = models
    want_results, want_scores = _evaluate(checkpoint, tmp_path / "torch_results.json")
    got_results, got_scores = _evaluate(export, tmp_path / "onnx_results.json")
    assert got_results == want_results
    assert len({r["caption"] for r in want_results}) > 1
    assert set(got_scores) == set(want_scores)
    for key, value in want_scores.items():
        if key in ("signature", "checkpoint"):  # which model file: the export or the checkpoint
            continue
        if isinstance(value, float):
            assert got_scores[key] == pytest.approx(value, abs=1e-4), key
        else:
            assert got_scores[key] == value, key
    assert got_scores["checkpoint"] == str(export) and "ckpt:" in got_scores["signature"]


def test_visualize_draws_an_exports_attention_as_its_checkpoints(models, tiny_shapes, tmp_path):
    checkpoint, export = models
    image = sorted((tiny_shapes.root / "test").glob("*.png"))[0]
    figures = {}
    for name, model in (("torch", checkpoint), ("onnx", export)):
        result = in_process(
            "visualize.py", image, "--checkpoint", model, "--out-dir", tmp_path / name, "--no-progress",
            timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        figures[name] = np.asarray(
            Image.open(tmp_path / name / f"{image.stem}.png").convert("RGB"), dtype=int
        )
    assert figures["onnx"].shape == figures["torch"].shape
    assert np.abs(figures["onnx"] - figures["torch"]).max() <= 2  # attention equal within 1e-5
    assert figures["onnx"].std() > 0


def test_what_needs_gradients_is_refused_for_an_export_before_any_work(models, tiny_shapes, tmp_path):
    _, export = models
    image = sorted((tiny_shapes.root / "test").glob("*.png"))[0]
    drawn = in_process(
        "visualize.py", image, "--checkpoint", export, "--out-dir", tmp_path / "v", "--method", "gradcam"
    )
    assert drawn.returncode != 0
    assert_naming(drawn.stderr.strip(), "--method", export, "ONNX export")
    assert not (tmp_path / "v").exists()
    scored = in_process(
        "evaluate.py", "--checkpoint", export, "--split", "test", "--no-java", "--faithfulness", "default",
        "--results", tmp_path / "r.json",
    )  # fmt: skip
    assert scored.returncode != 0
    assert_naming(scored.stderr.strip(), "--faithfulness", export, "ONNX export")
    assert not (tmp_path / "r.json").exists()
