"""The NumPy search over an export's graphs (``captioning.export.search``, ``captioning.export.beam``)
gives the PyTorch search's captions (``captioning.models.decoding``) over the PyTorch decoder, on
every strategy and option: the same words, log-probabilities and scores within 1e-4, the same
attention and gate values within 1e-4. Sampling is compared draw for draw: both searches take their
uniforms from one shared stream (torch's ``multinomial`` replaced by the inverse of the cumulative
distribution, the rule the NumPy sampler applies)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from search_options import settings

from captioning.config import DECODERS as CONFIG_DECODERS
from captioning.export.beam import beam_search as numpy_beam
from captioning.export.graphs import export_decoder_graphs
from captioning.export.runtime import Graph, OnnxNetworks, Preprocessing
from captioning.export.search import greedy_search as numpy_greedy
from captioning.export.search import sample_captions as numpy_sample
from captioning.models import decoding
from captioning.models.captioner import build_decoder

pytestmark = pytest.mark.usefixtures("single_thread")

C, GRID, V = 12, (3, 3), 13  # annotation channels, grid, vocabulary
P = GRID[0] * GRID[1]

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

# Every strategy, and every option that changes what a search chooses.
SEARCHES = {
    "greedy": settings(strategy="greedy", max_length=7),
    "greedy, min length, repetition penalty, no unk": settings(
        strategy="greedy", max_length=6, min_length=3, repetition_penalty=1.7, forbid_unk=True
    ),
    "beam 4, length alpha, trigrams": settings(
        beam_size=4, max_length=7, length_alpha=0.7, block_trigrams=True
    ),
    "beam 3, three returned": settings(beam_size=3, num_return=3, max_length=6),
    "diverse beam 6 in 3 groups": settings(
        beam_size=6, beam_groups=3, diversity=0.8, num_return=4, max_length=6
    ),
    "beam, repetition penalty below 1, min length": settings(
        beam_size=2, repetition_penalty=0.6, min_length=2, max_length=5
    ),
    "sample": settings(strategy="sample", max_length=7),
    "sample top-k, temperature": settings(strategy="sample", top_k=3, temperature=0.7, max_length=6),
    "sample nucleus, three returned, trigrams": settings(
        strategy="sample", top_p=0.8, num_return=3, block_trigrams=True, max_length=6
    ),
}


class SharedDraws:
    """One stream of uniforms both searches draw from: ``random(n)`` for NumPy, ``multinomial`` for torch
    (inverse of the cumulative distribution: the first word whose cumulative mass passes the draw)."""

    def __init__(self, seed: int):
        self.uniforms = np.random.default_rng(seed).random(100_000)
        self.used = 0

    def random(self, n: int) -> np.ndarray:
        draws = self.uniforms[self.used : self.used + n]
        self.used += n
        return draws

    def multinomial(self, probs: torch.Tensor, count: int) -> torch.Tensor:
        assert count == 1
        cumulative = probs.cumsum(dim=1)
        draws = torch.from_numpy(self.random(probs.size(0))).to(probs.dtype) * cumulative[:, -1]
        chosen = (cumulative <= draws.unsqueeze(1)).sum(dim=1).clamp(max=probs.size(1) - 1)
        return chosen.unsqueeze(1)


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    """A random decoder of one family, its three graphs as ``OnnxNetworks``, and (3, P, C) grids."""
    kind, options = FAMILIES[request.param]
    torch.manual_seed(0)
    decoder = build_decoder(CONFIG_DECODERS[kind].config(**options), V, C, GRID).eval()
    with torch.no_grad():  # random weights that make the words depend on the image
        for parameter in decoder.parameters():
            parameter.mul_(3.0 if kind == "lstm" else 2.0)
    annotations = torch.randn(3, P, C, generator=torch.Generator().manual_seed(1))  # (B, P, C)
    folder = tmp_path_factory.mktemp("graphs")
    layout = export_decoder_graphs(decoder, annotations[:2], folder)
    step_inputs = ["tokens", *layout.prepared_names(), *layout.state_names()]
    graphs = (
        None,  # no encoder: the grids are given
        Graph(folder / "decoder_prepare.onnx", ["annotations"], layout.prepared_names(), 1),
        Graph(folder / "decoder_init.onnx", ["annotations"], layout.state_names(), 1),
        Graph(folder / "decoder_step.onnx", step_inputs, layout.step_outputs(), 1),
    )
    preprocessing = Preprocessing(8, "bilinear", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    networks = OnnxNetworks(graphs, layout, preprocessing, GRID, C, V)  # type: ignore[arg-type]
    return decoder, networks, annotations


def _flat(caption) -> list:
    return [caption, *caption.alternatives]


@pytest.mark.parametrize("search", list(SEARCHES))
def test_the_numpy_search_gives_the_pytorch_captions(pair, search, monkeypatch):
    decoder, networks, annotations = pair
    config = SEARCHES[search]
    draws = SharedDraws(seed=7)
    monkeypatch.setattr(torch, "multinomial", draws.multinomial)
    want = decoding.decode(decoder, annotations, config)
    draws.used = 0  # the same uniforms, in the same order
    grids = annotations.numpy()
    if config.strategy == "greedy":
        got = numpy_greedy(networks, grids, config)
    elif config.strategy == "beam":
        got = numpy_beam(networks, grids, config)
    else:
        got = numpy_sample(networks, grids, config, draws)  # type: ignore[arg-type]
    assert len({tuple(c.tokens) for c in want}) > 1 or search != "greedy", "captions must differ"
    for expected, have in zip(want, got, strict=True):
        assert len(_flat(have)) == len(_flat(expected))
        for one, other in zip(_flat(expected), _flat(have), strict=True):
            assert other.tokens == one.tokens
            assert other.finished == one.finished
            assert other.log_prob == pytest.approx(one.log_prob, abs=1e-4)
            assert other.score == pytest.approx(one.score, abs=1e-4)
            np.testing.assert_allclose(other.attention, one.attention.numpy(), atol=1e-4)
            assert (other.betas is None) == (one.betas is None)
            if one.betas is not None:
                np.testing.assert_allclose(other.betas, one.betas.numpy(), atol=1e-4)


def test_draws_with_a_seed_repeat_and_follow_the_distribution(pair):
    """The NumPy sampler's own generator: one seed gives one set of captions; its first-word draws
    follow the model's distribution (the empirical frequency of each word within 4 standard errors)."""
    decoder, networks, annotations = pair
    grids = annotations.numpy()
    config = settings(strategy="sample", max_length=5)
    first = numpy_sample(networks, grids, config, np.random.default_rng(3))
    again = numpy_sample(networks, grids, config, np.random.default_rng(3))
    assert [c.tokens for c in first] == [c.tokens for c in again]
    with torch.no_grad():  # the model's distribution of the first word of image 0, in torch
        prepared = decoder.prepare(annotations[:1])
        tokens = torch.full((1,), decoding.START, dtype=torch.long)
        log_probs = decoder.step(prepared, tokens, decoder.init_state(annotations[:1])).log_probs[0]
    log_probs[[decoding.PAD, decoding.START]] = float("-inf")
    probs = torch.softmax(log_probs, 0).numpy()
    n = 4000
    from captioning.export.search import sampler

    choose = sampler(settings(strategy="sample"), np.random.default_rng(5))
    drawn = choose(np.tile(log_probs.numpy()[None], (n, 1)))
    frequency = np.bincount(drawn, minlength=V) / n
    assert np.all(np.abs(frequency - probs) <= 4 * np.sqrt(probs * (1 - probs) / n) + 1e-9)
