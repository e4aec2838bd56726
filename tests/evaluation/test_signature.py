"""Scores signatures: they change exactly when an input they list changes."""

from __future__ import annotations

from dataclasses import fields, make_dataclass, replace
from pathlib import Path

import pytest
import torch

from captioning.config import (
    Config,
    DecodeConfig,
    EncoderConfig,
    LSTMDecoderConfig,
    ModelConfig,
    TrainConfig,
    reward_description,
)
from captioning.data.vocab import Vocabulary
from captioning.evaluation.signature import (
    decode_description,
    make_signature,
    parse_signature,
    references_hash,
    signature_differences,
)
from captioning.training.engine import TrainState

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


@pytest.mark.parametrize(
    "change",
    [
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
        {"chair": "released"},
        {"chair": "extended"},
        {"reward": "cider-d.eos"},
    ],
)
def test_each_listed_input_changes_the_signature(checkpoint: Path, change: dict):
    assert base(checkpoint, **change) != base(checkpoint)


def test_checkpoint_bytes_change_the_signature(checkpoint: Path):
    before = base(checkpoint)
    checkpoint.write_bytes(b"weights-2")
    assert base(checkpoint) != before
    assert signature_differences(before, base(checkpoint)) == []  # the system, not the evaluation


def test_sampling_settings_only_count_when_sampling():
    sample = DecodeConfig(strategy="sample")
    assert make_signature(REFERENCES, "ptb", replace(sample, temperature=0.5)) != make_signature(
        REFERENCES, "ptb", sample
    )
    assert make_signature(REFERENCES, "ptb", DecodeConfig(temperature=0.5)) == make_signature(
        REFERENCES, "ptb", DecodeConfig()
    )


def test_fields_and_differences(checkpoint: Path):
    fields = parse_signature(base(checkpoint))
    assert list(fields) == ["refs", "n", "tok", "impl", "decode", "ckpt"]
    assert fields["n"] == "2" and fields["tok"] == "ptb" and fields["refs"] == references_hash(REFERENCES)
    assert fields["impl"].startswith("pycocoevalcap-") and ",captioning-" in fields["impl"]
    assert fields["decode"] == "beam3.max20"
    python = base(checkpoint, tokenizer="python", decode=DecodeConfig(beam_size=5))
    assert signature_differences(base(checkpoint), python) == ["tok: ptb vs python"]


def test_chair_table_and_self_critical_reward_fields(checkpoint: Path):
    released = base(checkpoint, chair="released", reward="cider-d.eos")
    fields = parse_signature(released)
    assert list(fields) == ["refs", "n", "tok", "impl", "chair", "decode", "ckpt", "scst"]
    assert fields["chair"] == "released" and fields["scst"] == "cider-d.eos"
    # Another CHAIR table makes the numbers incomparable; another reward is another system.
    extended = base(checkpoint, chair="extended", reward="cider-d.noeos")
    assert signature_differences(released, extended) == ["chair: released vs extended"]
    assert reward_description(TrainConfig()) == "cider-d.eos"
    assert reward_description(TrainConfig(scst_reward_eos=False)) == "cider-d.noeos"


@pytest.mark.parametrize(
    ("stage", "eos", "expected"),
    [
        ("scst", True, "cider-d.eos"),
        ("scst", False, "cider-d.noeos"),
        ("xe", True, None),
    ],
)
def test_a_checkpoint_names_the_reward_its_weights_were_tuned_with(tmp_path: Path, stage, eos, expected):
    from captioning.hub.checkpoint import save_checkpoint
    from captioning.inference.captioner import load_trained_captioner
    from captioning.models.captioner import Captioner

    config = Config(
        model=ModelConfig(
            encoder=EncoderConfig(weights="none", image_size=32),
            decoder=LSTMDecoderConfig(embed_dim=8, hidden_dim=8, attention_dim=8),
        ),
        train=TrainConfig(scst_epochs=1, scst_reward_eos=eos),
    )
    model = Captioner.build(config.model, Vocabulary.build([["a", "dog"]], min_count=1))
    path = tmp_path / "best_scst.pt"
    save_checkpoint(
        path,
        config=config,
        vocab=model.vocab,
        decoder_state=model.decoder.state_dict(),
        encoder_state=model.encoder.state_dict(),
        encoder_fingerprint=model.encoder.fingerprint(),
        training={"state": TrainState(stage=stage).to_dict()},
    )
    assert load_trained_captioner(path, torch.device("cpu"))[2] == expected


@pytest.mark.parametrize(("stored", "expected"), [(None, False), (True, True), (False, False)])
def test_a_checkpoint_from_before_the_end_token_keeps_the_reward_it_was_trained_with(stored, expected):
    from captioning.config import to_dict
    from captioning.hub.checkpoint import checkpoint_config

    config = to_dict(Config())
    if stored is None:  # written before train.scst_reward_eos existed: the words-only reward
        del config["train"]["scst_reward_eos"]
    else:
        config["train"]["scst_reward_eos"] = stored
    payload = {"config": config, "vocab": Vocabulary.build([["a", "dog"]], min_count=1).to_dict()}
    loaded, _ = checkpoint_config(payload, "old.pt")
    assert loaded.train.scst_reward_eos is expected
    assert reward_description(loaded.train) == ("cider-d.eos" if expected else "cider-d.noeos")


def test_a_new_decoding_option_reaches_the_signature_from_its_field():
    # The decoding part is read from the options' fields: a new field is in the signature once it
    # differs from its default, with no line of signature code.
    wider = make_dataclass("WiderDecodeConfig", [("word_cap", int, 0)], bases=(DecodeConfig,), frozen=True)
    assert "word_cap" not in {f.name for f in fields(DecodeConfig)}  # a field DecodeConfig lacks
    assert decode_description(wider()) == decode_description(DecodeConfig()) == "beam3.max20"
    assert decode_description(wider(word_cap=7)) == "beam3.max20.word_cap=7"
    assert make_signature(REFERENCES, "ptb", wider(word_cap=7)) != make_signature(REFERENCES, "ptb", wider())
    assert decode_description(DecodeConfig(diversity=0.5)) == "beam3.max20.diversity=0.5"
    # The batch size changes how fast captions come, not which.
    assert decode_description(DecodeConfig(batch_size=7)) == "beam3.max20"
    described = {
        "sample.max16.t0.7.k5": DecodeConfig(strategy="sample", max_length=16, temperature=0.7, top_k=5),
        "greedy.max20.min3.alpha0.6.notri.unk": DecodeConfig(
            strategy="greedy", min_length=3, length_alpha=0.6, block_trigrams=True, forbid_unk=False
        ),
    }
    for text, decode in described.items():
        assert decode_description(decode) == text
