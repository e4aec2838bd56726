"""Small decoders the search tests share: random ones, one whose next word depends only on the
previous, and a replay of a caption through ``decoder.step`` (the per-word reference)."""

from __future__ import annotations

import pytest
import torch
from search_options import settings

from captioning.config import LSTMDecoderConfig
from captioning.models.beam_search import beam_search
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.decoding import Caption, greedy_search, sample_captions

PAD, START, END = 0, 1, 2
C, P, V = 8, 9, 11  # annotation channels, grid positions, vocabulary (4 specials + 7 words)


def make_decoder(
    seed: int = 0,
    vocab_size: int = V,
    scoring: str = "additive",
    gate: str = "scalar",
    gain: float = 3.0,
    end_bias: float | None = None,
) -> ShowAttendTellDecoder:
    """A random decoder in eval mode.

    ``gain`` scales every parameter: the default initialisation gives near-uniform word
    distributions and the same caption for every image; larger weights give captions that differ
    per image and end at different lengths. ``end_bias`` sets the output bias of ``<end>``.
    """
    torch.manual_seed(seed)
    config = LSTMDecoderConfig(
        scoring=scoring, num_heads=4, embed_dim=16, hidden_dim=16, attention_dim=16, gate=gate, dropout=0.0
    )
    decoder = ShowAttendTellDecoder.from_config(config, vocab_size, C).eval()
    with torch.no_grad():
        for parameter in decoder.parameters():
            parameter.mul_(gain)
        if end_bias is not None:
            decoder.out.bias[END] = end_bias
    return decoder


def annotations_for(batch: int, seed: int = 100) -> torch.Tensor:
    return torch.randn(batch, P, C, generator=torch.Generator().manual_seed(seed))


def varied_decoder(annotations: torch.Tensor, max_length: int, **options) -> ShowAttendTellDecoder:
    """The first random decoder (by seed) whose greedy captions of ``annotations`` end at 3+ lengths.

    Searching keeps the tests meaningful (images finish at different steps) whatever the
    initialisation of the layers draws from the random generator.
    """
    for seed in range(50):
        decoder = make_decoder(seed=seed, **options)
        if (
            len({len(c.tokens) for c in greedy_search(decoder, annotations, settings(max_length=max_length))})
            >= 3
        ):
            return decoder
    raise AssertionError("no random decoder gives captions of varied lengths")


@torch.no_grad()
def replay(decoder, annotations: torch.Tensor, tokens: list[int], finished: bool):
    """Feed ``<start> tokens`` through ``decoder.step`` for one image (1, P, C).

    Returns the caption's log-probability (plus ``<end>`` when finished), alphas (len, P), betas.
    """
    prepared, state = decoder.prepare(annotations), decoder.init_state(annotations)
    previous, log_prob, alphas, betas = START, 0.0, [], []
    for word in tokens + ([END] if finished else []):
        out = decoder.step(prepared, torch.tensor([previous]), state)
        log_prob += float(out.log_probs[0, word])
        alphas.append(out.alpha[0])
        betas.append(None if out.beta is None else out.beta[0])
        state, previous = out.state, word
    alphas = torch.stack(alphas[: len(tokens)]) if tokens else torch.zeros(0, P)
    betas = betas[: len(tokens)]
    betas = None if (betas and betas[0] is None) else (torch.stack(betas) if betas else torch.zeros(0))
    return log_prob, alphas, betas


def assert_same_caption(actual: Caption, expected: Caption, atol: float = 1e-5):
    assert actual.tokens == expected.tokens
    assert actual.finished == expected.finished
    assert actual.log_prob == pytest.approx(expected.log_prob, abs=atol)
    assert actual.score == pytest.approx(expected.score, abs=atol)
    torch.testing.assert_close(actual.attention, expected.attention, rtol=0, atol=atol)
    if expected.betas is None:
        assert actual.betas is None
    else:
        torch.testing.assert_close(actual.betas, expected.betas, rtol=0, atol=atol)


def trigrams(tokens: list[int]) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + 3]) for i in range(len(tokens) - 2)]


def bigram_decoder(strength: float = 6.0) -> ShowAttendTellDecoder:
    """A decoder whose next word depends only on the previous one and loves the cycle 4 5 4 5 ...
    (its logits ``strength`` above the others' in the mean)."""
    decoder = make_decoder(seed=9, gate="none")
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(9))  # table[previous, next]
    table[START, 4] = table[4, 5] = table[5, 4] = strength
    table[:, END] = -4.0
    with torch.no_grad():
        decoder.embedding.weight.zero_()
        decoder.embedding.weight[:, :V] = torch.eye(V)  # one-hot embeddings (embed_dim 16 >= V)
        decoder.hidden_to_out.weight.zero_()
        decoder.hidden_to_out.bias.zero_()
        decoder.context_to_out.weight.zero_()
        decoder.out.weight.zero_()
        decoder.out.weight[:, :V] = table.T
        decoder.out.bias.zero_()
    return decoder


def all_strategies(decoder, annotations):
    torch.manual_seed(10)
    return {
        "greedy": greedy_search(decoder, annotations, settings(max_length=7)),
        "beam3": beam_search(decoder, annotations, settings(beam_size=3, max_length=7)),
        "beam4-alpha": beam_search(
            decoder, annotations, settings(beam_size=4, max_length=7, length_alpha=1.0)
        ),
        "sample": sample_captions(decoder, annotations, settings(max_length=7, temperature=1.5)),
    }
