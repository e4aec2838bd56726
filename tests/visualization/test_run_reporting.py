"""What a training run reports, and validation under several processes: loss parts in every log,
validation shared out over processes, warnings and the worker cap said once."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_training import (  # noqa: F401 (data_root: a fixture)
    as_flags,
    data_root,
    run_train,
    run_train_two_processes,
    run_two_processes,
    tiny_overrides,
    train_in_process,
)

REPO = Path(__file__).resolve().parents[2]
EPOCH_LINE = re.compile(
    r"^\[xe\] epoch (\d+): loss ([\d.]+) = cross-entropy ([\d.]+) \+ 0\.5 x attention penalty "
    r"([\d.]+)  CIDEr-D",
    re.MULTILINE,
)


@pytest.mark.slow
def test_cross_entropy_and_attention_penalty_are_logged_apart(data_root, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    result = train_in_process(
        as_flags(tiny_overrides(data_root, run, **{"model.decoder.doubly_stochastic": 0.5}))
    )
    assert result.returncode == 0, result.stderr
    lines = EPOCH_LINE.findall(result.stdout)
    assert [int(epoch) for epoch, *_ in lines] == [1, 2], result.stdout
    history = json.loads((run / "history.json").read_text())["epochs"]
    events = EventAccumulator(str(run / "tensorboard")).Reload()
    for (_, loss, cross_entropy, penalty), record in zip(lines, history, strict=True):
        assert float(loss) == pytest.approx(float(cross_entropy) + 0.5 * float(penalty), abs=2e-3)
        assert record["train_cross_entropy"] == pytest.approx(float(cross_entropy), abs=1e-3)
        assert record["train_attention_penalty"] == pytest.approx(float(penalty), abs=1e-3)
        assert record["train_loss"] == pytest.approx(float(loss), abs=1e-3)
    for key in ("cross_entropy", "attention_penalty", "loss"):
        per_epoch = [event.value for event in events.Scalars(f"epoch/train_{key}")]
        assert per_epoch == pytest.approx([record[f"train_{key}"] for record in history], rel=1e-5)
        assert len(events.Scalars(f"train/{key}")) == 16  # every step (log_every 1)


VALIDATION_WORKER = """
import json
import sys
from pathlib import Path

import numpy as np
import torch

from captioning.config import Config, DecodeConfig, LSTMDecoderConfig, EncoderConfig, ModelConfig
from captioning.data.datasets import CaptionDataset
from captioning.data.records import ImageRecord
from captioning.data.vocab import Vocabulary
from captioning.models.captioner import Captioner
from captioning.utils import distributed
from captioning.training.trainer import validation_scores

group = distributed.init_from_environment("cpu")
torch.manual_seed(0)  # the same model in every process
words = ["a", "red", "blue", "circle", "square", "left", "of"]
vocab = Vocabulary.build([words], min_count=1)
model = Captioner.build(ModelConfig(
    encoder=EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64),
    decoder=LSTMDecoderConfig(embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0)), vocab)
rng = np.random.default_rng(0)
records = [ImageRecord(image_id=100 + i, path=Path(f"{i}.png"), split="val",
                       captions=(tuple(rng.choice(words, 4)),), raw=(" ".join(rng.choice(words, 4)),))
           for i in range(11)]


class Recorded:
    # which images this process read
    def __init__(self, grids):
        self.grids, self.read = grids, []

    def __getitem__(self, index):
        self.read.append(index)
        return self.grids[index]


grids = rng.standard_normal((len(records), 4, model.encoder.channels)).astype(np.float32)
config = Config(decode=DecodeConfig(batch_size=2, beam_size=2, max_length=6))
features = Recorded(grids)
dataset = CaptionDataset(records, vocab, max_length=8, captions_per_image=1, features=features)
shared = validation_scores(model, dataset, config, torch.device("cpu"), False, group)
read = list(features.read)
unshared = CaptionDataset(records, vocab, max_length=8, captions_per_image=1, features=grids)
alone = validation_scores(model, unshared, config, torch.device("cpu"), False)
scores = {"read": read, "shared": shared, "alone": alone}
Path(sys.argv[1], f"rank{group.rank}.json").write_text(json.dumps(scores))
distributed.shutdown()
"""


@pytest.mark.slow
def test_validation_is_shared_out_over_processes_and_scores_as_one_process(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(VALIDATION_WORKER)
    result = run_two_processes(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    # Global batches of 2 x 2 images, each process taking every other one: each read its half only.
    assert sorted(ranks[0]["read"]) == [0, 2, 4, 6, 8, 10]
    assert sorted(ranks[1]["read"]) == [1, 3, 5, 7, 9]
    for rank in ranks:  # rank 0's scores of all the captions, on every process
        assert rank["shared"] == ranks[0]["alone"]
    assert ranks[0]["alone"] == ranks[1]["alone"]


@pytest.mark.slow
def test_two_processes_validate_as_one_and_warn_once(data_root, tmp_path):  # noqa: F811
    cores = len(os.sched_getaffinity(0))
    common = {
        "model.decoder.dropout": 0.0,
        "train.batch_size": 8,
        "train.epochs": 1,
        "decode.batch_size": 2,
        "data.max_caption_length": 6,
        "data.num_workers": cores + 1,
    }
    single = tmp_path / "single"
    result = run_train(as_flags(tiny_overrides(data_root, single, **common)))
    assert result.returncode == 0, result.stderr
    double = tmp_path / "ddp"
    result = run_train_two_processes(as_flags(tiny_overrides(data_root, double, **common)))
    assert result.returncode == 0, result.stderr[-3000:]
    one = json.loads((single / "history.json").read_text())["epochs"]
    two = json.loads((double / "history.json").read_text())["epochs"]
    scores = [key for key in one[0] if key.startswith("val_")]
    assert scores and [two[0][key] for key in scores] == pytest.approx(
        [one[0][key] for key in scores], rel=1e-6
    )
    # Both processes read the same data; each warning is printed by rank 0 alone, the cap once.
    capped = (
        f"data.num_workers is {cores + 1} but this process may use {cores} CPU cores: using {cores} workers"
    )
    assert result.stderr.count(capped) == 1, result.stderr
    assert result.stderr.count("training captions") == 1, result.stderr  # the captions cut to 6 words
    assert "worker processes in total" not in result.stderr  # the DataLoader's own warning of too many
