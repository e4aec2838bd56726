"""Checkpoints round-trip, load without running code, and are written atomically."""

from __future__ import annotations

import errno
import os
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from messages import raises_naming

from captioning.config import Config, LSTMDecoderConfig, ModelConfig
from captioning.data.vocab import SPECIALS, Vocabulary
from captioning.hub import checkpoint as checkpoint_module
from captioning.hub.checkpoint import (
    CheckpointError,
    atomic_write,
    checkpoint_config,
    load_checkpoint,
    load_state_checked,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from captioning.models.decoder import ShowAttendTellDecoder

C, P = 8, 9  # annotation channels, grid positions (annotation_dim comes from the encoder, not the config)
WORDS = ["a", "red", "blue", "circle", "square", "left", "of"]


pytestmark = pytest.mark.usefixtures("single_thread")


def make_config(attention: str = "soft", scoring: str = "multihead") -> Config:
    decoder = LSTMDecoderConfig(
        attention=attention,
        scoring=scoring,
        num_heads=2,
        embed_dim=16,
        hidden_dim=16,
        attention_dim=16,
        gate="channel",
        dropout=0.2,
    )
    return Config(model=ModelConfig(decoder=decoder))


def make_vocab(words: list[str] = WORDS) -> Vocabulary:
    return Vocabulary(list(SPECIALS) + words)


def decoder_outputs(decoder: ShowAttendTellDecoder) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    annotations = torch.randn(2, P, C, generator=generator)
    captions = torch.tensor([[1, 4, 5, 6, 2], [1, 7, 2, 0, 0]])
    with torch.no_grad():
        output = decoder.eval()(annotations, captions, torch.tensor([5, 3]))
    return output.logits, output.alphas, output.betas


def save(path: Path, config: Config, vocab: Vocabulary, decoder: ShowAttendTellDecoder, **extra) -> None:
    save_checkpoint(path, config=config, vocab=vocab, decoder_state=decoder.state_dict(), **extra)


@pytest.mark.parametrize(
    "attention, scoring",
    [("soft", "multihead"), ("soft", "additive"), ("hard", "general"), ("soft", "cosine")],
)
def test_round_trip_rebuilds_an_identical_decoder(tmp_path, attention, scoring):
    torch.manual_seed(0)
    config, vocab = make_config(attention, scoring), make_vocab()
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), C)
    if attention == "hard":
        decoder.reward_baseline.fill_(-2.5)
    path = tmp_path / "run" / "checkpoint.pt"  # the folder does not exist yet
    training = {"epoch": 3, "step": 120, "rng": rng_state(), "history": [{"CIDEr-D": 0.5}]}
    save(path, config, vocab, decoder, training=training)

    payload = load_checkpoint(path)
    stored_config, stored_vocab = checkpoint_config(payload, path)
    assert stored_config == config
    assert stored_vocab == vocab
    torch.manual_seed(1)  # different initial weights: everything must come from the file
    rebuilt = ShowAttendTellDecoder.from_config(stored_config.model.decoder, len(stored_vocab), C)
    assert type(rebuilt) is type(decoder)
    load_state_checked(rebuilt, payload["decoder"], "decoder", path)
    for original, restored in zip(decoder_outputs(decoder), decoder_outputs(rebuilt), strict=True):
        assert torch.equal(original, restored)
    if attention == "hard":
        assert float(rebuilt.reward_baseline) == -2.5
    assert payload["training"]["epoch"] == 3 and payload["training"]["history"] == [{"CIDEr-D": 0.5}]
    assert payload["encoder"] is None and payload["encoder_fingerprint"] is None


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_a_checkpoint_naming_dot_before_general_had_its_name_gives_the_same_outputs(tmp_path, attention):
    # Luong's general scorer was registered as dot before dot became the weightless dot product:
    # such a file holds the general scorer's query_proj, and is read as general.
    torch.manual_seed(0)
    config, vocab = make_config(attention, "general"), make_vocab()
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), C)
    if attention == "hard":
        decoder.reward_baseline.fill_(-2.5)  # a trained one's
    old = Config(model=ModelConfig(decoder=replace(config.model.decoder, scoring="dot")))
    path = tmp_path / "old.pt"
    save(path, old, vocab, decoder)
    payload = load_checkpoint(path)
    assert payload["config"]["model"]["decoder"]["scoring"] == "dot"
    stored_config, _ = checkpoint_config(payload, path)
    assert stored_config.model.decoder.scoring == "general"
    rebuilt = ShowAttendTellDecoder.from_config(stored_config.model.decoder, len(vocab), C)
    load_state_checked(rebuilt, payload["decoder"], "decoder", path)
    for original, restored in zip(decoder_outputs(decoder), decoder_outputs(rebuilt), strict=True):
        assert torch.equal(original, restored)
    # A file of today's dot (no scorer weights) keeps it.
    plain = replace(config.model.decoder, scoring="dot", hidden_dim=C)
    today = ShowAttendTellDecoder.from_config(plain, len(vocab), C)
    if attention == "hard":
        today.reward_baseline.fill_(-2.5)
    save(tmp_path / "dot.pt", Config(model=ModelConfig(decoder=plain)), vocab, today)
    stored, _ = checkpoint_config(load_checkpoint(tmp_path / "dot.pt"), tmp_path / "dot.pt")
    assert stored.model.decoder.scoring == "dot"


def test_file_loads_with_plain_weights_only_torch_load(tmp_path):
    config, vocab = make_config(), make_vocab()
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), C)
    path = tmp_path / "checkpoint.pt"
    save(
        path,
        config,
        vocab,
        decoder,
        training={"rng": rng_state(), "optimizer": torch.optim.Adam(decoder.parameters()).state_dict()},
    )
    payload = torch.load(path, weights_only=True)
    assert payload["format"] == "captioning-checkpoint"
    assert set(payload["decoder"]) == set(decoder.state_dict())


class WritesMarker:
    """Unpickling this object would create a file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("payload_kind", ["object", "function"])
def test_checkpoint_with_pickled_code_is_refused_and_not_executed(tmp_path, payload_kind):
    config, vocab = make_config(), make_vocab()
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), C)
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    save(path, config, vocab, decoder)
    payload = torch.load(path, weights_only=True)
    payload["training"] = {"hook": WritesMarker(marker) if payload_kind == "object" else os.system}
    torch.save(payload, path)  # plain torch.save: pickles anything
    with raises_naming(CheckpointError, path, "tensors"):
        load_checkpoint(path)
    assert not marker.exists()


def test_truncated_file_is_reported(tmp_path):
    config, vocab = make_config(), make_vocab()
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), C)
    path = tmp_path / "checkpoint.pt"
    save(path, config, vocab, decoder)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with raises_naming(CheckpointError, path, "truncated"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "content", [b"", b"PK\x03\x04", b"\x80\x02"], ids=["empty", "zip-header", "pickle-header"]
)
def test_empty_or_garbage_file_is_reported(tmp_path, content):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(content)
    with raises_naming(CheckpointError, path, "corrupt"):
        load_checkpoint(path)


def test_missing_and_foreign_files_are_reported(tmp_path):
    with raises_naming(CheckpointError, tmp_path / "absent.pt", "not found"):
        load_checkpoint(tmp_path / "absent.pt")
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    with raises_naming(CheckpointError, foreign, "captioning"):
        load_checkpoint(foreign)


def test_decoder_from_another_vocabulary_names_the_shape_difference(tmp_path):
    config = make_config()
    small, large = make_vocab(), make_vocab(WORDS + ["triangle", "green"])
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(large), C)
    path = tmp_path / "checkpoint.pt"
    save(path, config, large, decoder)
    payload = load_checkpoint(path)
    other = ShowAttendTellDecoder.from_config(config.model.decoder, len(small), C)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError) as error:
        load_state_checked(other, payload["decoder"], "decoder", path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and "decoder" in message
    assert f"embedding.weight ({len(large)}, 16) vs ({len(small)}, 16)" in message
    assert "shape" in message
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())  # nothing half-loaded


def test_decoder_with_missing_weights_names_them(tmp_path):
    config, vocab = make_config(), make_vocab()
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), C)
    state = decoder.state_dict()
    del state["gate.weight"]
    with raises_naming(CheckpointError, "checkpoint.pt", "decoder", "gate.weight"):
        load_state_checked(decoder, state, "decoder", "checkpoint.pt")


def test_full_disk_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    config, vocab = make_config(), make_vocab()
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), C)
    path = tmp_path / "checkpoint.pt"
    save(path, config, vocab, decoder)
    previous = path.read_bytes()

    def full_disk(obj, destination, *args, **kwargs):
        destination.write(b"partial checkpoint bytes")  # some bytes made it out (to the open file)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", full_disk)
    torch.nn.init.zeros_(decoder.out.weight)  # a different model, so a leak would change the bytes
    with raises_naming(CheckpointError, path, "space"):
        save(path, config, vocab, decoder)
    assert path.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no temporary files left


def test_atomic_write_removes_its_temporary_file_on_other_errors(tmp_path):
    path = tmp_path / "file.bin"
    path.write_bytes(b"old")

    def fails(temporary: Path) -> None:
        temporary.write_bytes(b"new, half written")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, fails)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]
    atomic_write(path, lambda temporary: temporary.write_bytes(b"new"))
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]


def draws() -> tuple:
    python = (random.gauss(0, 1), random.random(), random.getrandbits(64))
    return (python, tuple(np.random.rand(4)), tuple(np.random.normal(size=2)), torch.rand(4))


def test_rng_state_round_trip_through_a_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in the python state
    np.random.normal()  # and in numpy's
    state = rng_state()
    expected = draws()
    draws()  # move every generator on

    config, vocab = make_config(), make_vocab()
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), C)
    path = tmp_path / "checkpoint.pt"
    save(path, config, vocab, decoder, training={"rng": state})
    set_rng_state(load_checkpoint(path)["training"]["rng"])
    again = draws()
    assert again[:3] == expected[:3]
    assert torch.equal(again[3], expected[3])

    set_rng_state(state)  # also straight from memory
    again = draws()
    assert again[:3] == expected[:3] and torch.equal(again[3], expected[3])


def test_the_evaluated_checkpoint_is_the_one_with_the_best_validation_score(tmp_path):
    # Self-critical epochs need not beat the cross-entropy model they start from.
    from captioning.training.run import best_checkpoint

    config, vocab = make_config(), make_vocab()
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), C)
    folder = tmp_path / "checkpoints"
    folder.mkdir()

    def write(name: str, best_metric: float) -> None:
        save(folder / f"{name}.pt", config, vocab, decoder, training={"state": {"best_metric": best_metric}})

    write("last", 0.1)
    assert best_checkpoint(tmp_path) == folder / "last.pt"
    write("best", 1.2)
    write("best_scst", 1.1)
    assert best_checkpoint(tmp_path) == folder / "best.pt"
    write("best_scst", 1.3)
    assert best_checkpoint(tmp_path) == folder / "best_scst.pt"
    write("best_scst", 1.2)
    assert best_checkpoint(tmp_path) == folder / "best_scst.pt"  # a tie goes to the self-critical model


def test_a_checkpoint_refuses_an_encoder_with_other_weights(tmp_path):
    # The decoder learned from one encoder's features: another set of weights (an edited file, another
    # version) would give it features it never saw.
    from captioning.inference.captioner import load_captioner
    from captioning.models.encoders import build_encoder

    config, vocab = Config(), make_vocab()
    encoder = build_encoder(config.model.encoder)
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, len(vocab), encoder.channels)
    path = tmp_path / "model.pt"
    save(path, config, vocab, decoder, encoder_fingerprint=encoder.fingerprint())
    model, _ = load_captioner(path, torch.device("cpu"))
    assert model.encoder.fingerprint() == encoder.fingerprint()
    other = {**encoder.fingerprint(), "weights": {"size": 1, "sha256": "0" * 64}}
    save(path, config, vocab, decoder, encoder_fingerprint=other)
    with raises_naming(
        CheckpointError, path, "encoder", '"0000000000', encoder.fingerprint()["weights"]["sha256"]
    ):
        load_captioner(path, torch.device("cpu"))
