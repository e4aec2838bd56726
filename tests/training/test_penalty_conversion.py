"""The authors' ``alpha_c`` is ``lambda = alpha_c * N / P`` here, as docs/training.md and the COCO
configurations say; their hard-attention weights are ``lambda_r = N / (10 T)`` and ``lambda_e = N *
alpha_entropy_c``, and under hard attention their penalty has no gradient.

The authors' ``capgen.py`` minimises ``mean_n(-log p(y_n)) + alpha_c * ((1 - alphas.sum(0)) ** 2)
.sum(0).mean()`` on (T, N, P) attention: the penalty summed over the batch's N captions and
averaged over the P positions. Per caption that is ``(1/N) * sum_n [-log p(y_n) + alpha_c * N / P *
penalty_n]``: equation 14 with ``lambda = alpha_c * N / P``.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from tool_runs import REPO

from captioning.config import TrainConfig
from captioning.config.loading import load_config
from captioning.models.decoder import DecoderOutput, HardAttentionDecoder, ShowAttendTellDecoder
from captioning.training.losses import doubly_stochastic_penalty, hard_attention_objective


@pytest.mark.parametrize(("captions", "positions"), [(64, 196), (10, 49), (3, 81)])
def test_the_authors_objective_is_equation_14_with_alpha_c_times_n_over_p(captions, positions):
    generator = torch.Generator().manual_seed(captions)
    steps, alpha_c = 7, 1.0
    alphas = torch.rand(steps, captions, positions, generator=generator, dtype=torch.float64)
    alphas = alphas / alphas.sum(-1, keepdim=True)  # (T, N, P), each step's map sums to 1
    log_likelihood = -torch.rand(captions, generator=generator, dtype=torch.float64) * 30  # (N,)
    authors = (-log_likelihood).mean() + alpha_c * ((1.0 - alphas.sum(0)) ** 2).sum(0).mean()

    lam = alpha_c * captions / positions
    per_caption = alphas.permute(1, 0, 2)  # (N, T, P)
    mask = torch.ones(captions, steps, dtype=torch.bool)
    ours = ((-log_likelihood).sum() + lam * doubly_stochastic_penalty(per_caption, mask)) / captions
    assert float(ours) == pytest.approx(float(authors), rel=1e-12)


def test_the_coco_configurations_use_the_authors_converted_weight_and_the_docs_say_so():
    authors = 1.0 * 64 / 196  # their COCO script: alpha_c = 1, batch 64, a 14x14 grid
    for name in ("coco_resnet101", "coco_lite0", "coco_clip_vit"):
        config = load_config(REPO / "configs" / f"{name}.yaml")
        assert config.model.decoder.doubly_stochastic == pytest.approx(authors, abs=0.005), name
    text = (REPO / "docs" / "training.md").read_text()
    assert "λ = `alpha_c` · N / P" in text
    assert not re.search(r"use λ = 1, the value of the authors", text)
    for name in ("flickr8k", "flickr30k", "imagefolder"):
        assert "not the authors'" in (REPO / "configs" / f"{name}.yaml").read_text(), name


def authors_alpha_gradient(alphas, sampled, costs, baseline, entropy_c):
    """The gradient capgen.py passes for the (T, N, P) attention under hard attention (``known_grads``):
    ``(b - mean_t cost)[None, :, None] / 10 * (-s / alpha) + alpha_entropy_c * (log alpha + 1)``,
    with ``costs`` (T, N) the per-token costs and ``sampled`` (T, N, P) the one-hot locations."""
    return (baseline - costs.mean(0))[None, :, None] / 10.0 * (-sampled / alphas) + entropy_c * (
        torch.log(alphas) + 1.0
    )


def our_alpha_gradient(alphas, sampled, logits, captions, baseline, config, steps):
    """The gradient of hard_attention_loss (the configuration's weights) on the same (T, N, P) attention,
    on the authors' scale (their cost is a mean over captions of sums over tokens: T times ours)."""
    leaf = alphas.permute(1, 0, 2).detach().clone().requires_grad_(True)  # (N, T, P)
    location = sampled.permute(1, 0, 2).argmax(-1, keepdim=True)  # (N, T, 1)
    output = DecoderOutput(
        logits=logits,
        alphas=leaf,
        mask=torch.ones(leaf.shape[:2], dtype=torch.bool),
        location_log_probs=torch.log(leaf).gather(2, location).squeeze(2),
        entropies=-(leaf * torch.log(leaf)).sum(-1),
    )
    decoder = ShowAttendTellDecoder.from_config(config, vocab_size=logits.size(-1), annotation_dim=4)
    assert isinstance(decoder, HardAttentionDecoder)
    # their baseline b is a per-token mean cost; this one a summed log-likelihood: -T b
    decoder.reward_baseline.fill_(-steps * baseline)
    loss = hard_attention_objective(decoder, output, captions, config, TrainConfig(), None)
    (gradient,) = torch.autograd.grad(loss.total, leaf)
    return steps * gradient.permute(1, 0, 2)  # (T, N, P)


def close(ours, authors, tolerance=1e-6):
    """Equal up to ``tolerance`` of the gradient's scale (the rewards are float32 log-probabilities)."""
    return float((ours - authors).abs().max()) <= tolerance * float(authors.abs().max())


def hard_attention_batch(captions, steps, positions, vocab=11, seed=0):
    generator = torch.Generator().manual_seed(seed)
    alphas = torch.softmax(
        torch.randn(steps, captions, positions, generator=generator, dtype=torch.float64), -1
    )
    sampled = torch.nn.functional.one_hot(
        torch.multinomial(alphas.reshape(-1, positions), 1, generator=generator).view(steps, captions),
        positions,
    ).double()  # (T, N, P)
    logits = torch.randn(captions, steps, vocab, generator=generator, dtype=torch.float64)
    tokens = torch.randint(3, vocab, (captions, steps + 1), generator=generator)  # <start> w1 ... w_T
    costs = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), tokens[:, 1:], reduction="none"
    ).T  # (T, N) -log p
    return alphas, sampled, logits, tokens, costs


def test_the_arctic_configuration_gives_the_authors_hard_attention_gradients():
    """capgen.py at their COCO batch (N = 64) and a 12-word batch on 196 positions: equal to 1e-6 of
    the gradient's scale with the exact weights, 1e-3 with the configuration's rounded ones."""
    config = load_config(REPO / "configs" / "coco_arctic.yaml").model.decoder
    config = dataclasses.replace(config, attention="hard")
    alphas, sampled, logits, tokens, costs = hard_attention_batch(64, 12, 196)
    baseline = 2.5
    authors = authors_alpha_gradient(alphas, sampled, costs, baseline, entropy_c=0.002)
    ours = our_alpha_gradient(alphas, sampled, logits, tokens, baseline, config, steps=12)
    assert close(ours, authors, 1e-3)  # the configuration rounds N / (10 T) to 0.533
    assert not close(ours, authors, 1e-5)
    exact = dataclasses.replace(config, hard_reinforce=64 / 120, hard_entropy=64 * 0.002)
    ours = our_alpha_gradient(alphas, sampled, logits, tokens, baseline, exact, steps=12)
    assert close(ours, authors)


@pytest.mark.parametrize(("captions", "steps", "positions"), [(16, 7, 49), (5, 20, 81)])
def test_the_conversion_is_n_over_10t_and_n_times_alpha_entropy_c(captions, steps, positions):
    config = dataclasses.replace(
        load_config(REPO / "configs" / "coco_arctic.yaml").model.decoder,
        attention="hard",
        hard_reinforce=captions / (10 * steps),
        hard_entropy=captions * 0.01,
    )
    alphas, sampled, logits, tokens, costs = hard_attention_batch(captions, steps, positions, seed=steps)
    authors = authors_alpha_gradient(alphas, sampled, costs, 1.5, entropy_c=0.01)
    ours = our_alpha_gradient(alphas, sampled, logits, tokens, 1.5, config, steps)
    assert close(ours, authors)


def test_the_penalty_has_no_gradient_under_the_authors_hard_attention_and_has_one_as_the_paper_reads():
    config = dataclasses.replace(
        load_config(REPO / "configs" / "coco_arctic.yaml").model.decoder,
        attention="hard",
        hard_reinforce=8 / 50,
        hard_entropy=8 * 0.002,
    )
    assert config.doubly_stochastic > 0 and config.hard_alpha_gradients == "authors"
    alphas, sampled, logits, tokens, costs = hard_attention_batch(8, 5, 10, seed=3)
    authors = authors_alpha_gradient(alphas, sampled, costs, 2.0, entropy_c=0.002)
    ours = our_alpha_gradient(alphas, sampled, logits, tokens, 2.0, config, 5)
    assert close(ours, authors)
    paper = dataclasses.replace(config, hard_alpha_gradients="paper")
    with_penalty = our_alpha_gradient(alphas, sampled, logits, tokens, 2.0, paper, 5)
    # the paper's equation adds lambda * d/d alpha sum_i (1 - sum_t alpha_ti)^2 (on the authors' scale)
    penalty = -2 * config.doubly_stochastic / 8 * (1 - alphas.sum(0, keepdim=True))  # (1, N, P)
    assert close(with_penalty, authors + penalty)
    assert not close(with_penalty, authors, 1e-2)
