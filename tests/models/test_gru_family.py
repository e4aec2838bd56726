"""A decoder family whose state is one tensor works end to end: the GRU of ``gru_family.py``,
registered for each test with the registry's scope (``DECODERS.registered``), is PyTorch's
``GRUCell``, keeps the decoder contract (``test_decoder_contract``'s checks, run on it), passes the
export check every registered family passes (``export_checks.check_export``, unchanged), trains with
train.py's code, and its trained checkpoint beam-searches and captions through an ONNX export as in
PyTorch. Nothing in the package names it."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_decoder_contract as contract
import torch
from export_checks import check_export, grids, random_decoder
from gru_family import GRUDecoder, GRUDecoderConfig, GRUState
from PIL import Image
from search_decoders import replay
from search_options import settings
from test_training import as_flags, data_root, read_steps, tiny_overrides, train_in_process  # noqa: F401
from torch import nn

import captioning
from captioning.config import ConfigError
from captioning.models.base import DECODERS
from captioning.models.beam_search import beam_search
from captioning.models.decoding import greedy_search

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def gru():
    """The GRU family registered for the test only."""
    with DECODERS.registered("gru", GRUDecoder, GRUDecoderConfig):
        yield


def test_the_cell_is_pytorchs_gru_cell_over_the_word_and_the_context(gru):
    decoder = random_decoder("gru", gain=1.0)
    embed_dim, context_dim, hidden_dim = (
        decoder.embedding.embedding_dim,
        decoder.attention.context_dim,
        decoder.hidden_dim,
    )
    reference = nn.GRUCell(embed_dim + context_dim, hidden_dim)
    with torch.no_grad():  # x = [E y; z]: the embedding's and the context's columns side by side
        input_weights = [decoder.embed_to_gates.weight, decoder.context_to_gates.weight]
        reference.weight_ih.copy_(torch.cat(input_weights, 1))
        reference.bias_ih.copy_(decoder.embed_to_gates.bias)
        reference.weight_hh.copy_(decoder.hidden_to_gates.weight)
        reference.bias_hh.copy_(decoder.hidden_to_gates.bias)
        generator = torch.Generator().manual_seed(3)
        embedded = torch.randn(5, embed_dim, generator=generator)
        context = torch.randn(5, context_dim, generator=generator)
        hidden = torch.randn(5, hidden_dim, generator=generator)
        state = decoder._recur(decoder.embed_to_gates(embedded), context, GRUState(hidden))
        want = reference(torch.cat([embedded, context], 1), hidden)
    assert isinstance(state, GRUState) and len(state) == 1
    torch.testing.assert_close(state.h, want, rtol=0, atol=1e-6)


def test_the_gru_keeps_the_decoder_contract(gru, monkeypatch):
    monkeypatch.setitem(contract.SMALL, "gru", {**contract.SMALL["lstm"]})
    contract.test_teacher_forcing_equals_the_step_by_step_loop("gru")
    contract.test_select_reorders_the_state_as_beam_search_does("gru")
    contract.test_the_configuration_round_trips_through_a_checkpoint_dict("gru")
    contract.test_the_training_objective_is_finite_and_reaches_every_parameter("gru")
    with pytest.raises(ConfigError, match="model.decoder.attention"):
        GRUDecoderConfig(attention="hard")


def test_the_gru_passes_the_export_check_of_every_family(gru, tmp_path):
    networks = check_export(random_decoder("gru"), grids(), tmp_path)
    assert networks.layout.state == 1  # h alone


def test_the_gru_trains_and_its_checkpoint_beam_searches_and_exports(gru, data_root, tmp_path):  # noqa: F811
    output = tmp_path / "run"
    sizes = {"model.decoder.embed_dim": 16, "model.decoder.hidden_dim": 32, "model.decoder.attention_dim": 16}
    overrides = tiny_overrides(data_root, output, **{"model.decoder.kind": "gru", **sizes, "train.epochs": 3})
    result = train_in_process(as_flags(overrides))
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [step["loss"] for step in read_steps(output)]
    third = len(losses) // 3
    assert sum(losses[-third:]) / third < sum(losses[:third]) / third  # the last epoch's below the first's

    model = captioning.load(output / "checkpoints" / "best.pt", device="cpu")
    decoder = model.captioner.decoder
    images = sorted((data_root / "test").glob("*.png"))
    pixels = torch.stack([model.captioner.encoder.transform(_rgb(path)) for path in images])
    with torch.no_grad():
        annotations = model.captioner.encode(pixels)  # (B, P, C)
        assert type(decoder) is GRUDecoder and isinstance(decoder.init_state(annotations), GRUState)
    greedy = greedy_search(decoder, annotations, settings(min_length=2, max_length=8))
    one_beam = beam_search(decoder, annotations, settings(beam_size=1, min_length=2, max_length=8))
    assert [c.tokens for c in one_beam] == [c.tokens for c in greedy]
    beams = beam_search(decoder, annotations, settings(beam_size=3, min_length=2, max_length=8))
    for caption, image in zip(beams, annotations, strict=True):
        log_prob, alphas, _ = replay(decoder, image.unsqueeze(0), caption.tokens, caption.finished)
        assert caption.log_prob == pytest.approx(log_prob, abs=1e-4)
        torch.testing.assert_close(caption.attention, alphas, rtol=0, atol=1e-5)

    onnx_model = captioning.load(model.export(tmp_path / "onnx"), runtime="onnxruntime")
    options = {"beam_size": 3, "max_length": 8}
    expected = model.caption(images, **options)
    for want, have in zip(expected, onnx_model.caption(images, **options), strict=True):
        assert have.words == want.words
        assert have.log_prob == pytest.approx(want.log_prob, abs=1e-4)


def test_the_extending_pages_gru_example_is_this_family():
    """docs/extending.md's GRU, run as written (registered in a scope), builds from ``model.decoder.kind``
    and gives this family's outputs with the same seed."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text(encoding="utf-8")
    blocks = [block.split("```", 1)[0] for block in page.split("```python\n")[1:]]
    (example,) = [block for block in blocks if '@register_decoder("gru"' in block]
    annotations, captions = grids(2), torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])
    lengths = torch.tensor([5, 3])
    outputs = []
    with DECODERS.scope():
        namespace: dict = {}
        exec(compile(example, "extending.md", "exec"), namespace)  # the page's own code
        assert DECODERS.implementation_of("gru") is namespace["GRUDecoder"]
        outputs.append(random_decoder("gru")(annotations, captions, lengths))
    with DECODERS.registered("gru", GRUDecoder, GRUDecoderConfig):
        outputs.append(random_decoder("gru")(annotations, captions, lengths))
    torch.testing.assert_close(outputs[0].logits, outputs[1].logits, rtol=0, atol=0)
    torch.testing.assert_close(outputs[0].alphas, outputs[1].alphas, rtol=0, atol=0)


def _rgb(path: Path) -> Image.Image:
    return Image.open(path).convert("RGB")
