"""An ONNX export (``model.export(folder, format="onnx")``) captions through ONNX Runtime as the PyTorch
model does: the same words, greedy and beam, log-probabilities within 1e-4, the same attention maps;
each decoder family's graphs step like its PyTorch ``step``; a folder that is not a whole, unchanged
export is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from messages import raises_naming
from PIL import Image
from tiny_models import tiny_checkpoint

import captioning
from captioning.config import DECODERS as CONFIG_DECODERS
from captioning.export.graphs import export_decoder_graphs
from captioning.export.runtime import Graph, OnnxDecoder, OnnxPrepared, OnnxState
from captioning.hub.checkpoint import CheckpointError
from captioning.models.captioner import build_decoder
from captioning.utils.errors import InputError
from captioning.utils.run_folder import RunFolderError

pytestmark = pytest.mark.usefixtures("single_thread")

C, GRID, V = 12, (3, 3), 13  # annotation channels, grid, vocabulary
P = GRID[0] * GRID[1]


@pytest.fixture(scope="module")
def exports(
    tmp_path_factory, tiny_shapes, shapes_vocab
) -> dict[str, tuple[captioning.CaptioningModel, Path]]:
    """Per decoder family: the PyTorch model (untrained, over the pretrained encoder's grids: captions
    that differ between images) and its export."""
    folder = tmp_path_factory.mktemp("onnx")
    made = {}
    for kind in ("lstm", "transformer"):
        checkpoint = tiny_checkpoint(
            folder / kind / "best.pt", tiny_shapes.root, shapes_vocab, kind, encoder_weights="pretrained"
        )
        model = captioning.load(checkpoint, device="cpu")
        made[kind] = (model, model.export(folder / kind / "onnx"))
    return made


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
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


# Each family's options that change what a step computes (the rest are the tiny defaults).
FAMILIES = {
    "lstm additive, scalar gate": ("lstm", {"embed_dim": 16, "hidden_dim": 16, "attention_dim": 16}),
    "lstm multihead, channel gate": (
        "lstm",
        {"scoring": "multihead", "num_heads": 2, "gate": "channel", "attention_dim": 16, "hidden_dim": 16},
    ),
    "lstm scaled dot, no gate, plain output": (
        "lstm",
        {"scoring": "scaled_dot", "gate": "none", "deep_output": False, "init_layers": 2, "hidden_dim": 16},
    ),
    "lstm hard attention": ("lstm", {"attention": "hard", "output_tanh": True, "hidden_dim": 16}),
    "transformer": ("transformer", {"d_model": 16, "num_heads": 2, "d_ff": 32, "decoder_layers": 2}),
    "transformer pre-norm": (
        "transformer",
        {
            "d_model": 16,
            "num_heads": 4,
            "d_ff": 32,
            "encoder_layers": 0,
            "decoder_layers": 3,
            "pre_norm": True,
        },
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_decoder_family_searches_the_same_through_its_graphs(tmp_path, family):
    """Greedy and beam search (4 beams, trigram blocking) over the graphs give the PyTorch decoder's
    words, log-probabilities and attention: ``prepare``, ``init_state``, ``step`` and ``select``
    round-trip, with rows per image and the cache length read from the shapes."""
    from search_options import settings

    from captioning.models.decoding import beam_search, greedy_search

    kind, options = FAMILIES[family]
    torch.manual_seed(0)
    decoder = build_decoder(CONFIG_DECODERS[kind].config(**options), V, C, GRID).eval()
    if kind == "lstm":  # a random LSTM that depends on the image (a random Transformer does)
        with torch.no_grad():
            for parameter in decoder.parameters():
                parameter.mul_(3.0)
    annotations = torch.randn(3, P, C, generator=torch.Generator().manual_seed(1))  # (B, P, C)
    layout = export_decoder_graphs(decoder, annotations[:2], tmp_path)
    names = (["annotations"], ["tokens", *layout.prepared_names(), *layout.state_names()])
    graphs = (
        Graph(tmp_path / "decoder_prepare.onnx", names[0], layout.prepared_names(), 1),
        Graph(tmp_path / "decoder_init.onnx", names[0], layout.state_names(), 1),
        Graph(tmp_path / "decoder_step.onnx", names[1], layout.step_outputs(), 1),
    )
    onnx_decoder = OnnxDecoder(graphs, layout, V, C, P, decoder.attention_view, decoder.describe_attention())
    assert isinstance(onnx_decoder.prepare(annotations), OnnxPrepared)
    assert isinstance(onnx_decoder.init_state(annotations), OnnxState)
    searches = [
        lambda d: greedy_search(d, annotations, settings(max_length=7)),
        lambda d: beam_search(
            d, annotations, settings(beam_size=4, max_length=7, length_alpha=0.7, block_trigrams=True)
        ),
    ]
    for search in searches:
        for want, have in zip(search(decoder), search(onnx_decoder), strict=True):
            assert have.tokens == want.tokens
            assert have.log_prob == pytest.approx(want.log_prob, abs=1e-4)
            torch.testing.assert_close(have.attention, want.attention, atol=1e-5, rtol=0)
            assert (have.betas is None) == (want.betas is None)
            if want.betas is not None:
                torch.testing.assert_close(have.betas, want.betas, atol=1e-5, rtol=0)


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
    ):
        with raises_naming(InputError, name, exports["transformer"][1], "ONNX"):
            call()
    with raises_naming(InputError, "layer 2 of 2", "2 heads"):
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
        captioner = onnx_model.captioner
        pictures = torch.stack([captioner.encoder.transform(Image.open(p).convert("RGB")) for p in images])
        annotations = captioner.encode(pictures)
        decoder = captioner.decoder
        tokens = torch.full((len(images),), START, dtype=torch.long)
        first_words.append(
            decoder.step(decoder.prepare(annotations), tokens, decoder.init_state(annotations)).log_probs
        )
    difference = (first_words[0] - first_words[1]).abs().max().item()
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
