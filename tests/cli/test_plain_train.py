"""``examples/plain_train.py``, the demo's cross-entropy stage with its loop in plain sight, trains
on a tiny Shapes set and writes a checkpoint that ``captioning.load`` and ``evaluate.py`` read."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tool_runs import ONE_THREAD, REPO

import captioning

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


@pytest.mark.slow
def test_the_plain_loop_trains_and_writes_a_checkpoint_the_api_loads(tmp_path: Path) -> None:
    overrides = [f"data.root={tmp_path / 'shapes'}", *(f"{k}={v}" for k, v in TINY.items())]
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "plain_train.py"),
            "--output-dir",
            str(tmp_path / "run"),
            "--no-progress",
            *(a for o in overrides for a in ("--set", o)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=ONE_THREAD,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    losses = [float(x) for x in re.findall(r"epoch \d+: cross-entropy ([0-9.]+)", result.stdout)]
    assert len(losses) == 3 and losses[-1] < losses[0], result.stdout  # it learns
    checkpoint = tmp_path / "run" / "checkpoints" / "plain.pt"
    model = captioning.load(checkpoint)
    images = sorted((tmp_path / "shapes" / "test").glob("*.png"))
    captions = model.caption([str(path) for path in images], beam_size=2)
    assert len(captions) == 4
    for caption in captions:
        assert caption.attention.shape[0] == len(caption.words)
        assert abs(caption.attention.reshape(len(caption.words), -1).sum(axis=1) - 1).max() < 1e-4
