"""The training objectives against the paper's equations computed directly (Xu et al. 2015, eq. 12 and 14)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_decoder import C, P, V, make_batch  # the decoder tests' sizes and batch
from test_training import run_two_processes

from captioning.config import DecodeConfig, LSTMDecoderConfig, TrainConfig
from captioning.data.vocab import Vocabulary
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.training.engine import scst_loss
from captioning.training.losses import (
    caption_loss,
    doubly_stochastic_penalty,
    hard_attention_loss,
    token_negative_log_likelihood,
)

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("single_thread")


def make_decoder(
    attention: str = "soft", expected_prob: float = 0.5, dropout: float = 0.0
) -> ShowAttendTellDecoder:
    config = LSTMDecoderConfig(
        attention=attention,
        embed_dim=16,
        hidden_dim=24,
        attention_dim=16,
        dropout=dropout,
        hard_expected_prob=expected_prob,
    )
    return ShowAttendTellDecoder.from_config(config, V, C)


def per_caption_terms(output, captions, lengths):
    """Equation 14's two terms for each caption, computed one caption and one step at a time."""
    log_probs = torch.log_softmax(output.logits.float(), -1)
    nll, penalty = [], []
    for i, length in enumerate(lengths.tolist()):
        steps = length - 1
        nll.append(-sum(log_probs[i, t, captions[i, t + 1]] for t in range(steps)))
        penalty.append(((1 - output.alphas[i, :steps].sum(0)) ** 2).sum())
    return torch.stack(nll), torch.stack(penalty)


def grads(value, module):
    params = [p for p in module.parameters() if p.requires_grad]
    return [
        g if g is not None else torch.zeros_like(p)
        for g, p in zip(
            torch.autograd.grad(value, params, retain_graph=True, allow_unused=True), params, strict=True
        )
    ]


# ----------------------------------------------------------------------------- equation 14
def test_caption_loss_is_equation_14_summed_over_captions_per_token():
    torch.manual_seed(4)
    decoder = make_decoder().eval()
    annotations, captions, lengths, image_index = make_batch()
    output = decoder(annotations, captions, lengths, image_index)
    lam = 0.7
    terms = caption_loss(output, captions, penalty_weight=lam)
    nll, penalty = per_caption_terms(output, captions, lengths)
    tokens = float((lengths - 1).sum())
    torch.testing.assert_close(terms.total, (nll + lam * penalty).sum() / tokens)
    torch.testing.assert_close(terms.cross_entropy, nll.sum() / tokens)
    torch.testing.assert_close(terms.attention_penalty, penalty.sum() / tokens)
    # The two terms' gradients stand in equation 14's ratio: both are eq. 14's, scaled by one number.
    for ours, direct in (
        (terms.cross_entropy, nll.sum()),
        (lam * terms.attention_penalty, lam * penalty.sum()),
    ):
        for mine, reference in zip(grads(ours, decoder), grads(direct, decoder), strict=True):
            torch.testing.assert_close(mine * tokens, reference, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads(terms.attention_penalty, decoder))


def test_doubly_stochastic_penalty_known_values():
    steps = 4
    alphas = torch.full((2, steps, P), 1.0 / P)
    mask = torch.ones(2, steps, dtype=torch.bool)
    # every position gets steps / P in total: the penalty is P * (1 - steps / P) ** 2 per caption
    expected = P * (1 - steps / P) ** 2
    torch.testing.assert_close(doubly_stochastic_penalty(alphas, mask), torch.tensor(2 * expected))
    # the second caption has 2 real steps; its padding steps hold garbage that must be ignored
    mask[1, 2:] = False
    alphas[1, 2:] = 5.0
    torch.testing.assert_close(
        doubly_stochastic_penalty(alphas, mask), torch.tensor(expected + P * (1 - 2 / P) ** 2)
    )
    # attention spread so that every position sums to exactly 1: no penalty
    perfect = torch.eye(P).unsqueeze(0)  # (1, T = P, P)
    torch.testing.assert_close(
        doubly_stochastic_penalty(perfect, torch.ones(1, P, dtype=torch.bool)), torch.tensor(0.0)
    )


# ----------------------------------------------------------------------------- label smoothing
def test_label_smoothing_spreads_mass_over_producible_tokens_only():
    torch.manual_seed(5)
    logits = torch.randn(6, V, requires_grad=True)
    targets = torch.randint(2, V, (6,))
    eps = 0.2
    loss = token_negative_log_likelihood(logits, targets, eps)
    log_probs = torch.log_softmax(logits, -1)
    producible = [v for v in range(V) if v not in (Vocabulary.pad_id, Vocabulary.start_id)]
    expected = (1 - eps) * -log_probs.gather(1, targets[:, None]).squeeze(1) - eps * log_probs[
        :, producible
    ].mean(1)
    torch.testing.assert_close(loss, expected)
    # the target distribution puts nothing on <pad> and <start>: their logits are only pushed down
    loss.sum().backward()
    probs = torch.softmax(logits, -1).detach()
    for special in (Vocabulary.pad_id, Vocabulary.start_id):
        torch.testing.assert_close(logits.grad[:, special], probs[:, special])
    # no smoothing: plain cross-entropy
    torch.testing.assert_close(
        token_negative_log_likelihood(logits, targets), -log_probs.gather(1, targets[:, None]).squeeze(1)
    )


# ----------------------------------------------------------------------------- equation 12
@pytest.mark.parametrize("reinforce_weight, entropy_weight", [(1.0, 0.0), (0.3, 0.01), (0.0, 0.002)])
def test_hard_attention_loss_gradient_is_equation_12(reinforce_weight, entropy_weight):
    torch.manual_seed(9)
    decoder = make_decoder(attention="hard", expected_prob=0.3).train()
    annotations, captions, lengths, image_index = make_batch()
    output = decoder(annotations, captions, lengths, image_index)
    baseline = -12.5
    decoder.reward_baseline.fill_(baseline)
    lam = 0.4
    terms = hard_attention_loss(
        decoder,
        output,
        captions,
        penalty_weight=lam,
        entropy_weight=entropy_weight,
        reinforce_weight=reinforce_weight,
    )
    nll, penalty = per_caption_terms(output, captions, lengths)
    reward = -nll.detach()  # log p(y | s, a), summed over the caption's words as in the paper
    mask = output.mask.float()
    location = (output.location_log_probs * mask).sum(1)
    entropy = (output.entropies * mask).sum(1)
    per_caption = (
        nll - reinforce_weight * (reward - baseline) * location - entropy_weight * entropy + lam * penalty
    )
    tokens = float((lengths - 1).sum())
    direct = per_caption.sum() / tokens
    torch.testing.assert_close(terms.total, direct)
    for mine, reference in zip(grads(terms.total, decoder), grads(direct, decoder), strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-7)
    # the baseline moved towards the batch's mean reward
    decay = decoder.baseline_decay
    torch.testing.assert_close(
        decoder.reward_baseline, torch.tensor(decay * baseline + (1 - decay) * float(reward.mean()))
    )


def test_hard_attention_loss_refuses_an_output_without_sampled_locations():
    decoder = make_decoder(attention="hard").eval()  # inference: the expected context, no locations
    annotations, captions, lengths, image_index = make_batch()
    output = decoder(annotations, captions, lengths, image_index)
    assert output.location_log_probs is None
    with pytest.raises(ValueError, match="sampled locations"):
        hard_attention_loss(decoder, output, captions, penalty_weight=1.0, entropy_weight=0.0)
    assert torch.isnan(decoder.reward_baseline)  # refused before the baseline moved


BASELINE_WORKER = """
import sys
from pathlib import Path

import torch

from captioning.config import LSTMDecoderConfig
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.utils import distributed
from captioning.training.losses import hard_attention_loss

tests = Path(sys.argv[2]).parent  # the test modules import each other across folders
sys.path[:0] = [str(tests), *(str(folder) for folder in tests.iterdir() if folder.is_dir())]
from test_losses import C, make_batch

group = distributed.init_from_environment("cpu")
torch.manual_seed(0)
decoder = ShowAttendTellDecoder.from_config(LSTMDecoderConfig(attention="hard", embed_dim=16, hidden_dim=24,
                                            attention_dim=16, dropout=0.0, hard_expected_prob=1.0), 11, C)
decoder = distributed.wrap(decoder, group, torch.device("cpu")).train()
baselines = []
for step in range(2):
    annotations, captions, lengths, image_index = make_batch(step)
    mine = torch.arange(5)[group.rank::group.world_size]  # this process's captions of the global batch
    output = decoder(annotations, captions[mine], lengths[mine], image_index[mine])
    terms = hard_attention_loss(distributed.unwrap(decoder), output, captions[mine], 0.0, 0.0)
    terms.total.backward()  # as in training: DDP expects the backward pass of every forward pass
    baselines.append(float(distributed.unwrap(decoder).reward_baseline))
torch.save(torch.tensor(baselines, dtype=torch.float64), Path(sys.argv[1]) / f"baselines_rank{group.rank}.pt")
del decoder, output, terms
torch.distributed.barrier()
distributed.shutdown()
"""


@pytest.mark.slow
def test_hard_attention_baseline_is_the_mean_reward_of_the_global_batch(tmp_path):
    # Two processes, each with its share of the captions, keep the baseline that one process keeps
    # on the whole batch (expected contexts only, so the rewards are deterministic).
    script = tmp_path / "worker.py"
    script.write_text(BASELINE_WORKER)
    result = run_two_processes(script, tmp_path, Path(__file__).resolve().parent)
    assert result.returncode == 0, result.stderr[-3000:]
    torch.manual_seed(0)
    decoder = ShowAttendTellDecoder.from_config(
        LSTMDecoderConfig(
            attention="hard",
            embed_dim=16,
            hidden_dim=24,
            attention_dim=16,
            dropout=0.0,
            hard_expected_prob=1.0,
        ),
        V,
        C,
    ).train()
    expected = []
    for step in range(2):
        annotations, captions, lengths, image_index = make_batch(step)
        hard_attention_loss(decoder, decoder(annotations, captions, lengths, image_index), captions, 0.0, 0.0)
        expected.append(float(decoder.reward_baseline))
    for rank in (0, 1):
        got = torch.load(tmp_path / f"baselines_rank{rank}.pt", weights_only=True)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- self-critical
class _Model:  # the part of Captioner that scst_loss uses
    def __init__(self, decoder):
        self.decoder = decoder


def test_self_critical_rollouts_obey_the_decoding_constraints():
    torch.manual_seed(2)
    decoder = make_decoder(dropout=0.0).train()
    with torch.no_grad():  # a model that wants to stop at once, or else say <unk>
        decoder.out.bias[Vocabulary.end_id] = 30.0
        decoder.out.bias[Vocabulary.unk_id] = 20.0
    seen: list[list[int]] = []

    def rewarder(image_ids, token_ids, finished):
        seen.extend(token_ids)
        return np.array([float(len(row)) for row in token_ids])

    batch = {"features": torch.randn(3, P, C), "image_ids": torch.tensor([1, 2, 3])}
    train = TrainConfig(scst_samples=4, scst_baseline="greedy")
    scst_loss(
        _Model(decoder), batch, rewarder, train, DecodeConfig(min_length=3, max_length=6, forbid_unk=True)
    )
    assert len(seen) == 3 * 4 + 3  # the samples and the greedy baseline
    assert all(3 <= len(row) <= 6 for row in seen), seen
    assert all(Vocabulary.unk_id not in row for row in seen), seen
    seen.clear()
    scst_loss(
        _Model(decoder), batch, rewarder, train, DecodeConfig(min_length=0, max_length=6, forbid_unk=False)
    )
    assert all(len(row) == 0 for row in seen)  # unconstrained, the model stops at once


def test_self_critical_rollouts_sample_with_the_decoding_options():
    torch.manual_seed(4)
    decoder = make_decoder(dropout=0.0).train()
    seen: list[list[int]] = []

    def rewarder(image_ids, token_ids, finished):
        seen.extend(token_ids)
        return np.array([float(len(row)) for row in token_ids])

    batch = {"features": torch.randn(3, P, C), "image_ids": torch.tensor([1, 2, 3])}
    train = TrainConfig(scst_samples=4, scst_baseline="greedy")
    for options, same in (({"top_p": 1e-6}, True), ({"top_k": 1, "temperature": 5.0}, True), ({}, False)):
        seen.clear()
        torch.manual_seed(0)
        scst_loss(_Model(decoder), batch, rewarder, train, DecodeConfig(max_length=6, **options))
        samples, greedy = seen[:12], seen[12:]
        # a nucleus of one word (or the top 1) samples the greedy caption; the whole distribution does not
        assert (samples == [row for row in greedy for _ in range(4)]) == same, options


def test_self_critical_hard_attention_gives_the_locations_a_policy_gradient():
    torch.manual_seed(3)
    decoder = make_decoder(attention="hard", expected_prob=0.0).train()  # every context a sampled location
    batch = {"features": torch.randn(4, P, C), "image_ids": torch.tensor([1, 2, 3, 4])}
    train = TrainConfig(scst_samples=3, scst_baseline="mean")

    def rewarder(ids, rows, finished):
        return np.array([float(len(row) % 3) for row in rows])

    loss, _ = scst_loss(_Model(decoder), batch, rewarder, train, DecodeConfig(max_length=5))
    loss.backward()
    # The scorer's parameters shape alpha only; with sampled contexts only the locations'
    # log-probabilities reach them.
    attention_grads = [p.grad for p in decoder.attention.parameters() if p.grad is not None]
    assert attention_grads and sum(float(g.abs().sum()) for g in attention_grads) > 0


def test_a_new_loss_option_is_one_field_plus_its_use(monkeypatch):
    # A fork's new loss option: one field (here on a subclass of the training section, as a field
    # added to TrainConfig would be) and an objective that reads it. The engine's step passes the
    # section through untouched, so nothing else changes.
    import dataclasses

    from captioning.config import EncoderConfig, ModelConfig
    from captioning.models.captioner import Captioner
    from captioning.training.engine import TrainState, train_one_epoch
    from captioning.training.losses import OBJECTIVES, LossTerms, cross_entropy_objective

    @dataclasses.dataclass(frozen=True)
    class ScaledTrainConfig(TrainConfig):
        loss_scale: float = 1.0  # the new option

    seen: list[float] = []

    def scaled_objective(decoder, output, captions, config, train, num_tokens) -> LossTerms:
        seen.append(train.loss_scale)
        terms = cross_entropy_objective(decoder, output, captions, config, train, num_tokens)
        return LossTerms(train.loss_scale * terms.total, terms.cross_entropy, terms.attention_penalty)

    with OBJECTIVES.registered("scaled_for_test", scaled_objective):
        vocab = Vocabulary.build([["a", "red", "circle"]], min_count=1)
        decoder_config = LSTMDecoderConfig(embed_dim=8, hidden_dim=8, attention_dim=8, dropout=0.0)
        model_config = ModelConfig(
            encoder=EncoderConfig(weights="none", image_size=32), decoder=decoder_config
        )
        torch.manual_seed(0)
        model = Captioner.build(model_config, vocab)
        monkeypatch.setattr(model.decoder, "objective", "scaled_for_test")
        batch = {
            "images": torch.randn(2, 3, 32, 32),
            "lengths": torch.full((2, 1), 5),
            "captions": torch.tensor([[[1, 4, 5, 6, 2]], [[1, 6, 5, 4, 2]]]),
            "image_ids": torch.tensor([1, 2]),
            "indices": torch.arange(2),
        }
        losses = {}
        for scale in (1.0, 3.0):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
            train = ScaledTrainConfig(loss_scale=scale, grad_clip=0.0)
            state = TrainState()
            train_one_epoch(
                model, [batch], optimizer, train, state, torch.device("cpu"),
                decoder_config=decoder_config, progress=False,
            )  # fmt: skip
            losses[scale] = state.epoch_sums["loss"]
        assert seen == [1.0, 3.0]
        assert losses[3.0] == pytest.approx(3.0 * losses[1.0], rel=1e-5)
