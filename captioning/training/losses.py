"""Training objectives: masked cross-entropy, the doubly stochastic penalty, hard-attention REINFORCE.

Every term is a sum over the batch's captions divided by one number, the batch's real target
tokens (words and ``<end>``). Per caption the terms are those of the paper: equation 14 for soft
attention,

    L_d = -log P(y | a) + lambda * sum_i (1 - sum_t alpha_ti)^2,

and equation 12 for hard attention (the estimator of the gradient of the variational bound L_s).
Dividing the sum over captions by the token count instead of the caption count only rescales
the gradient (by captions / tokens, the same for every term), so ``lambda`` keeps the meaning it
has in equation 14 while the cross-entropy reads as the usual per-word value. Other conventions
(see the configuration reference): the popular PyTorch tutorial's ``alpha_c`` weighs a mean over
the P positions, ``lambda = alpha_c * L / P`` with L the mean target tokens per caption (about
12 on COCO, so its ``alpha_c = 1`` on a 14x14 grid is lambda = 0.06 here); the authors' Theano
code (``capgen.py``) sums the penalty over the N captions of a batch, averages it over the P
positions and adds it to the per-caption mean log-likelihood, so its ``alpha_c`` is
``lambda = alpha_c * N / P`` here (0.33 for their COCO script's batch of 64 on 196 positions).
Their hard-attention weights convert the same way (:func:`hard_attention_loss`, docs/training.md):
``lambda_r = N / (10 T)`` and ``lambda_e = N * alpha_entropy_c``.

The penalty reads ``DecoderOutput.alphas`` whatever the decoder: for the Transformer that is the
mean over heads of the last layer's cross-attention, the map its figures show (its shipped
configurations set lambda = 0, as published Transformer captioners use no such penalty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from captioning.config import DecoderConfig, LSTMDecoderConfig, TrainConfig
from captioning.data.vocab import Vocabulary
from captioning.models.base import CaptionDecoder
from captioning.models.decoder import DecoderOutput, HardAttentionDecoder
from captioning.registry import Registry
from captioning.utils import distributed

# Never a target and never emitted (decoding masks them): label smoothing leaves them out.
UNPRODUCIBLE = (Vocabulary.pad_id, Vocabulary.start_id)


@dataclass
class LossTerms:
    """The total to minimise and its parts, each on the per-token scale of the total.

    ``total = cross_entropy + lambda * attention_penalty (+ hard_attention)``.
    """

    total: Tensor
    cross_entropy: Tensor
    attention_penalty: Tensor
    hard_attention: Tensor | None = None


def doubly_stochastic_penalty(alphas: Tensor, mask: Tensor) -> Tensor:
    """sum_i (1 - sum_t alpha_ti)^2 of every caption, over real steps only, summed over the captions.

    Args:
        alphas: (N, T, P) attention weights.
        mask: (N, T) True on real (non-padding) steps.
    Returns:
        A scalar: the sum over the N captions of equation 14's penalty.
    """
    attention_sum = (alphas * mask.unsqueeze(-1)).sum(dim=1)  # (N, P)
    return ((1.0 - attention_sum) ** 2).sum()


def token_negative_log_likelihood(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """-log p(target) per token, with label smoothing over the tokens the decoder can produce.

    Smoothing gives ``label_smoothing`` of the target mass to every token but ``<pad>`` and
    ``<start>`` in equal parts: decoding never emits those two, so mass put on them would be lost.

    Args:
        logits: (M, V) scores of M tokens.
        targets: (M,) target ids.
    Returns:
        (M,) losses.
    """
    logits = logits.float()
    if not label_smoothing:
        return F.cross_entropy(logits, targets, reduction="none")
    log_probs = torch.log_softmax(logits, dim=-1)  # (M, V)
    nll = -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)  # (M,)
    producible = log_probs.sum(dim=1) - log_probs[:, list(UNPRODUCIBLE)].sum(dim=1)  # (M,)
    uniform = -producible / (logits.size(1) - len(UNPRODUCIBLE))
    return (1.0 - label_smoothing) * nll + label_smoothing * uniform


def caption_loss(
    output: DecoderOutput,
    captions: Tensor,
    penalty_weight: float,
    label_smoothing: float = 0.0,
    num_tokens: float | None = None,
) -> LossTerms:
    """Equation 14 summed over the captions, divided by the number of target tokens.

    Args:
        output: the teacher-forced decoder output for N captions, T steps.
        captions: (N, L) the same captions; step t's target is token t+1.
        penalty_weight: lambda of equation 14.
        label_smoothing: see :func:`token_negative_log_likelihood`.
        num_tokens: the denominator; by default this batch's real tokens. Data-parallel training
            passes the global count divided by the number of processes, so that averaged
            gradients equal one process's.
    Returns:
        ``LossTerms``: cross-entropy per token, the penalty on the same scale (its sum over
        captions divided by ``num_tokens``) and their weighted sum.
    """
    steps = output.logits.size(1)
    targets = captions[:, 1 : steps + 1]  # (N, T)
    logits = output.logits[output.mask]  # (M, V), real steps only
    denominator = num_tokens if num_tokens is not None else logits.size(0)
    cross_entropy = (
        token_negative_log_likelihood(logits, targets[output.mask], label_smoothing).sum() / denominator
    )
    penalty = doubly_stochastic_penalty(output.alphas, output.mask) / denominator
    return LossTerms(cross_entropy + penalty_weight * penalty, cross_entropy, penalty)


def hard_attention_loss(
    decoder: HardAttentionDecoder,
    output: DecoderOutput,
    captions: Tensor,
    penalty_weight: float,
    entropy_weight: float,
    reinforce_weight: float = 1.0,
    label_smoothing: float = 0.0,
    num_tokens: float | None = None,
    penalty_gradient: bool = True,
) -> LossTerms:
    """The estimator of equation 12 (section 4.1), as a loss whose gradient it is.

    Per caption n with sampled locations s^n:

        -log p(y | s^n, a) - lambda_r (R_n - b) log p(s^n | a) - lambda_e H[s^n] + lambda * penalty_n

    where the reward R_n = log p(y | s^n, a) is the caption's log-likelihood (summed over its words,
    as in the paper; no gradient flows through it), b the moving average of the rewards (the buffer
    ``decoder.reward_baseline``, updated here with the mean reward of the global batch: under
    several processes the mean over all of them, so every process keeps the same baseline),
    H the entropy of the location distributions and the penalty that of equation 14. Summed over
    captions and divided by ``num_tokens`` like :func:`caption_loss`.

    The doubly stochastic penalty acts on the distributions alpha_t from which the locations are
    drawn (the paper introduces it for soft attention): it asks every location to be expected
    to be visited about once over the caption, and it is differentiable there without REINFORCE.
    The authors' code (``capgen.py``) adds it to the cost under hard attention too, but passes
    ``known_grads`` for alpha: the gradient that reaches alpha is REINFORCE's and the entropy's
    alone, so in their hard-attention runs the penalty is a number in the cost without any
    gradient. ``penalty_gradient`` False does the same (the penalty is still reported); True, the
    default, differentiates it as the paper's equations read.

    The authors' weights (their ``capgen.py``: the cost a mean over the N captions of summed
    per-token costs, one caption length T per batch; the gradient on alpha ``(b - mean_t
    cost) / 10 * (-s / alpha) + alpha_entropy_c * (log alpha + 1)``, not divided by N) are, on
    this function's per-token scale, ``reinforce_weight = N / (10 T)`` and ``entropy_weight =
    N * alpha_entropy_c`` (docs/training.md; tests/training/test_penalty_conversion.py checks the
    gradients). Their baseline is a moving average of the per-token mean cost started at 0; this
    one of the summed log-likelihood, started at the first batch's mean.
    """
    location_log_probs, entropies = output.location_log_probs, output.entropies
    if location_log_probs is None or entropies is None:
        raise ValueError(
            "hard_attention_loss needs the sampled locations of a hard-attention decoder in training mode"
        )
    penalised = output if penalty_gradient else dataclasses.replace(output, alphas=output.alphas.detach())
    terms = caption_loss(penalised, captions, penalty_weight, label_smoothing, num_tokens)
    steps = output.logits.size(1)
    targets = captions[:, 1 : steps + 1]
    token_log_probs = -F.cross_entropy(
        output.logits.float().transpose(1, 2), targets, reduction="none"
    )  # (N, T)
    mask = output.mask.float()
    reward = (token_log_probs * mask).sum(1).detach()  # (N,)
    with torch.no_grad():
        # The mean over the global batch: one all-reduce of (sum, count).
        total = distributed.all_reduce_sum(
            torch.stack([reward.sum(), reward.new_tensor(float(reward.numel()))])
        )
        batch_mean = total[0] / total[1]
        if torch.isnan(decoder.reward_baseline):  # first step: start the average at the first reward
            decoder.reward_baseline.copy_(batch_mean)
        baseline = decoder.reward_baseline.clone()
        decoder.reward_baseline.mul_(decoder.baseline_decay).add_((1 - decoder.baseline_decay) * batch_mean)
    denominator = num_tokens if num_tokens is not None else mask.sum()
    location_log_prob = (location_log_probs * mask).sum(1)  # (N,)
    reinforce = -reinforce_weight * ((reward - baseline) * location_log_prob).sum() / denominator
    entropy = (entropies * mask).sum() / denominator
    extra = reinforce - entropy_weight * entropy
    return LossTerms(terms.total + extra, terms.cross_entropy, terms.attention_penalty, extra.detach())


# The objective of one teacher-forced batch: (decoder, its output for N captions, the captions (N, L),
# the decoder's configuration, the training section, the token count to divide by or None) -> LossTerms.
# A loss option of your own is a field of the training section (or of its subclass) read where it is
# used: no signature changes.
Objective = Callable[[CaptionDecoder, DecoderOutput, Tensor, Any, TrainConfig, "float | None"], LossTerms]

# A decoder class's ``objective`` names its entry here; a decoder of your own may register its own.
OBJECTIVES: Registry[Objective] = Registry("training objective")


@OBJECTIVES.register("cross_entropy")
def cross_entropy_objective(
    decoder: CaptionDecoder,
    output: DecoderOutput,
    captions: Tensor,
    config: DecoderConfig,
    train: TrainConfig,
    num_tokens: float | None,
) -> LossTerms:
    """Equation 14 (:func:`caption_loss`) with the decoder's ``doubly_stochastic`` lambda and the
    training section's ``label_smoothing``."""
    return caption_loss(output, captions, config.doubly_stochastic, train.label_smoothing, num_tokens)


@OBJECTIVES.register("hard_attention")
def hard_attention_objective(
    decoder: CaptionDecoder,
    output: DecoderOutput,
    captions: Tensor,
    config: LSTMDecoderConfig,
    train: TrainConfig,
    num_tokens: float | None,
) -> LossTerms:
    """Equation 12 (:func:`hard_attention_loss`) with the configuration's hard-attention weights; the
    penalty's gradient as ``hard_alpha_gradients`` says (``authors``: none)."""
    if not isinstance(decoder, HardAttentionDecoder):
        raise TypeError(
            f"the hard_attention objective trains a HardAttentionDecoder, not {type(decoder).__name__}"
        )
    return hard_attention_loss(
        decoder,
        output,
        captions,
        config.doubly_stochastic,
        config.hard_entropy,
        config.hard_reinforce,
        train.label_smoothing,
        num_tokens,
        penalty_gradient=config.hard_alpha_gradients == "paper",
    )


def objective_of(decoder: CaptionDecoder) -> Objective:
    """The objective the decoder's class names in ``objective``."""
    return OBJECTIVES[decoder.objective]
