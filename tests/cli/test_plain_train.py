"""``examples/plain_train.py``, the demo's cross-entropy stage with its loop in plain sight, trains
on a tiny Shapes set and writes a checkpoint that ``captioning.load`` and ``evaluate.py`` read; with
hard attention its loss is the decoder's objective, REINFORCE included; it takes ``--import`` and
refuses bad input in one line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_faults import assert_one_line_error
from tool_runs import ONE_THREAD, REPO

import captioning
from captioning.hub.checkpoint import load_checkpoint

TINY = {
    "data.shapes_train": 24,
    "data.shapes_val": 4,
    "data.shapes_test": 4,
    "data.shapes_image_size": 64,
    "model.encoder.image_size": 64,
    "model.decoder.embed_dim": 16,
    "model.decoder.hidden_dim": 32,
    "model.decoder.attention_dim": 16,
    "train.epochs": 3,
    "train.batch_size": 8,
    "train.lr": 0.005,
    "train.warmup_steps": 1,
    "decode.beam_size": 2,
    "decode.max_length": 6,
}


# A scorer of the user's, given with --import: Luong's general scorer at half the sharpness.
USER_SCORER = """
from captioning.models.attention import SCORERS, GeneralAttention


class HalvedGeneralAttention(GeneralAttention):
    def scores(self, prepared, query):
        return super().scores(prepared, query) / 2


@SCORERS.register("halved_general")
def halved_general(annotation_dim, hidden_dim, config):
    return HalvedGeneralAttention(annotation_dim, hidden_dim)
"""


def plain_train(tmp_path: Path, *flags: str, overrides: dict | None = None) -> subprocess.CompletedProcess:
    settings = {"data.root": tmp_path / "shapes", **TINY, **(overrides or {})}
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "plain_train.py"),
            "--no-progress",
            *flags,
            *(a for key, value in settings.items() for a in ("--set", f"{key}={value}")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=ONE_THREAD,
        check=False,
    )


@pytest.mark.slow
def test_the_plain_loop_trains_and_writes_a_checkpoint_the_api_loads(tmp_path: Path) -> None:
    result = plain_train(tmp_path, "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    losses = [float(x) for x in re.findall(r"epoch \d+: cross-entropy ([0-9.]+)", result.stdout)]
    assert len(losses) == 3 and losses[-1] < losses[0], result.stdout  # it learns
    assert "REINFORCE" not in result.stdout  # soft attention: equation 14 alone
    checkpoint = tmp_path / "run" / "checkpoints" / "plain.pt"
    model = captioning.load(checkpoint)
    images = sorted((tmp_path / "shapes" / "test").glob("*.png"))
    captions = model.caption([str(path) for path in images], beam_size=2)
    assert len(captions) == 4
    for caption in captions:
        assert caption.attention.shape[0] == len(caption.words)
        assert abs(caption.attention.reshape(len(caption.words), -1).sum(axis=1) - 1).max() < 1e-4


@pytest.mark.slow
def test_hard_attention_with_a_scorer_of_the_users_trains_with_reinforce(tmp_path: Path) -> None:
    # The loop calls the decoder's objective: with hard attention, equation 12, whose REINFORCE term
    # moves the decoder's reward baseline (it starts as NaN and only that objective sets it).
    scorer = tmp_path / "my_scorer.py"
    scorer.write_text(USER_SCORER, encoding="utf-8")
    overrides = {"model.decoder.attention": "hard", "model.decoder.scoring": "halved_general"}
    result = plain_train(
        tmp_path, "--import", str(scorer), "--output-dir", str(tmp_path / "run"), overrides=overrides
    )
    assert result.returncode == 0, result.stderr
    epochs = re.findall(r"epoch \d+: cross-entropy [0-9.]+  REINFORCE and entropy (-?[0-9.]+)", result.stdout)
    assert len(epochs) == 3, result.stdout
    payload = load_checkpoint(tmp_path / "run" / "checkpoints" / "plain.pt")
    assert payload["config"]["model"]["decoder"]["scoring"] == "halved_general"
    assert torch.isfinite(payload["decoder"]["reward_baseline"])  # set by hard_attention_loss


@pytest.mark.slow  # two processes, each importing torch
def test_bad_input_is_one_line_before_any_work(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("a file, not a folder", encoding="utf-8")
    refused = plain_train(tmp_path, "--output-dir", str(taken))
    line = assert_one_line_error(refused.returncode, refused.stderr, str(taken), "--output-dir", alone=False)
    assert "folder" in line
    unknown = plain_train(
        tmp_path, "--output-dir", str(tmp_path / "run"), overrides={"model.decoder.scoring": "halved_general"}
    )
    assert_one_line_error(
        unknown.returncode,
        unknown.stderr,
        "model.decoder.scoring",
        "'halved_general'",
        "--import",
        alone=False,
    )
    assert not (tmp_path / "shapes").exists() and not (tmp_path / "run").exists()  # nothing done
