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
    device = annotations.device
    batch, k, groups = annotations.size(0), config.beam_size, config.beam_groups
    width = k // groups  # beams per group; an image's K rows are group-major
    images = torch.arange(batch, device=device)  # which image each active block of K rows belongs to
    prepared = decoder.prepare(annotations)._replace(group=k)  # (B, ...): each image's K beams read it once
    state = decoder.init_state(annotations).select(images.repeat_interleave(k))
    tokens = torch.full((batch * k,), START, dtype=torch.long, device=device)
    # Only the first beam of a group is live at the start, so its beams do not duplicate each other.
    scores = torch.full((batch, groups, width), float("-inf"), device=device)
    scores[:, :, 0] = 0.0
    sums = torch.zeros(batch, groups, width, device=device)  # the model's log-probabilities
    history = torch.empty(batch * k, 0, dtype=torch.long, device=device)  # (B*K, t)
    alpha_history: Tensor | None = None  # (B*K, t, P), None before the first step
    beta_history: Tensor | None = None  # (B*K, t)
    finished: list[list[list[Caption]]] = [[[] for _ in range(groups)] for _ in range(batch)]

    def hypothesis(row: int, score: float, log_prob: float, done: bool) -> Caption:
        length = history.size(1)
        attention = (
            torch.zeros(0, prepared.positions)
            if alpha_history is None
            else alpha_history[row, :length].float().cpu()
        )
        betas = None
        if beta is not None:
            betas = torch.zeros(0) if beta_history is None else beta_history[row].float().cpu()
        return Caption(
            tokens=history[row].tolist(),
            log_prob=log_prob,
            attention=attention,
            betas=betas,
            finished=done,
            score=score / float(_length_penalty(length + int(done), config.length_alpha)),
        )

    for t in range(config.max_length + 1):
        log_probs, state, alpha, beta = decoder.step(prepared, tokens, state)[:4]  # (n*K, V) ...
        vocab_size = log_probs.size(1)
        n = images.numel()
        choice = choices.choice_scores(log_probs, history, t, config).view(n, groups, width, vocab_size)
        model_log_probs = log_probs.view(n, groups, width, vocab_size)
        used = torch.zeros(n, vocab_size, device=device)  # live beams of earlier groups per word
        next_scores, next_sums, next_tokens, next_rows = [], [], [], []
        for g in range(groups):
            step_scores = choice[:, g]  # (n, W, V)
            if g:
                step_scores = step_scores - config.diversity * used.unsqueeze(1)
            candidates = (scores[:, g].unsqueeze(2) + step_scores).view(n, width * vocab_size)
            top_scores, top_index = candidates.topk(min(2 * width, width * vocab_size), dim=1)  # (n, 2W)
            top_beam, top_token = top_index // vocab_size, top_index % vocab_size
            top_sums = sums[:, g].gather(1, top_beam) + model_log_probs[:, g].reshape(n, -1).gather(
                1, top_index
            )
            is_end = (top_token == END) & torch.isfinite(top_scores)
            # Finished hypotheses: <end> among the W best candidates of a group.
            for block, position in is_end[:, :width].nonzero().tolist():
                image = int(images[block])
                row = block * k + g * width + int(top_beam[block, position])
                finished[image][g].append(
                    hypothesis(
                        row, float(top_scores[block, position]), float(top_sums[block, position]), True
                    )
                )
            # Live beams: the W best candidates that did not end.
            keep = (~is_end).float().argsort(dim=1, descending=True, stable=True)[:, :width]  # (n, W)
            kept_scores, kept_tokens = top_scores.gather(1, keep), top_token.gather(1, keep)
            next_scores.append(kept_scores)
            next_sums.append(top_sums.gather(1, keep))
            next_tokens.append(kept_tokens)
            next_rows.append(top_beam.gather(1, keep) + g * width)
            if g + 1 < groups:  # the next groups pay for the words these live beams chose
                used.scatter_add_(1, kept_tokens, torch.isfinite(kept_scores).float())
        if t == config.max_length:  # after max_length words only <end> may follow
            break
        scores, sums = torch.stack(next_scores, 1), torch.stack(next_sums, 1)  # (n, G, W)
        source_rows = (torch.cat(next_rows, 1) + torch.arange(n, device=device).unsqueeze(1) * k).view(-1)
        tokens = torch.cat(next_tokens, 1).view(-1)
        history = torch.cat([history.index_select(0, source_rows), tokens.unsqueeze(1)], dim=1)
        step_alpha = alpha.index_select(0, source_rows).unsqueeze(1)
        alpha_history = (
            step_alpha
            if alpha_history is None
            else torch.cat([alpha_history.index_select(0, source_rows), step_alpha], dim=1)
        )
        if beta is not None:
            step_beta = beta.index_select(0, source_rows).unsqueeze(1)
            beta_history = (
                step_beta
                if beta_history is None
                else torch.cat([beta_history.index_select(0, source_rows), step_beta], dim=1)
            )
        # Beams move only within their image's block of K rows: ``prepared`` (one copy per image) stays.
        state = state.select(source_rows)
        # A finished group's beams stop (no more hypotheses, no diversity cost); finished images go.
        group_done = torch.tensor(
            [[len(pool) >= width for pool in finished[i]] for i in images.tolist()], device=device
        )  # (n, G)
        scores = scores.masked_fill(group_done.unsqueeze(2), float("-inf"))
        done = group_done.all(dim=1)
        if done.all():
            break
        if done.any():
            alive = (~done).nonzero().squeeze(1)
            alive_rows = (alive.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            images, scores, sums = images.index_select(0, alive), scores[alive], sums[alive]
            tokens, history = tokens.index_select(0, alive_rows), history.index_select(0, alive_rows)
            alpha_history = alpha_history.index_select(0, alive_rows)
            if beta_history is not None:
                beta_history = beta_history.index_select(0, alive_rows)
            state, prepared = state.select(alive_rows), prepared.select(alive)

    best = []
    flat_scores, flat_sums = scores.view(images.numel(), k), sums.view(images.numel(), k)
    for image in range(batch):
        pool = [caption for group in finished[image] for caption in group]
        if len(pool) < config.num_return:  # then the unfinished ones of max_length words
            block = (images == image).nonzero()
            if block.numel():
                b = int(block[0])
                unfinished = [
                    hypothesis(b * k + beam, float(flat_scores[b, beam]), float(flat_sums[b, beam]), False)
                    for beam in range(k)
                    if torch.isfinite(flat_scores[b, beam])
                ]
                pool += unfinished  # ranked after every finished one
        best.append(ranked(pool, config.num_return))
    return best
