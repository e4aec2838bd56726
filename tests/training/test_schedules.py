"""The per-step cosine learning-rate schedule: its shape, train.py following it, exact resume, and a
warm-up longer than its share of the run clipped with a note (cosine and noam alike)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from test_training import as_flags, data_root, read_steps, run_train, tiny_overrides, train_in_process  # noqa: F401

from captioning.hub.checkpoint import load_checkpoint
from captioning.training.optim import MAX_WARMUP_FRACTION, cosine_factor, noam_factor

COSINE = {"train.schedule": "cosine", "train.warmup_steps": 4, "train.lr": 2e-3}
STEPS = 16  # 32 training images in batches of 4, 2 epochs


def test_cosine_warms_up_linearly_then_decays_to_near_zero():
    factors = [cosine_factor(step, 4, 100) for step in range(100)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(later < earlier for earlier, later in itertools.pairwise(factors[3:]))
    assert math.isclose(factors[3 + 48], 0.5, abs_tol=0.02)  # half-way through the decay
    assert 0 < factors[-1] < 1e-3  # the last step still moves the weights, a little


@pytest.mark.slow
def test_train_py_follows_the_cosine_schedule_and_resumes_it_exactly(data_root, tmp_path):  # noqa: F811
    flags = as_flags(tiny_overrides(data_root, tmp_path / "whole", **COSINE))
    result = train_in_process(flags)
    assert result.returncode == 0, result.stderr[-3000:]
    whole = read_steps(tmp_path / "whole")
    assert [step["step"] for step in whole] == list(range(1, STEPS + 1))
    history = json.loads((tmp_path / "whole" / "history.json").read_text())["epochs"]
    # Each epoch reports the rate of its last step (steps 8 and 16), not the one after it.
    assert [epoch["lr"] for epoch in history] == pytest.approx(
        [2e-3 * cosine_factor(s, 4, STEPS) for s in (7, 15)]
    )
    stopped = as_flags(tiny_overrides(data_root, tmp_path / "resumed", **COSINE))
    result = train_in_process([*stopped, "--set", "train.max_steps=6"])  # mid-epoch, after the warm-up
    assert result.returncode == 0, result.stderr[-3000:]
    lr = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["training"]["optimizer"][
        "param_groups"
    ][0]["lr"]
    assert math.isclose(lr, 2e-3 * cosine_factor(6, 4, STEPS))  # stepped once per batch, ready for step 7
    result = run_train([*stopped, "--resume"])  # a new process: nothing carries over in memory
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = read_steps(tmp_path / "resumed")
    assert [step["step"] for step in resumed] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([s["loss"] for s in resumed], [s["loss"] for s in whole], rtol=1e-6)
    final = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["training"]
    assert final["optimizer"]["param_groups"][0]["lr"] < 2e-3 * 1e-2  # decayed over exactly these 16 steps


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["cosine", "noam"])
def test_a_warm_up_longer_than_the_run_is_clipped_with_a_note(data_root, tmp_path, schedule):  # noqa: F811
    # As `python train.py --epochs 1` meets the demo's 126 warm-up steps, or a short run meets
    # configs/coco_transformer.yaml's 20,000: the run trains, and says what it did instead.
    warmup = STEPS + 100
    output = tmp_path / "run"
    result = train_in_process(
        as_flags(
            tiny_overrides(
                data_root, output, **{**COSINE, "train.schedule": schedule, "train.warmup_steps": warmup}
            )
        )
    )
    assert result.returncode == 0, result.stderr[-2000:]
    clipped = int(STEPS * MAX_WARMUP_FRACTION)
    notes = [line for line in result.stdout.splitlines() if line.startswith("note: train.warmup_steps")]
    assert len(notes) == 1, result.stdout
    assert f"train.warmup_steps={warmup}" in notes[0] and f"{STEPS} steps" in notes[0]
    assert f"warms up over {clipped} steps" in notes[0]
    factor = (
        (lambda s: cosine_factor(s, clipped, STEPS))
        if schedule == "cosine"
        else (lambda s: noam_factor(s, clipped))
    )
    history = json.loads((output / "history.json").read_text())["epochs"]
    assert [epoch["lr"] for epoch in history] == pytest.approx([2e-3 * factor(s) for s in (7, 15)])


def test_a_warm_up_within_its_share_of_the_run_is_kept_without_a_note(data_root, tmp_path):  # noqa: F811
    result = train_in_process(
        as_flags(
            tiny_overrides(
                data_root,
                tmp_path / "run",
                **{**COSINE, "train.warmup_steps": int(STEPS * MAX_WARMUP_FRACTION), "train.max_steps": 1},
            )
        )
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "note: train.warmup_steps" not in result.stdout
