"""Batched (diverse) beam search: every image's beams advance together as one tensor batch.

The beams of an image read the per-image work once (``Prepared.group``); the groups of diverse beam
search (Vijayakumar et al. 2018) choose their words in turn at every step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from captioning.config import DecodeConfig
from captioning.models import choices
from captioning.models.base import CaptionDecoder
from captioning.models.choices import END, START, Caption, ranked


def _length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT: ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


class _Beams:
    """The live rows of a beam search: n image blocks of K rows each (group-major within a block),
    the decoder's state and what each row said so far."""

    def __init__(self, decoder: CaptionDecoder, annotations: Tensor, k: int, groups: int):
        device = annotations.device
        batch, width = annotations.size(0), k // groups
        self.k = k
        self.images = torch.arange(batch, device=device)  # the image of each active block of K rows
        # (B, ...): each image's K beams read the per-image work once
        self.prepared = decoder.prepare(annotations)._replace(group=k)
        self.positions = self.prepared.positions
        self.state = decoder.init_state(annotations).select(self.images.repeat_interleave(k))
        self.tokens = torch.full((batch * k,), START, dtype=torch.long, device=device)
        # Only the first beam of a group is live at the start, so its beams do not duplicate each other.
        self.scores = torch.full((batch, groups, width), float("-inf"), device=device)
        self.scores[:, :, 0] = 0.0
        self.sums = torch.zeros(batch, groups, width, device=device)  # the model's log-probabilities
        self.history = torch.empty(batch * k, 0, dtype=torch.long, device=device)  # (n*K, t)
        self.alphas: Tensor | None = None  # (n*K, t, P), None before the first step
        self.betas: Tensor | None = None  # (n*K, t)
        self.gated = False  # whether the decoder reports a gate value per word

    def hypothesis(self, row: int, score: float, log_prob: float, done: bool, alpha: float) -> Caption:
        """Row ``row``'s caption so far, its search ``score`` divided by the GNMT length penalty."""
        length = self.history.size(1)
        attention = (
            torch.zeros(0, self.positions) if self.alphas is None else self.alphas[row, :length].float().cpu()
        )
        betas = None
        if self.gated:
            betas = torch.zeros(0) if self.betas is None else self.betas[row].float().cpu()
        return Caption(
            tokens=self.history[row].tolist(),
            log_prob=log_prob,
            attention=attention,
            betas=betas,
            finished=done,
            score=score / float(_length_penalty(length + int(done), alpha)),
        )

    def advance(self, rows: Tensor, tokens: Tensor, alpha: Tensor, beta: Tensor | None) -> None:
        """Each row continues ``rows``' hypothesis with ``tokens``; the step's maps are kept.

        Beams move only within their image's block of K rows: ``prepared`` (one copy per image) stays.
        """
        self.tokens = tokens
        self.history = torch.cat([self.history.index_select(0, rows), tokens.unsqueeze(1)], dim=1)
        step_alpha = alpha.index_select(0, rows).unsqueeze(1)
        self.alphas = (
            step_alpha
            if self.alphas is None
            else torch.cat([self.alphas.index_select(0, rows), step_alpha], 1)
        )
        if beta is not None:
            step_beta = beta.index_select(0, rows).unsqueeze(1)
            self.betas = (
                step_beta
                if self.betas is None
                else torch.cat([self.betas.index_select(0, rows), step_beta], 1)
            )
        self.state = self.state.select(rows)

    def keep(self, alive: Tensor) -> None:
        """Only the image blocks ``alive``."""
        rows = (alive.unsqueeze(1) * self.k + torch.arange(self.k, device=alive.device)).view(-1)
        self.images, self.scores, self.sums = (
            self.images.index_select(0, alive),
            self.scores[alive],
            self.sums[alive],
        )
        self.tokens, self.history = self.tokens.index_select(0, rows), self.history.index_select(0, rows)
        self.alphas = None if self.alphas is None else self.alphas.index_select(0, rows)
        self.betas = None if self.betas is None else self.betas.index_select(0, rows)
        self.state, self.prepared = self.state.select(rows), self.prepared.select(alive)


@torch.inference_mode()
def beam_search(decoder: CaptionDecoder, annotations: Tensor, config: DecodeConfig) -> list[Caption]:
    """Batched (diverse) beam search: the ``beam_size`` beams of all B images advance as one batch.

    The beams of an image form ``beam_groups`` groups of ``beam_size / beam_groups``; each group is
    a beam search of its own, and the groups choose their words in turn at every step: a word that
    the earlier groups' live beams continue with at this step costs ``diversity`` per such beam
    (the Hamming diversity of Vijayakumar et al. 2018). One group is the usual beam search.

    A group is finished once it has as many hypotheses that produced ``<end>`` as it has beams
    (the usual early stop: a live beam that might still have ended higher is not followed), an
    image once all its groups are; its rows are then dropped from the batch. The live beams of a
    group are its best candidates by the search's score (the sum of ``choice_scores``, diversity
    costs included); the finished ones are ranked by that score divided by the GNMT length penalty
    (``length_alpha`` = 0 ranks by the score). An image none of whose hypotheses reached ``<end>``
    within ``max_length`` words gets its best unfinished hypothesis. A caption's ``log_prob`` is
    the model's.

    Args:
        annotations: (B, P, C) image grids.
    Returns:
        The best caption of each image, in order, holding the next ``num_return - 1`` distinct
        ones, ranked, as its ``alternatives`` (finished ones first; fewer when fewer distinct
        hypotheses were kept: different groups may hold the same caption).
    """
    batch, groups = annotations.size(0), config.beam_groups
    beams = _Beams(decoder, annotations, config.beam_size, groups)
    finished: list[list[list[Caption]]] = [[[] for _ in range(groups)] for _ in range(batch)]
    for t in range(config.max_length + 1):
        log_probs, beams.state, alpha, beta = decoder.step(beams.prepared, beams.tokens, beams.state)[:4]
        beams.gated = beta is not None
        scores, sums, rows, tokens = _choose_words(beams, log_probs, t, config, finished)
        if t == config.max_length:  # after max_length words only <end> may follow
            break
        beams.scores, beams.sums = scores, sums
        beams.advance(rows, tokens, alpha, beta)
        # A finished group's beams stop (no more hypotheses, no diversity cost); finished images go.
        group_done = torch.tensor(
            [[len(pool) >= beams.scores.size(2) for pool in finished[i]] for i in beams.images.tolist()],
            device=annotations.device,
        )  # (n, G)
        beams.scores = beams.scores.masked_fill(group_done.unsqueeze(2), float("-inf"))
        done = group_done.all(dim=1)
        if done.all():
            break
        if done.any():
            beams.keep((~done).nonzero().squeeze(1))
    return _best(beams, finished, config)


def _choose_words(
    beams: _Beams, log_probs: Tensor, t: int, config: DecodeConfig, finished: list[list[list[Caption]]]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One step of every group in turn, from the step's ``log_probs`` (n*K, V): the candidates that end
    join ``finished``.

    Returns:
        the live beams' scores and the model's log-probability sums (n, G, W), the row (n*K,) each
        continues and the word (n*K,) it continues with.
    """
    n, groups, width = beams.scores.shape
    vocab_size = log_probs.size(1)
    choice = choices.choice_scores(log_probs, beams.history, t, config).view(n, groups, width, vocab_size)
    model_log_probs = log_probs.view(n, groups, width, vocab_size)
    used = torch.zeros(n, vocab_size, device=log_probs.device)  # live beams of earlier groups per word
    next_scores, next_sums, next_tokens, next_rows = [], [], [], []
    for g in range(groups):
        step_scores = choice[:, g]  # (n, W, V)
        if g:
            step_scores = step_scores - config.diversity * used.unsqueeze(1)
        kept_scores, kept_sums, kept_tokens, kept_beams = _group_step(
            beams, g, step_scores, model_log_probs[:, g], finished, config.length_alpha
        )
        next_scores.append(kept_scores)
        next_sums.append(kept_sums)
        next_tokens.append(kept_tokens)
        next_rows.append(kept_beams + g * width)
        if g + 1 < groups:  # the next groups pay for the words these live beams chose
            used.scatter_add_(1, kept_tokens, torch.isfinite(kept_scores).float())
    offsets = torch.arange(n, device=log_probs.device).unsqueeze(1) * beams.k
    return (
        torch.stack(next_scores, 1),
        torch.stack(next_sums, 1),
        (torch.cat(next_rows, 1) + offsets).view(-1),
        torch.cat(next_tokens, 1).view(-1),
    )


def _group_step(
    beams: _Beams,
    g: int,
    step_scores: Tensor,
    model_log_probs: Tensor,
    finished: list[list[list[Caption]]],
    length_alpha: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Group ``g``'s step from its beams' ``step_scores`` (n, W, V) (diversity costs included) and the
    model's ``model_log_probs`` (n, W, V): its candidates that end at this step join ``finished``.

    Returns:
        the live beams' scores, log-probability sums, words and source beams within the group, (n, W)
        each: the W best candidates that did not end.
    """
    n, width, vocab_size = step_scores.shape
    candidates = (beams.scores[:, g].unsqueeze(2) + step_scores).view(n, width * vocab_size)
    top_scores, top_index = candidates.topk(min(2 * width, width * vocab_size), dim=1)  # (n, 2W)
    top_beam, top_token = top_index // vocab_size, top_index % vocab_size
    top_sums = beams.sums[:, g].gather(1, top_beam) + model_log_probs.reshape(n, -1).gather(1, top_index)
    is_end = (top_token == END) & torch.isfinite(top_scores)
    # Finished hypotheses: <end> among the W best candidates of a group.
    for block, position in is_end[:, :width].nonzero().tolist():
        row = block * beams.k + g * width + int(top_beam[block, position])
        finished[int(beams.images[block])][g].append(
            beams.hypothesis(
                row, float(top_scores[block, position]), float(top_sums[block, position]), True, length_alpha
            )
        )
    keep = (~is_end).float().argsort(dim=1, descending=True, stable=True)[:, :width]  # (n, W)
    return (
        top_scores.gather(1, keep),
        top_sums.gather(1, keep),
        top_token.gather(1, keep),
        top_beam.gather(1, keep),
    )


def _best(beams: _Beams, finished: list[list[list[Caption]]], config: DecodeConfig) -> list[Caption]:
    """Each image's ranked captions: its finished ones, then (when fewer than ``num_return``) its
    live beams of ``max_length`` words."""
    best = []
    n, k = beams.images.numel(), beams.k
    flat_scores, flat_sums = beams.scores.view(n, k), beams.sums.view(n, k)
    for image in range(len(finished)):
        pool = [caption for group in finished[image] for caption in group]
        if len(pool) < config.num_return:  # then the unfinished ones of max_length words
            block = (beams.images == image).nonzero()
            if block.numel():
                b = int(block[0])
                pool += [  # ranked after every finished one
                    beams.hypothesis(
                        b * k + beam,
                        float(flat_scores[b, beam]),
                        float(flat_sums[b, beam]),
                        False,
                        config.length_alpha,
                    )
                    for beam in range(k)
                    if torch.isfinite(flat_scores[b, beam])
                ]
        best.append(ranked(pool, config.num_return))
    return best
