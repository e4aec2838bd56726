"""An ONNX export (``model.export(folder, format="onnx")``) captions through ONNX Runtime as the PyTorch
model does: the same words, greedy and beam, log-probabilities within 1e-4, the same attention maps;
every registered decoder family is exported, at its tiny sizes, and its graphs step like its PyTorch
``step`` and search as its PyTorch search (``export_checks.check_export``); a folder that is not a
whole, unchanged export is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from export_checks import check_export, grids, random_decoder
from messages import raises_naming
from PIL import Image
from tiny_models import tiny_checkpoint, tiny_decoder_config

import captioning
from captioning.export.graphs import export_decoder_graphs
from captioning.hub.checkpoint import CheckpointError
from captioning.models.base import DECODERS
from captioning.utils.errors import InputError
from captioning.utils.run_folder import RunFolderError

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def exports(
    tmp_path_factory, tiny_shapes, shapes_vocab
) -> dict[str, tuple[captioning.CaptioningModel, Path]]:
    """Per registered decoder family: the PyTorch model at the family's tiny sizes (untrained, over the
    pretrained encoder's grids: captions that differ between images) and its export."""
    folder = tmp_path_factory.mktemp("onnx")
    made = {}
    for kind in DECODERS.names():
        checkpoint = tiny_checkpoint(
            folder / kind / "best.pt",
            tiny_shapes.root,
            shapes_vocab,
            encoder_weights="pretrained",
            decoder=tiny_decoder_config(kind),
        )
        model = captioning.load(checkpoint, device="cpu")
        made[kind] = (model, model.export(folder / kind / "onnx"))
    return made


@pytest.mark.parametrize("kind", DECODERS.names())
def test_every_decoder_family_exports_steps_and_searches_as_pytorch(kind, tmp_path):
    check_export(random_decoder(kind), grids(), tmp_path)


def test_a_state_the_export_cannot_flatten_is_refused_naming_the_decoder(tmp_path):
    """A state must be a NamedTuple of tensors: one the export cannot see into would be written as no
    state at all, so it is refused before any graph is written."""

    class OpaqueState:  # select and head, but no tensors a tuple walk finds
        def __init__(self, h):
            self.h = h

        def select(self, index):
            return OpaqueState(self.h.index_select(0, index))

    decoder = random_decoder("lstm")
    decoder.init_state = lambda annotations: OpaqueState(torch.zeros(annotations.size(0), 4))
    with raises_naming(TypeError, "ShowAttendTellDecoder.init_state", "OpaqueState", "NamedTuple"):
        export_decoder_graphs(decoder, grids(2), tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", DECODERS.names())
@pytest.mark.parametrize(("strategy", "beam_size"), [("greedy", 1), ("beam", 3)])
def test_onnx_runtime_captions_as_pytorch(exports, tiny_shapes, kind, strategy, beam_size):
    model, folder = exports[kind]
    onnx_model = captioning.load(folder, runtime="onnxruntime")
    images = sorted((tiny_shapes.root / "test").glob("*.png")) + sorted(
        (tiny_shapes.root / "val").glob("*.png")
    )
    options = {
        "strategy": strategy,
        "beam_size": beam_size,
        "min_length": 0,
        "max_length": 6,
        "batch_size": 3,
    }
    expected = model.caption(images, **options)
    got = onnx_model.caption(images, **options)
    assert len({c.text for c in expected}) > 1, "the test needs captions that differ between images"
    for want, have in zip(expected, got, strict=True):
        assert have.words == want.words
        assert have.log_prob == pytest.approx(want.log_prob, abs=1e-4)
        assert have.finished == want.finished
        np.testing.assert_allclose(have.attention, want.attention, atol=1e-5)
        assert have.attention_label == want.attention_label
        if want.beta is None:
            assert have.beta is None
        else:
            np.testing.assert_allclose(have.beta, want.beta, atol=1e-5)


def test_sampling_with_a_seed_repeats_and_diverse_beams_match_pytorch(exports, tiny_shapes):
    """Through the API: a seed gives the same sampled captions again (and its alternatives), a bad seed
    is refused in one line; diverse beam search with three captions returned gives PyTorch's."""
    model, folder = exports["transformer"]
    onnx_model = captioning.load(folder, runtime="onnxruntime")
    images = sorted((tiny_shapes.root / "test").glob("*.png"))
    options = {"strategy": "sample", "num_return": 2, "top_p": 0.9, "max_length": 6}
    first = onnx_model.caption(images, seed=11, **options)
    again = onnx_model.caption(images, seed=11, **options)
    assert [[c.words for c in x.ranked] for x in first] == [[c.words for c in x.ranked] for x in again]
    with raises_naming(InputError, "seed", "-1"):
        onnx_model.caption(images, seed=-1, **options)
    diverse = {"beam_size": 4, "beam_groups": 2, "diversity": 0.5, "num_return": 3, "max_length": 6}
    for want, have in zip(
        model.caption(images, **diverse), onnx_model.caption(images, **diverse), strict=True
    ):
        assert [c.words for c in have.ranked] == [c.words for c in want.ranked]
        assert [c.log_prob for c in have.ranked] == pytest.approx([c.log_prob for c in want.ranked], abs=1e-4)


def test_the_preprocessing_without_torchvision_equals_the_pytorch_transform(exports, tiny_shapes):
    """PIL and NumPy resize and normalise each picture as torchvision's transform does (within float
    rounding), and the encoder graph gives the PyTorch encoder's grids."""
    model, folder = exports["lstm"]
    onnx_model = captioning.load(folder, runtime="onnxruntime")
    encoder = model.captioner.encoder
    pictures = [Image.open(p).convert("RGB") for p in sorted((tiny_shapes.root / "test").glob("*.png"))]
    pictures.append(Image.fromarray(np.random.default_rng(0).integers(0, 256, (37, 91, 3), dtype=np.uint8)))
    for picture in pictures:
        want = encoder.transform(picture).numpy()
        np.testing.assert_allclose(onnx_model.networks.preprocessing(picture), want, atol=1e-5)
    pixels = np.stack([onnx_model.networks.preprocessing(p) for p in pictures])
    with torch.no_grad():
        grids = model.captioner.encode(torch.from_numpy(pixels)).numpy()
    np.testing.assert_allclose(onnx_model.networks.encode(pixels), grids, atol=1e-4)


def test_the_export_holds_checked_graphs_and_the_model_description(exports):
    import onnx

    model, folder = exports["transformer"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [
            "config.json",
            "vocab.json",
            "encoder.onnx",
            "decoder_prepare.onnx",
            "decoder_init.onnx",
            "decoder_step.onnx",
        ]
    )
    for graph in folder.glob("*.onnx"):
        onnx.checker.check_model(str(graph), full_check=True)
    description = json.loads((folder / "config.json").read_text())
    assert description["format"] == "captioning-onnx"
    assert description["config"]["model"]["decoder"]["kind"] == "transformer"
    assert description["encoder_fingerprint"] == model.captioner.encoder.fingerprint()
    assert json.loads((folder / "vocab.json").read_text()) == model.vocab.to_dict()
    # The Transformer's state is each layer's self-attention keys and values: 2 layers, 4 tensors.
    assert description["onnx"]["layout"] == {"prepared": 4, "state": 4, "beta": False}
    onnx_model = captioning.load(folder, runtime="onnxruntime")
    assert onnx_model.runtime == "onnxruntime" and "run by onnxruntime" in repr(onnx_model)
    assert description["onnx"]["external_data"] == {}
    assert onnx_model.grid == model.grid and onnx_model.vocab.itos == model.vocab.itos


def _copy(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    return copy


def _edit_config(folder: Path, change) -> None:
    description = json.loads((folder / "config.json").read_text())
    change(description)
    (folder / "config.json").write_text(json.dumps(description))


@pytest.mark.parametrize(
    ("tamper", "file", "names"),
    [
        (lambda f: (f / "decoder_step.onnx").unlink(), "decoder_step.onnx", ("encoder.onnx",)),
        (lambda f: (f / "encoder.onnx").write_bytes(b"\x08\x07"), "encoder.onnx", ("config.json", "sha256")),
        (lambda f: (f / "vocab.json").unlink(), "vocab.json", ("model.export(",)),
        (lambda f: (f / "config.json").write_text("{"), "config.json", ("JSON",)),
        (lambda f: _edit_config(f, lambda d: d.update(version=7)), "config.json", ("version 7",)),
        (
            lambda f: _edit_config(f, lambda d: d["onnx"]["layout"].update(state=1)),
            "decoder_init.onnx",
            ("state_0, state_1", "config.json"),
        ),
        (
            lambda f: _edit_config(f, lambda d: d["onnx"]["layout"].update(state="2")),
            "config.json",
            ('"onnx.layout.state"', '"2"'),
        ),
        (
            lambda f: _edit_config(f, lambda d: d["encoder_fingerprint"].update(grid=[3, 3])),
            "encoder.onnx",
            ("(4, 1280)", "(9, 1280)", '"encoder_fingerprint"'),
        ),
        (
            lambda f: _edit_config(f, lambda d: d["encoder_fingerprint"].update(interpolation="sideways")),
            "config.json",
            ('"encoder_fingerprint"', "interpolation"),
        ),
        (
            lambda f: (f / "vocab.json").write_text(
                json.dumps({"words": json.loads((f / "vocab.json").read_text())["words"][:5]})
            ),
            "decoder_step.onnx",
            ("41 words", "5 words"),
        ),
    ],
)
def test_a_changed_or_incomplete_export_is_refused_in_one_line(exports, tmp_path, tamper, file, names):
    folder = _copy(exports["lstm"][1], tmp_path)
    tamper(folder)
    with raises_naming(CheckpointError, folder / file, *names):
        captioning.load(folder, runtime="onnxruntime")


def test_each_runtime_names_the_other_for_the_wrong_folder(exports, tmp_path):
    model, folder = exports["lstm"]
    with raises_naming(CheckpointError, folder / "config.json", "runtime='onnxruntime'"):
        captioning.load(folder)
    pretrained = model.save_pretrained(tmp_path / "model")
    with raises_naming(CheckpointError, pretrained / "config.json", "runtime='onnxruntime'", "format='onnx'"):
        captioning.load(pretrained, runtime="onnxruntime")
    with raises_naming(CheckpointError, tmp_path / "missing", "model.export"):
        captioning.load(tmp_path / "missing", runtime="onnxruntime")
    with raises_naming(InputError, "runtime", "torch", "onnxruntime", "'tensorrt'"):
        captioning.load(folder, runtime="tensorrt")
    with raises_naming(InputError, "runtime='onnxruntime'", "device", "cpu", "'cuda'"):
        captioning.load(folder, runtime="onnxruntime", device="cuda")


def test_what_needs_pytorch_weights_or_another_map_is_refused(exports, tmp_path):
    onnx_model = captioning.load(exports["transformer"][1], runtime="onnxruntime")
    for name, call in (
        ("save_pretrained()", lambda: onnx_model.save_pretrained(tmp_path / "m")),
        ("export()", lambda: onnx_model.export(tmp_path / "e")),
        ("explain()", lambda: onnx_model.explain([np.zeros((8, 8, 3), dtype=np.uint8)])),
    ):
        with raises_naming(InputError, name, exports["transformer"][1], "ONNX"):
            call()
    heads = tiny_decoder_config("transformer").num_heads
    with raises_naming(InputError, "layer 2 of 2", f"{heads} heads"):
        onnx_model.caption([np.zeros((8, 8, 3), dtype=np.uint8)], layer=1)
    assert not (tmp_path / "m").exists() and not (tmp_path / "e").exists()


def test_the_export_refuses_folders_it_must_not_replace(exports, tmp_path, monkeypatch):
    model, folder = exports["lstm"]
    with raises_naming(InputError, "format", "onnx", "'torchscript'"):
        model.export(tmp_path / "x", format="torchscript")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with raises_naming(RunFolderError, run, "checkpoints", run / "onnx"):
        model.export(run)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    with raises_naming(RunFolderError, tmp_path / "notes", "notes.txt"):
        model.export(tmp_path / "notes")
    again = _copy(folder, tmp_path)
    with raises_naming(RunFolderError, again, "overwrite=True"):
        model.export(again)
    (again / "encoder.onnx").write_bytes(b"old")
    model.export(again, overwrite=True)  # replaced whole: the old graph is gone
    assert captioning.load(again, runtime="onnxruntime").caption([np.zeros((8, 8, 3), dtype=np.uint8)])
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)
    with raises_naming(InputError, 'pip install -e ".[onnx]"'):
        model.export(tmp_path / "without")
    assert (tmp_path / "notes" / "notes.txt").read_text() == "mine"


def test_an_int8_export_quantises_the_decoder_step_and_stays_close(exports, tiny_shapes, tmp_path):
    """int8 weights in the step's matrix products: its first-word log-probabilities move a little (on a
    trained model the captions stay; benchmarks/README.md), the encoder and the search as they were."""
    import onnx

    from captioning.models.decoding import START

    model, float_folder = exports["lstm"]
    folder = model.export(tmp_path / "int8", quantise="int8")
    assert json.loads((folder / "config.json").read_text())["onnx"]["quantisation"] == "int8"
    operators = {node.op_type for node in onnx.load(str(folder / "decoder_step.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= operators
    images = sorted((tiny_shapes.root / "test").glob("*.png"))
    first_words = []
    for onnx_model in (captioning.load(f, runtime="onnxruntime") for f in (float_folder, folder)):
        networks = onnx_model.networks
        pictures = np.stack([networks.preprocessing(Image.open(p).convert("RGB")) for p in images])
        annotations = networks.encode(pictures)
        tokens = np.full(len(images), START, dtype=np.int64)
        first_words.append(
            networks.step(networks.prepare(annotations), tokens, networks.init_state(annotations)).log_probs
        )
    difference = float(np.abs(first_words[0] - first_words[1]).max())
    assert 0 < difference < 0.05
    captions = captioning.load(folder, runtime="onnxruntime").caption(images, beam_size=3)
    assert all(np.allclose(c.attention.sum(axis=(1, 2)), 1, atol=1e-5) for c in captions)
    with raises_naming(InputError, "quantise", "none, int8", "'int4'"):
        model.export(tmp_path / "int4", quantise="int4")


@pytest.mark.slow
def test_the_benchmark_compares_the_three_runtimes_on_a_folder(exports, tiny_shapes):
    """benchmarks/onnx_speed.py at tiny sizes: every number it promises, and its word counts agree with
    the captions (no timing asserted)."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "onnx_speed.py"
    spec = importlib.util.spec_from_file_location("onnx_speed_under_test", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, _ = exports["lstm"]
    arguments = module.get_args_parser().parse_args(
        [str(model.source), str(tiny_shapes.root / "test"), "--repeats", "1"]
    )
    results = module.main(arguments)
    assert results["images"] == 4 and results["onnxruntime_same_words"] == 4
    assert 0 <= results["onnxruntime_max_log_prob_diff"] < 1e-4
    assert 0 <= results["onnxruntime_int8_same_words"] <= 4
    for name in ("torch", "onnxruntime", "onnxruntime_int8"):
        assert results[f"{name}_images_per_s"] > 0
    assert "| onnxruntime | " in module.table(results)
