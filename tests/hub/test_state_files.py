"""The one reader of tensor files: torch.save files weights-only, safetensors files, one-line refusals."""

from __future__ import annotations

import os
import zipfile

import pytest
import torch
from messages import raises_naming
from safetensors.torch import save_file

from captioning.hub.checkpoint import CheckpointError, load_checkpoint
from captioning.models.encoders.registry import EncoderWeightsError
from captioning.models.encoders.weights import read_state_dict
from captioning.utils.state_files import StateFileError, read_state_file


class Payload:
    """A pickled object that is not a tensor or a plain type: never to be built by a loader."""

    def __reduce__(self):
        return (os.getcwd, ())


@pytest.fixture
def state() -> dict[str, torch.Tensor]:
    return {"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "bias": torch.ones(2)}


@pytest.mark.parametrize("name", ["state.pt", "state.safetensors"])
def test_round_trip(tmp_path, state, name):
    path = tmp_path / name
    if name.endswith(".safetensors"):
        save_file(state, str(path))
    else:
        torch.save(state, path)
    loaded = read_state_file(path, "state-dict file")
    assert set(loaded) == set(state)
    for key, value in state.items():
        assert torch.equal(loaded[key], value)


def _crc_damaged(path, state):
    torch.save({**state, "large": torch.zeros(4096)}, path)
    with zipfile.ZipFile(path) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    start = member.header_offset + 30 + len(member.filename.encode()) + len(member.extra)
    data[start + member.compress_size // 2] ^= 0xFF  # one flipped byte inside the largest tensor
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        (
            "pickled.pt",
            lambda p, s: torch.save({"x": Payload()}, p),
            "refused: the {what} holds objects other",
        ),
        ("empty.pt", lambda p, s: p.write_bytes(b""), "truncated or corrupt {what} (EOFError)"),
        ("text.pt", lambda p, s: p.write_text("hello world"), "truncated or corrupt {what} (KeyError)"),
        (
            "cut.pt",
            lambda p, s: (torch.save(s, p), p.write_bytes(p.read_bytes()[:-200])),
            "truncated or corrupt",
        ),
        ("crc.pt", _crc_damaged, "fails its CRC check"),
        ("cut.safetensors", lambda p, s: p.write_bytes(b"abc"), "truncated or corrupt {what} ("),
    ],
)
def test_unreadable_files_are_one_line_naming_the_file(tmp_path, state, name, make, message):
    path = tmp_path / name
    make(path, state)
    with pytest.raises(StateFileError) as error:
        read_state_file(path, "state-dict file")
    text = str(error.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    assert message.format(what="state-dict file") in text


def test_checkpoints_and_encoder_weights_share_the_reader(tmp_path):
    """The checkpoint loader and the encoder weights loader refuse a pickled object with the same rule,
    each with its own error type and its own word for the file."""
    path = tmp_path / "hostile.pt"
    torch.save({"x": Payload()}, path)
    with raises_naming(CheckpointError, path, "checkpoint", "tensors") as checkpoint:
        load_checkpoint(path)
    with raises_naming(EncoderWeightsError, path, "state-dict file", "tensors"):
        read_state_dict(path)
    assert "state-dict" not in str(checkpoint.value)  # each says what the file was meant to be
    torch.save([torch.ones(1)], path)
    with raises_naming(EncoderWeightsError, path, "state dict", "list"):
        read_state_dict(path)
