"""Training objectives: masked cross-entropy, the doubly stochastic penalty, hard-attention REINFORCE."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from captioning.models.decoder import DecoderOutput, HardAttentionDecoder


@dataclass
class LossTerms:
    """The total to minimise and its parts (detached scalars are fine for logging)."""

    total: Tensor
    cross_entropy: Tensor
    attention_penalty: Tensor
    hard_attention: Tensor | None = None


def doubly_stochastic_penalty(alphas: Tensor, mask: Tensor, num_captions: float | None = None) -> Tensor:
    """sum_i (1 - sum_t alpha_ti)^2 over real steps only, averaged over captions.

    Args:
        alphas: (N, T, P) attention weights.
        mask: (N, T) True on real (non-padding) steps.
        num_captions: the denominator of the average (default N).
    """
    attention_sum = (alphas * mask.unsqueeze(-1)).sum(dim=1)  # (N, P)
    return ((1.0 - attention_sum) ** 2).sum() / (num_captions if num_captions is not None else alphas.size(0))


def caption_loss(output: DecoderOutput, captions: Tensor, penalty_weight: float, label_smoothing: float = 0.0,
                 num_tokens: float | None = None, num_captions: float | None = None) -> LossTerms:
    """Token-averaged cross-entropy on real steps plus lambda times the doubly stochastic penalty.

    Args:
        output: the teacher-forced decoder output for N captions, T steps.
        captions: (N, L) the same captions; step t's target is token t+1.
        penalty_weight: lambda.
        label_smoothing: passed to ``F.cross_entropy``.
        num_tokens, num_captions: the denominators of the two averages; by default this batch's
            real tokens and captions. Data-parallel training passes the global counts divided by
            the number of processes, so that averaged gradients equal one process's.
    """
    steps = output.logits.size(1)
    targets = captions[:, 1:steps + 1]  # (N, T)
    logits = output.logits[output.mask]  # (M, V), real steps only
    token_loss = F.cross_entropy(logits.float(), targets[output.mask], label_smoothing=label_smoothing,
                                 reduction="sum")
    cross_entropy = token_loss / (num_tokens if num_tokens is not None else logits.size(0))
    penalty = doubly_stochastic_penalty(output.alphas, output.mask, num_captions)
    return LossTerms(cross_entropy + penalty_weight * penalty, cross_entropy, penalty)


def hard_attention_loss(decoder: HardAttentionDecoder, output: DecoderOutput, captions: Tensor,
                        penalty_weight: float, entropy_weight: float, label_smoothing: float = 0.0,
                        num_tokens: float | None = None, num_captions: float | None = None) -> LossTerms:
    """The variational lower bound of section 4.1, as a loss.

    L = -log p(y | s, a) - sum_t (r - b) log p(s_t | a) - lambda_e H(alpha) + penalty: the first
    term trains the whole decoder; the REINFORCE term trains the attention; the entropy bonus keeps
    the location distribution from collapsing early. The reward r is the caption's log-likelihood
    per word (the paper uses the sum; the mean keeps long and short captions on one scale) and the
    baseline b a moving average of it. The cross-entropy and entropy are averaged over words, the
    REINFORCE term over captions; ``num_tokens`` / ``num_captions`` as in :func:`caption_loss`.
    """
    terms = caption_loss(output, captions, penalty_weight, label_smoothing, num_tokens, num_captions)
    steps = output.logits.size(1)
    targets = captions[:, 1:steps + 1]
    token_log_probs = -F.cross_entropy(output.logits.float().transpose(1, 2), targets, reduction="none")
    mask = output.mask.float()
    reward = ((token_log_probs * mask).sum(1) / mask.sum(1).clamp_min(1)).detach()  # (N,)
    with torch.no_grad():
        if torch.isnan(decoder.reward_baseline):  # first step: start the average at the first reward
            decoder.reward_baseline.copy_(reward.mean())
        baseline = decoder.reward_baseline.clone()
        decoder.reward_baseline.mul_(decoder.baseline_decay).add_((1 - decoder.baseline_decay) * reward.mean())
    location_log_prob = (output.location_log_probs * mask).sum(1)  # (N,)
    reinforce = -((reward - baseline) * location_log_prob).sum() / (num_captions or reward.numel())
    entropy = (output.entropies * mask).sum() / (num_tokens or mask.sum())
    extra = reinforce - entropy_weight * entropy
    return LossTerms(terms.total + extra, terms.cross_entropy, terms.attention_penalty, extra.detach())
