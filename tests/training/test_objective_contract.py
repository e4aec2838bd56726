"""The contract of every training objective in ``OBJECTIVES`` (parametrized over its names, so a newly
registered objective is held to it, and fails here until ``TRAINS_WITH`` names a small decoder that
trains with it).

On a batch of three captions of different lengths: the total is a finite scalar whose gradient is
finite and reaches the decoder; what follows each caption's end (padding) changes nothing; the same
seed gives the same terms; and the cross-entropy term is the mean negative log-likelihood of the
target words, computed here from the logits, whatever else the objective adds.
"""

from __future__ import annotations

import pytest
import torch

from captioning.config import DECODERS, TrainConfig
from captioning.data.vocab import Vocabulary
from captioning.models.captioner import build_decoder
from captioning.training.losses import OBJECTIVES

C, GRID, V = 12, (3, 3), 13  # annotation channels, grid, vocabulary
P = GRID[0] * GRID[1]

# A small decoder (family, options) that trains with each registered objective.
TRAINS_WITH = {
    "cross_entropy": ("lstm", {"embed_dim": 16, "hidden_dim": 16, "attention_dim": 16, "dropout": 0.0}),
    "hard_attention": (
        "lstm",
        {"embed_dim": 16, "hidden_dim": 16, "attention_dim": 16, "dropout": 0.0, "attention": "hard"},
    ),
}

pytestmark = pytest.mark.usefixtures("single_thread")


def decoder_and_config(name: str):
    kind, options = TRAINS_WITH[name]
    config = DECODERS[kind].config(**options)
    torch.manual_seed(0)
    decoder = build_decoder(config, V, C, GRID).train()
    assert decoder.objective == name, f"TRAINS_WITH[{name!r}] builds a decoder of another objective"
    return decoder, config


def batch(padding: int = Vocabulary.pad_id):
    """Two images, three captions of lengths 6, 4 and 5 (the second image has two); after each end,
    ``padding``."""
    generator = torch.Generator().manual_seed(1)
    annotations = torch.randn(2, P, C, generator=generator)  # (B, P, C)
    captions = torch.randint(4, V, (3, 6), generator=generator)  # (N, L)
    captions[:, 0] = Vocabulary.start_id
    lengths = torch.tensor([6, 4, 5])
    for row, length in enumerate(lengths.tolist()):
        captions[row, length - 1] = Vocabulary.end_id
        captions[row, length:] = padding
    return annotations, captions, lengths, torch.tensor([0, 1, 1])


def terms_of(name: str, padding: int = Vocabulary.pad_id, seed: int = 5):
    decoder, config = decoder_and_config(name)
    annotations, captions, lengths, image_index = batch(padding)
    torch.manual_seed(seed)
    output = decoder(annotations, captions, lengths, image_index)
    train = TrainConfig(label_smoothing=0.0)
    return (
        decoder,
        output,
        captions,
        lengths,
        OBJECTIVES[name](decoder, output, captions, config, train, None),
    )


def test_every_registered_objective_has_a_decoder_that_trains_with_it():
    assert set(OBJECTIVES.names()) <= set(TRAINS_WITH), (
        "add a small decoder of the new objective to TRAINS_WITH"
    )


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_the_total_is_a_finite_scalar_whose_gradient_is_finite(name):
    decoder, _, _, _, terms = terms_of(name)
    assert terms.total.dim() == 0 and torch.isfinite(terms.total)
    terms.total.backward()
    gradients = [p.grad for p in decoder.parameters() if p.grad is not None]
    assert gradients and all(torch.isfinite(g).all() for g in gradients)
    assert any(g.abs().sum() > 0 for g in gradients)


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_what_follows_a_captions_end_changes_nothing(name):
    padded = terms_of(name, padding=Vocabulary.pad_id)[-1]
    other = terms_of(name, padding=7)[-1]  # a real word where the padding was
    torch.testing.assert_close(other.total, padded.total, rtol=0, atol=1e-6)
    torch.testing.assert_close(other.cross_entropy, padded.cross_entropy, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_the_same_seed_gives_the_same_terms(name):
    first, second = terms_of(name, seed=11)[-1], terms_of(name, seed=11)[-1]
    assert torch.equal(first.total, second.total) and torch.equal(first.cross_entropy, second.cross_entropy)


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_the_cross_entropy_term_is_the_mean_negative_log_likelihood_of_the_targets(name):
    _, output, captions, lengths, terms = terms_of(name)
    total, count = 0.0, 0
    for row, length in enumerate(lengths.tolist()):
        for t in range(length - 1):  # the word after each input word, up to and with <end>
            log_probs = torch.log_softmax(output.logits[row, t].detach().double(), dim=-1)
            total -= float(log_probs[captions[row, t + 1]])
            count += 1
    assert float(terms.cross_entropy) == pytest.approx(total / count, rel=1e-5)
