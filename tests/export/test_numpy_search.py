"""The NumPy search over an export's graphs (``captioning.export.search``, ``captioning.export.beam``)
gives the PyTorch search's captions (``captioning.models.decoding``) over the PyTorch decoder, on
every strategy and option and every registered decoder family: the same words, log-probabilities and
scores within 1e-4, the same attention and gate values within 1e-4. Sampling is compared draw for
draw: both searches take their uniforms from one shared stream (torch's ``multinomial`` replaced by
the inverse of the cumulative distribution, the rule the NumPy sampler applies)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from export_checks import V, assert_same_captions, exported_networks, grids, random_decoder
from search_options import settings

from captioning.export.search import sample_captions as numpy_sample
from captioning.models import decoding
from captioning.models.base import DECODERS

pytestmark = pytest.mark.usefixtures("single_thread")

# Every registered family at its tiny sizes, and the options that change what a step computes.
FAMILIES = {
    **{kind: (kind, {}) for kind in DECODERS.names()},
    "lstm multihead, channel gate": ("lstm", {"scoring": "multihead", "num_heads": 2, "gate": "channel"}),
    "lstm scaled dot, no gate, plain output": (
        "lstm",
        {"scoring": "scaled_dot", "gate": "none", "deep_output": False, "init_layers": 2},
    ),
    "lstm hard attention": ("lstm", {"attention": "hard", "output_tanh": True, "embed_dim": 32}),
    "transformer pre-norm": (
        "transformer",
        {"num_heads": 4, "d_ff": 32, "encoder_layers": 0, "decoder_layers": 3, "pre_norm": True},
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


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    """A random decoder of one family, its three graphs as ``OnnxNetworks``, and (3, P, C) grids."""
    kind, options = FAMILIES[request.param]
    decoder = random_decoder(kind, gain=3.0 if kind == "lstm" else 2.0, **options)
    annotations = grids()
    return decoder, exported_networks(decoder, annotations, tmp_path_factory.mktemp("graphs")), annotations


@pytest.mark.parametrize("search", list(SEARCHES))
def test_the_numpy_search_gives_the_pytorch_captions(pair, search):
    decoder, networks, annotations = pair
    want = assert_same_captions(decoder, networks, annotations, SEARCHES[search])
    assert len({tuple(c.tokens) for c in want}) > 1 or search != "greedy", "captions must differ"


def test_draws_with_a_seed_repeat_and_follow_the_distribution(pair):
    """The NumPy sampler's own generator: one seed gives one set of captions; its first-word draws
    follow the model's distribution (the empirical frequency of each word within 4 standard errors)."""
    decoder, networks, annotations = pair
    arrays = annotations.numpy()
    config = settings(strategy="sample", max_length=5)
    first = numpy_sample(networks, arrays, config, np.random.default_rng(3))
    again = numpy_sample(networks, arrays, config, np.random.default_rng(3))
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
