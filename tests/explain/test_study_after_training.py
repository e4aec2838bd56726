"""``train.py`` ends with the faithfulness study when ``train.faithfulness`` is on: its table in
``test_scores.json`` (the same table ``evaluate.py --faithfulness`` gives for the same checkpoint), its
page ``test_faithfulness.html`` and the table on the run report; a study that cannot run is refused
before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from messages import assert_naming
from tool_runs import REPO, in_process

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny_run(data_root: Path, output_dir: Path, **extra: object) -> list[str]:
    """``--set`` flags of a Shapes run small enough for a test: 64 px images, a 2x2 grid, one epoch."""
    values: dict[str, object] = {
        "data.root": data_root,
        "data.shapes_train": 16,
        "data.shapes_val": 4,
        "data.shapes_test": 4,
        "data.shapes_image_size": 64,
        "model.encoder.image_size": 64,
        "model.decoder.embed_dim": 16,
        "model.decoder.hidden_dim": 16,
        "model.decoder.attention_dim": 16,
        "train.output_dir": output_dir,
        "train.epochs": 1,
        "train.batch_size": 4,
        "train.schedule": "plateau",
        "train.scst_epochs": 0,
        "train.ema_decay": 0.0,
        "decode.beam_size": 2,
        "decode.max_length": 8,
        **extra,
    }
    return [flag for key, value in values.items() for flag in ("--set", f"{key}={value}")]


def test_train_ends_with_the_study_evaluate_gives(tmp_path: Path):
    run = tmp_path / "run"
    study = {"train.faithfulness": "true", "train.faithfulness_images": 3}
    result = in_process("train.py", "--no-progress", *tiny_run(tmp_path / "shapes", run, **study), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "faithfulness plan: 3 images" in result.stdout  # the plan came before the work
    scores = json.loads((run / "test_scores.json").read_text())
    table = scores["faithfulness"]
    methods = ["attention", "gradient", "integrated_gradients", "gradcam", "occlusion"]
    assert list(table["methods"]) == methods and table["images"] == 3
    assert "|faith:" + "+".join(methods) + ",ig16,steps10,seeds3,sanity8@0.5,n3" in scores["signature"]
    assert (run / "test_faithfulness.html").is_file()
    assert "Does the map explain the word? (3 images)" in (run / "report.html").read_text(encoding="utf-8")
    # the same table as evaluate.py --faithfulness on the checkpoint the run scored
    out = tmp_path / "eval_scores.json"
    evaluated = in_process(
        "evaluate.py",
        "--checkpoint", run / "checkpoints" / "best.pt", "--split", "test", "--no-java", "--no-progress",
        "--results", tmp_path / "eval_results.json", "--out", out,
        "--faithfulness", "--faithfulness-images", "3", "--faithfulness-figures", "0",
        cwd=REPO,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    expected = json.loads(out.read_text())["faithfulness"]
    for name in methods:
        for key in ("deletion_auc", "insertion_auc", "sanity_spearman"):
            assert table["methods"][name][key] == pytest.approx(expected["methods"][name][key], abs=1e-6)
    assert table["random"]["deletion_auc"] == pytest.approx(expected["random"]["deletion_auc"], abs=1e-6)


@pytest.mark.parametrize(
    ("key", "value", "names"),
    [
        ("train.faithfulness_methods", "rollout", ["train.faithfulness_methods", "rollout"]),
        ("train.faithfulness_methods", "saliency", ["train.faithfulness_methods", "saliency"]),
        ("train.faithfulness_pixel_steps", "-1", ["train.faithfulness_pixel_steps", ">= 0"]),
    ],
)
def test_a_study_that_cannot_run_is_refused_before_training(tmp_path: Path, key, value, names):
    run = tmp_path / "run"
    flags = tiny_run(tmp_path / "shapes", run, **{"train.faithfulness": "true", key: value})
    result = in_process("train.py", "--no-progress", *flags, cwd=REPO)
    assert result.returncode != 0
    assert_naming(result.stderr.strip().splitlines()[-1], *names)
    assert not (run / "checkpoints").exists()
