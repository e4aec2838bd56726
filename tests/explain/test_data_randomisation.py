"""Adebayo et al.'s data randomisation test end to end through the real commands: ``train.py`` on tiny
Shapes as it is and with ``data.shuffle_captions``, then ``evaluate.py --faithfulness
--data-randomised-checkpoint`` comparing each method's maps of the same captions under the two models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_study_after_training import tiny_run
from tool_runs import REPO, in_process

from captioning.data import load_records
from captioning.data.records import records_of_split, shuffled_captions
from captioning.hub.checkpoint import checkpoint_config, load_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

MEASURES = ("spearman", "spearman_abs", "ssim", "hog")


def settings(data: Path, output: Path, *extra: str) -> list[str]:
    """The tiny Shapes run of the study tests, with 24 training images and captions of at most 6 words."""
    return tiny_run(data, output, **{"data.shapes_train": 24, "decode.max_length": 6}) + list(extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("data_randomisation")
    checkpoints = []
    for name, extra in (("trained", ()), ("shuffled", ("--set", "data.shuffle_captions=true"))):
        result = in_process(
            "train.py", "--no-test", "--no-progress",
            *settings(folder / "shapes", folder / name, *extra),
            cwd=REPO,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        checkpoints.append(folder / name / "checkpoints" / "best.pt")
    return checkpoints[0], checkpoints[1]


def test_the_shuffled_run_trained_on_other_images_captions(runs):
    trained_config, _ = checkpoint_config(load_checkpoint(runs[0]), runs[0])
    shuffled_config, _ = checkpoint_config(load_checkpoint(runs[1]), runs[1])
    assert shuffled_config.data.shuffle_captions and not trained_config.data.shuffle_captions
    as_read = load_records(trained_config.data, generate=False)
    shuffled = load_records(shuffled_config.data, generate=False)
    assert shuffled == shuffled_captions(as_read, "train", shuffled_config.data.shuffle_captions_seed)
    train = records_of_split(shuffled, "train")
    moved = sum(
        a.captions != b.captions for a, b in zip(records_of_split(as_read, "train"), train, strict=True)
    )
    assert moved >= len(train) - 3  # nearly every image holds another's captions
    assert records_of_split(shuffled, "test") == records_of_split(as_read, "test")


def test_evaluate_compares_the_maps_with_the_shuffled_model(tmp_path: Path, runs):
    trained, shuffled = runs
    scores_path = tmp_path / "scores.json"
    result = in_process(
        "evaluate.py", "--checkpoint", trained, "--split", "test", "--no-java", "--no-progress",
        "--results", tmp_path / "results.json", "--out", scores_path,
        "--faithfulness", "attention,gradient", "--ig-steps", "2", "--curve-steps", "2",
        "--random-seeds", "1", "--sanity-images", "2", "--sanity-randomisation", "cascading",
        "--faithfulness-figures", "1", "--data-randomised-checkpoint", shuffled,
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    table = json.loads(scores_path.read_text())["faithfulness"]
    test = table["data_randomisation"]
    captions = json.loads((tmp_path / "results.json").read_text())[:2]
    assert test["words"] == sum(len(item["caption"].split()) for item in captions)  # the sanity images' words
    assert test["size"] == 64
    for name in ("attention", "gradient"):
        for measure in MEASURES:
            value = test["methods"][name][measure]
            assert value is None or -1.0 <= value <= 1.0
            assert table["methods"][name][f"data_randomisation_{measure}"] == value
    assert "independent" not in table["sanity"]  # --sanity-randomisation cascading
    page = (tmp_path / "scores_faithfulness.html").read_text(encoding="utf-8")
    assert f"The data randomisation test ({test['words']} words)" in page


def test_a_model_not_trained_on_shuffled_captions_is_refused_before_any_work(tmp_path: Path, runs):
    trained, _ = runs
    arguments = ["--checkpoint", trained, "--split", "test", "--no-java", "--no-progress"]
    arguments += ["--results", tmp_path / "results.json"]
    refused = in_process(
        "evaluate.py",
        *arguments,
        "--faithfulness",
        "attention",
        "--data-randomised-checkpoint",
        trained,
        cwd=REPO,
    )
    assert refused.returncode == 2
    assert "--data-randomised-checkpoint" in refused.stderr and "data.shuffle_captions" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results.json").exists()  # nothing decoded
    alone = in_process("evaluate.py", *arguments, "--data-randomised-checkpoint", trained, cwd=REPO)
    assert alone.returncode == 2 and "goes with --faithfulness" in alone.stderr
