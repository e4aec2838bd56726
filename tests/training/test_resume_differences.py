"""A refused resume names every key that differs, with both values, so that one relaunch fixes them."""

from __future__ import annotations

import dataclasses

import pytest

from captioning.config import Config
from captioning.hub.checkpoint import CheckpointError
from captioning.training.resume_state import check_resumable


def test_every_difference_is_named_with_both_values():
    stored = Config()
    model = dataclasses.replace(
        stored.model, encoder=dataclasses.replace(stored.model.encoder, image_size=448)
    )
    train = dataclasses.replace(stored.train, lr=0.1, label_smoothing=0.2)
    now = dataclasses.replace(stored, model=model, train=train)
    with pytest.raises(CheckpointError) as refused:
        check_resumable(stored, now, "xe", "runs/x/checkpoints/last.pt")
    message = str(refused.value)
    assert message.startswith("runs/x/checkpoints/last.pt: model.encoder.image_size is 224 in the checkpoint")
    for difference in (
        "but 448 now",
        f"train.lr {stored.train.lr!r} then 0.1 now",
        "train.label_smoothing 0.0 then 0.2 now",
    ):
        assert difference in message
    assert "more)" not in message and "\n" not in message
