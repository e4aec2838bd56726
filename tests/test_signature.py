"""Scores signatures: they change exactly when an input they list changes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from captioning.config import DecodeConfig
from captioning.evaluation.signature import (
    make_signature,
    parse_signature,
    references_hash,
    signature_differences,
)

REFERENCES = {1: ["a dog on a couch", "a brown dog"], 2: ["a red circle"]}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "best.pt"
    path.write_bytes(b"weights-1")
    return path


def base(model: Path, **changes) -> str:
    arguments = {"references": REFERENCES, "tokenizer": "ptb", "decode": DecodeConfig(), "checkpoint": model}
    return make_signature(**{**arguments, **changes})


def test_same_inputs_same_signature(checkpoint: Path, tmp_path: Path):
    copy = tmp_path / "copy.pt"
    copy.write_bytes(checkpoint.read_bytes())
    reordered = {2: ["a red circle"], 1: ["a dog on a couch", "a brown dog"]}
    assert base(checkpoint) == base(copy, references=reordered)  # content, not path or order
    assert base(checkpoint) == base(checkpoint, decode=DecodeConfig(batch_size=7))  # batching changes nothing


@pytest.mark.parametrize("change", [
    {"references": {**REFERENCES, 2: ["a blue circle"]}},
    {"references": {1: REFERENCES[1]}},
    {"tokenizer": "python"},
    {"decode": DecodeConfig(beam_size=5)},
    {"decode": DecodeConfig(strategy="greedy")},
    {"decode": DecodeConfig(max_length=16)},
    {"decode": DecodeConfig(min_length=3)},
    {"decode": DecodeConfig(length_alpha=0.7)},
    {"decode": DecodeConfig(block_trigrams=True)},
    {"decode": DecodeConfig(forbid_unk=False)},
    {"decode": None},
    {"checkpoint": None},
])
def test_each_listed_input_changes_the_signature(checkpoint: Path, change: dict):
    assert base(checkpoint, **change) != base(checkpoint)


def test_checkpoint_bytes_change_the_signature(checkpoint: Path):
    before = base(checkpoint)
    checkpoint.write_bytes(b"weights-2")
    assert base(checkpoint) != before
    assert signature_differences(before, base(checkpoint)) == []  # the system, not the evaluation


def test_sampling_settings_only_count_when_sampling():
    sample = DecodeConfig(strategy="sample")
    assert make_signature(REFERENCES, "ptb", replace(sample, temperature=0.5)) != make_signature(REFERENCES, "ptb",
                                                                                                 sample)
    assert make_signature(REFERENCES, "ptb", DecodeConfig(temperature=0.5)) == make_signature(REFERENCES, "ptb",
                                                                                              DecodeConfig())


def test_fields_and_differences(checkpoint: Path):
    fields = parse_signature(base(checkpoint))
    assert list(fields) == ["refs", "n", "tok", "impl", "decode", "ckpt"]
    assert fields["n"] == "2" and fields["tok"] == "ptb" and fields["refs"] == references_hash(REFERENCES)
    assert fields["impl"].startswith("pycocoevalcap-") and ",captioning-" in fields["impl"]
    assert fields["decode"] == "beam3.max20"
    python = base(checkpoint, tokenizer="python", decode=DecodeConfig(beam_size=5))
    assert signature_differences(base(checkpoint), python) == ["tok: ptb vs python"]
