"""Caption generation over a batch of images: greedy, sampling and (in ``beam_search``) batched
(diverse) beam search, dispatched by ``decode``.

All functions drive ``CaptionDecoder.step`` (any decoder family). The per-image work is done once
per image (``decoder.prepare``) and read, without copies, by that image's samples or beams
(``Prepared.group``); every image's hypotheses advance together as one tensor batch. Every
strategy takes the whole ``DecodeConfig``: an option is a field there, read where it is used.
What the searches share (``Caption``, the scores they choose from) is in ``choices``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from captioning.config import DecodeConfig
from captioning.models import choices
from captioning.models.base import CaptionDecoder
from captioning.models.beam_search import beam_search
from captioning.models.choices import (
    END,
    PAD,
    START,
    UNK,
    Caption,
    choice_scores,
    penalize_repetitions,
    ranked,
    step_logits,
)
from captioning.models.memory_bounds import check_decoding_fits

__all__ = [
    "END",
    "PAD",
    "START",
    "UNK",
    "Caption",
    "Rollout",
    "beam_search",
    "check_decoding_fits",
    "choice_scores",
    "decode",
    "greedy_search",
    "nucleus",
    "penalize_repetitions",
    "rollout",
    "sample_captions",
    "sampler",
]


@dataclass
class Rollout:
    """Token-by-token generation for N rows (tensors keep gradients when enabled)."""

    tokens: Tensor  # (N, T) emitted ids, PAD after <end>
    log_probs: Tensor  # (N, T) log-probability of each emitted id, 0 after <end>
    mask: Tensor  # (N, T) True on emitted tokens, <end> included
    alphas: Tensor  # (N, T, P)
    betas: Tensor | None  # (N, T)
    lengths: Tensor  # (N,) words, <end> excluded
    finished: Tensor  # (N,) bool
    location_log_probs: Tensor | None = None  # (N, T) hard attention in training, 0 after <end>


def rollout(
    decoder: CaptionDecoder,
    annotations: Tensor,
    choose: Callable[[Tensor], Tensor],
    config: DecodeConfig,
    repeats: int = 1,
) -> Rollout:
    """Generate one caption per row, choosing each word with ``choose(scores) -> ids``.

    ``scores`` are ``choice_scores`` of the step's logits: ``config``'s constraints (``max_length``,
    ``min_length``, ``forbid_unk``, ``block_trigrams``, ``repetition_penalty``) apply to every
    rollout, greedy, sampled or self-critical; the returned log-probabilities are the model's.

    Args:
        annotations: (B, P, C) image grids.
        choose: maps (N, V) scores to (N,) token ids (argmax, a sample, ...).
        config: a row still running after ``config.max_length`` words is returned unfinished.
        repeats: rows per image (samples for SCST); rows are image-major (image 0's first).
    """
    batch = annotations.size(0)
    rows = torch.arange(batch, device=annotations.device).repeat_interleave(repeats)
    prepared = decoder.prepare(annotations)._replace(group=repeats)  # once per image, read by its rows
    state = decoder.init_state(annotations).select(rows)
    n = rows.numel()
    tokens = torch.full((n,), START, dtype=torch.long, device=annotations.device)
    running = torch.ones(n, dtype=torch.bool, device=annotations.device)
    ended = torch.zeros_like(running)
    history = torch.empty(n, 0, dtype=torch.long, device=annotations.device)  # (N, t) for the penalties
    out_log_probs, out_mask, out_alphas, out_betas, out_locations = [], [], [], [], []
    for t in range(config.max_length + 1):
        output = decoder.step(prepared, tokens, state)
        log_probs, state, alpha, beta, location_log_prob = output[:5]  # (N, V) ...
        # chosen from the logits, the repetition penalty applied to them (the log-probabilities'
        # softmax is the same distribution; the penalty's sign rule reads the logits' signs)
        chosen = choose(choices.choice_scores(step_logits(output, config), history, t, config))
        # After max_length words only <end> may follow: other choices leave the row unfinished.
        emit = running & (chosen == END) if t == config.max_length else running
        tokens = chosen.masked_fill(~emit, PAD)
        history = torch.cat([history, tokens.unsqueeze(1)], dim=1)
        out_log_probs.append(log_probs.gather(1, chosen.unsqueeze(1)).squeeze(1) * emit)
        out_mask.append(emit)
        out_alphas.append(alpha)
        if beta is not None:
            out_betas.append(beta)
        if location_log_prob is not None:  # the location drawn for this word's context
            out_locations.append(location_log_prob * emit)
        ended = ended | (emit & (tokens == END))
        running = running & ~ended
        if not running.any():
            break
    mask = torch.stack(out_mask, 1)  # (N, T)
    words = mask & (history != END)
    return Rollout(
        history,
        torch.stack(out_log_probs, 1),
        mask,
        torch.stack(out_alphas, 1),
        torch.stack(out_betas, 1) if out_betas else None,
        words.sum(1),
        ended,
        torch.stack(out_locations, 1) if out_locations else None,
    )


def _captions_from_rollout(result: Rollout) -> list[Caption]:
    captions = []
    for i in range(result.tokens.size(0)):
        length = int(result.lengths[i])
        log_prob = float(result.log_probs[i].sum())
        captions.append(
            Caption(
                tokens=result.tokens[i, :length].tolist(),
                log_prob=log_prob,
                attention=result.alphas[i, :length].float().cpu(),
                betas=None if result.betas is None else result.betas[i, :length].float().cpu(),
                finished=bool(result.finished[i]),
                score=log_prob,
            )
        )
    return captions


@torch.inference_mode()
def greedy_search(decoder: CaptionDecoder, annotations: Tensor, config: DecodeConfig) -> list[Caption]:
    """The most likely word at every step, for each of the B images in (B, P, C)."""
    result = rollout(decoder, annotations, lambda scores: scores.argmax(dim=1), config)
    return _captions_from_rollout(result)


def nucleus(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus (top-p) filtering (Holtzman et al. 2020): ``logits`` (N, V) with every word outside
    the smallest set whose probabilities (softmax of the row) sum to at least ``top_p`` at -inf.

    The words are taken by decreasing probability (ties in index order) until the sum reaches
    ``top_p``; the most likely word is always kept. ``top_p`` = 1 keeps every word.
    """
    if top_p >= 1.0:
        return logits
    probs, order = torch.softmax(logits, dim=1).sort(dim=1, descending=True, stable=True)  # (N, V)
    before = probs.cumsum(dim=1) - probs  # the mass of the more likely words
    outside = before >= top_p
    outside[:, 0] = False  # the most likely word, whatever top_p rounds to: the nucleus is never empty
    drop = torch.zeros_like(before, dtype=torch.bool).scatter_(1, order, outside)
    return logits.masked_fill(drop, float("-inf"))


def sampler(config: DecodeConfig | None = None) -> Callable[[Tensor], Tensor]:
    """A ``choose`` function drawing from softmax(scores / ``temperature``), restricted to the
    ``top_k`` most likely words and then to the ``top_p`` nucleus (each off by default)."""
    config = config or DecodeConfig()

    def choose(scores: Tensor) -> Tensor:
        logits = scores.detach().float() / config.temperature
        if config.top_k:
            kth = logits.topk(min(config.top_k, logits.size(1)), dim=1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        logits = nucleus(logits, config.top_p)
        return torch.multinomial(torch.softmax(logits, dim=1), 1).squeeze(1)

    return choose


# Rounds of ``num_return`` draws per image at most while looking for that many distinct captions.
SAMPLE_ROUNDS = 5


@torch.inference_mode()
def sample_captions(decoder: CaptionDecoder, annotations: Tensor, config: DecodeConfig) -> list[Caption]:
    """One sampled caption per image (temperature, top-k, top-p).

    With ``num_return`` n > 1, n captions are drawn per image (again, up to ``SAMPLE_ROUNDS`` times,
    while an image has fewer than n distinct ones); each image's distinct captions are ranked by
    log-probability, the first returned with the others as its ``alternatives`` (fewer than n when
    the model kept repeating itself).
    """
    n = config.num_return
    if n == 1:
        return _captions_from_rollout(rollout(decoder, annotations, sampler(config), config))
    batch = annotations.size(0)
    pools: list[list[Caption]] = [[] for _ in range(batch)]
    for _ in range(SAMPLE_ROUNDS):
        drawn = _captions_from_rollout(rollout(decoder, annotations, sampler(config), config, repeats=n))
        for i, caption in enumerate(drawn):
            pools[i // n].append(caption)
        if all(len({tuple(c.tokens) for c in pool}) >= n for pool in pools):
            break
    return [ranked(pool, n) for pool in pools]


STRATEGIES: dict[str, Callable[[CaptionDecoder, Tensor, DecodeConfig], list[Caption]]] = {
    "greedy": greedy_search,
    "beam": beam_search,
    "sample": sample_captions,
}
"""``decode.strategy`` -> the search; each takes the decoder, (B, P, C) grids and the whole
``DecodeConfig`` (a new option is a field of it, read where it is used)."""


def decode(decoder: CaptionDecoder, annotations: Tensor, config: DecodeConfig) -> list[Caption]:
    """Caption B images (B, P, C) with the strategy and options of ``config``."""
    return STRATEGIES[config.strategy](decoder, annotations, config)
