"""An ONNX export folder holds the one-line promise: tampered JSON, graphs and external data, made for
real (hostile graphs built with the ``onnx`` package), are refused by ``captioning.load(folder,
runtime="onnxruntime")`` with one line naming the file, before any image is captioned."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from messages import raises_naming
from tiny_models import tiny_checkpoint

import captioning
from captioning.hub.checkpoint import CheckpointError

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def export(tmp_path_factory, tiny_shapes, shapes_vocab) -> tuple[captioning.CaptioningModel, Path]:
    folder = tmp_path_factory.mktemp("export")
    checkpoint = tiny_checkpoint(folder / "best.pt", tiny_shapes.root, shapes_vocab, "lstm")
    model = captioning.load(checkpoint, device="cpu")
    return model, model.export(folder / "onnx")


@pytest.fixture
def folder(export, tmp_path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(export[1], copy)
    return copy


def _rehash(folder: Path, name: str) -> None:
    """config.json names the file's new bytes, as a careful tamperer would leave it."""
    description = json.loads((folder / "config.json").read_text())
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    section = "graphs" if name.endswith(".onnx") else "external_data"
    description["onnx"][section][name] = digest
    (folder / "config.json").write_text(json.dumps(description))


def _load(folder: Path):
    return captioning.load(folder, runtime="onnxruntime")


@pytest.mark.parametrize("name", ["config.json", "vocab.json"])
def test_deeply_nested_json_is_refused_naming_the_file(folder, name):
    (folder / name).write_text("[" * 100_000 + "]" * 100_000)
    with raises_naming(CheckpointError, folder / name, "nested"):
        _load(folder)


def test_an_empty_graph_with_its_hash_updated_is_refused(folder):
    (folder / "decoder_init.onnx").write_bytes(b"")
    _rehash(folder, "decoder_init.onnx")
    with raises_naming(CheckpointError, folder / "decoder_init.onnx", "empty"):
        _load(folder)


def test_an_image_size_the_encoder_was_not_traced_for_is_refused(folder):
    description = json.loads((folder / "config.json").read_text())
    traced = description["encoder_fingerprint"]["image_size"]
    description["encoder_fingerprint"]["image_size"] = traced + 32
    (folder / "config.json").write_text(json.dumps(description))
    with raises_naming(
        CheckpointError, folder / "encoder.onnx", '"encoder_fingerprint.image_size"', traced + 32, traced
    ):
        _load(folder)


def _huge_encoder(path: Path, size: int) -> None:
    """An encoder graph of the right inputs and outputs that allocates 4 TiB when run: a
    ConstantOfShape whose shape comes from the input's, times 2**40."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Shape", ["images"], ["shape"], start=0, end=1),
        helper.make_node("Mul", ["shape", "huge"], ["count"]),
        helper.make_node("ConstantOfShape", ["count"], ["block"]),
        helper.make_node("ReduceSum", ["block"], ["total"], keepdims=0),
        helper.make_node("Reshape", ["total", "one"], ["annotations"]),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["images", 3, size, size])],
        [helper.make_tensor_value_info("annotations", TensorProto.FLOAT, ["x", "y", "z"])],
        [
            helper.make_tensor("huge", TensorProto.INT64, [1], [2**40]),
            helper.make_tensor("one", TensorProto.INT64, [3], [1, 1, 1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_a_graph_that_allocates_a_huge_tensor_in_the_load_check_is_refused(folder):
    size = json.loads((folder / "config.json").read_text())["encoder_fingerprint"]["image_size"]
    _huge_encoder(folder / "encoder.onnx", size)
    _rehash(folder, "encoder.onnx")
    with raises_naming(CheckpointError, folder / "encoder.onnx", "ONNX Runtime"):
        _load(folder)


@pytest.mark.parametrize("word", ["", "two\nlines", "a b"])
def test_a_vocabulary_word_a_model_folder_refuses_is_refused(folder, word):
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["words"][7] = word
    (folder / "vocab.json").write_text(json.dumps(vocab))
    with raises_naming(CheckpointError, folder / "vocab.json", "words[7]", repr(word)):
        _load(folder)


def test_weights_kept_beside_the_graphs_are_hashed_at_export_and_checked_at_load(
    export, tmp_path, monkeypatch
):
    """A model exported with its weights as external data (``EXTERNAL_WEIGHTS_BYTES`` 0: every graph
    keeps them beside it) captions as the one-file export; an edit to a data file after export, or a
    file config.json does not name, is refused naming it."""
    import onnx

    from captioning.export import graphs

    model, single = export
    monkeypatch.setattr(graphs, "EXTERNAL_WEIGHTS_BYTES", 0)
    folder = model.export(tmp_path / "external")
    external = json.loads((folder / "config.json").read_text())["onnx"]["external_data"]
    assert "decoder_step.onnx.data" in external and "encoder.onnx.data" in external
    step = onnx.load(str(folder / "decoder_step.onnx"), load_external_data=False)
    assert any(tensor.data_location == onnx.TensorProto.EXTERNAL for tensor in step.graph.initializer)
    for name, digest in external.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    image = [np.full((20, 30, 3), 90, dtype=np.uint8)]
    assert _load(folder).caption(image)[0].words == _load(single).caption(image)[0].words

    data = folder / "decoder_step.onnx.data"
    original = data.read_bytes()
    data.write_bytes(original[:-4] + bytes(4))  # the last weight changed, the size kept
    with raises_naming(CheckpointError, data, "sha256"):
        _load(folder)
    data.write_bytes(original)
    (folder / "stray.bin").write_bytes(b"\0" * 8)
    with raises_naming(CheckpointError, folder / "stray.bin", "external_data"):
        _load(folder)
