"""The contract of every attribution method in ``METHODS`` (parametrized over its names and the decoder
families it explains, so a newly registered method is held to it without test code).

On two tiny decoders (the LSTM and the Transformer) and two captions of different lengths, a method's
maps are (B, T, P), finite, 0 after each caption's end and not all 0; the same call gives the same
maps; an image's maps do not depend on the other image explained beside it; and the map of word t
does not depend on the words after it (each word's score is ``p(w_t | w_<t, grid)``).
"""

from __future__ import annotations

import pytest
import torch

from captioning.config import LSTMDecoderConfig, TransformerDecoderConfig
from captioning.explain import ExplainInputs, ExplainSettings, explain
from captioning.explain.methods import METHODS
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.models.captioner import build_decoder

V, C, GRID = 11, 6, (2, 3)
P = GRID[0] * GRID[1]
TOKENS = [[4, 7, 5, 9], [6, 8]]
FAMILIES = {
    "lstm": LSTMDecoderConfig(embed_dim=8, hidden_dim=8, attention_dim=8, dropout=0.0),
    "transformer": TransformerDecoderConfig(
        d_model=12, num_heads=3, d_ff=16, encoder_layers=1, decoder_layers=2, dropout=0.0
    ),
}

pytestmark = pytest.mark.usefixtures("single_thread")


def decoder_of(family: str):
    torch.manual_seed(0)
    return build_decoder(FAMILIES[family], V, C, GRID).double().eval()


def pairs() -> list:
    """(method, family) for every registered method and every family it can explain."""
    return [
        pytest.param(name, family, id=f"{name}-{family}")
        for name, method in METHODS.items()
        for family in FAMILIES
        if method.unsupported(decoder_of(family)) is None
    ]


def maps_of(name: str, decoder, annotations: torch.Tensor, tokens: list[list[int]]) -> torch.Tensor:
    captions, lengths = caption_tensor(tokens)
    baseline = torch.linspace(-1, 1, C, dtype=torch.float64)  # one (C,) feature: no image depends on another
    scorer = WordScorer(decoder, captions, lengths)
    return explain(
        name, ExplainInputs(scorer, annotations, baseline, ExplainSettings(ig_steps=4, batch_rows=7))
    )


def grids() -> torch.Tensor:
    return torch.rand(2, P, C, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def test_every_registered_method_explains_at_least_one_family():
    explained = {
        name
        for name, method in METHODS.items()
        for f in FAMILIES
        if method.unsupported(decoder_of(f)) is None
    }
    assert explained == set(METHODS.names())


@pytest.mark.parametrize(("name", "family"), pairs())
def test_maps_are_finite_of_the_captions_shape_and_zero_after_each_end(name, family):
    maps = maps_of(name, decoder_of(family), grids(), TOKENS)
    assert maps.shape == (2, 4, P) and torch.isfinite(maps).all()
    assert maps[1, 2:].abs().max() == 0  # the second caption has two words
    assert maps[0].abs().max() > 0 and maps[1, :2].abs().max() > 0


@pytest.mark.parametrize(("name", "family"), pairs())
def test_the_same_call_gives_the_same_maps(name, family):
    decoder, annotations = decoder_of(family), grids()
    torch.testing.assert_close(
        maps_of(name, decoder, annotations, TOKENS), maps_of(name, decoder, annotations, TOKENS)
    )


@pytest.mark.parametrize(("name", "family"), pairs())
def test_an_images_maps_do_not_depend_on_the_image_beside_it(name, family):
    decoder, annotations = decoder_of(family), grids()
    together = maps_of(name, decoder, annotations, TOKENS)
    alone = maps_of(name, decoder, annotations[:1], TOKENS[:1])
    torch.testing.assert_close(together[:1], alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("name", "family"), pairs())
def test_a_words_map_does_not_depend_on_the_words_after_it(name, family):
    decoder, annotations = decoder_of(family), grids()[:1]
    first = maps_of(name, decoder, annotations, [[4, 7, 5, 9]])
    changed = maps_of(name, decoder, annotations, [[4, 7, 10, 3]])  # words 3 and 4 differ
    torch.testing.assert_close(first[:, :2], changed[:, :2], atol=1e-5, rtol=1e-4)
