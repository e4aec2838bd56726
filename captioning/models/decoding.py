"""Caption generation over a batch of images: greedy, sampling and batched (diverse) beam search.

All functions drive ``CaptionDecoder.step`` (any decoder family). The per-image work is done once
per image (``decoder.prepare``) and read, without copies, by that image's samples or beams
(``Prepared.group``); every image's hypotheses advance together as one tensor batch. Every
strategy takes the whole ``DecodeConfig``: an option is a field there, read where it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from captioning.config import ConfigError, DecodeConfig
from captioning.data.vocab import Vocabulary
from captioning.models.base import CaptionDecoder
from captioning.utils.memory import available_bytes, gib

START, END, PAD, UNK = Vocabulary.start_id, Vocabulary.end_id, Vocabulary.pad_id, Vocabulary.unk_id


@dataclass
class Caption:
    """One generated caption.

    Attributes:
        tokens: word ids, without ``<start>`` and ``<end>``.
        log_prob: sum of the log-probabilities of the words and of ``<end>`` when reached.
        attention: (len(tokens), P) the attention map of every emitted word.
        betas: (len(tokens),) the gate value of every word, or None without a gate.
        finished: whether ``<end>`` was produced within the maximum length.
        score: the value the search ranked by (``log_prob`` after length normalisation; with
            ``repetition_penalty`` or ``diversity``, the search's penalised sum after it).
        alternatives: with ``decode.num_return`` n > 1, the image's next n - 1 distinct captions,
            ranked (this one is the first); empty otherwise.
    """

    tokens: list[int]
    log_prob: float
    attention: Tensor
    betas: Tensor | None
    finished: bool
    score: float
    alternatives: list[Caption] = field(default_factory=list)

    def words(self, vocab: Vocabulary) -> list[str]:
        return [vocab.itos[t] for t in self.tokens]


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


def _allowed(log_probs: Tensor, step: int, min_length: int, forbid_unk: bool = False) -> Tensor:
    """``log_probs`` (N, V) with the tokens that may not come next at -inf.

    ``<pad>`` and ``<start>`` are never emitted (the model gives them little but nonzero mass;
    an untrained one a lot), ``<unk>`` not with ``forbid_unk``, and ``<end>`` not before
    ``min_length`` words. The others keep the model's log-probabilities (not renormalised), so a
    caption's log-probability is the model's. Masks in place (no (N, V) copy per step) unless
    autograd needs the original.
    """
    if log_probs.requires_grad:  # a self-critical rollout: autograd still needs the original
        log_probs = log_probs.clone()
    log_probs[:, [PAD, START, UNK] if forbid_unk else [PAD, START]] = float("-inf")
    if step < min_length:
        log_probs[:, END] = float("-inf")
    return log_probs


def penalize_repetitions(log_probs: Tensor, history: Tensor, penalty: float) -> Tensor:
    """The CTRL repetition penalty (Keskar et al. 2019): the score of every word already in a row's
    history is divided by ``penalty`` where positive and multiplied by it where negative.

    The decoders' scores are log-probabilities (never positive), so with ``penalty`` > 1 a word
    said before becomes ``penalty`` times less likely in log space, and < 1 favours it.

    Args:
        log_probs: (N, V) next-word scores.
        history: (N, t) words so far (``<pad>`` after a row's ``<end>``).
        penalty: 1 leaves the scores as they are.
    Returns:
        (N, V) a new tensor when anything changes.
    """
    if penalty == 1.0 or history.size(1) == 0:
        return log_probs
    said = log_probs.gather(1, history)  # (N, t), a word said twice is penalised once
    said = torch.where(said > 0, said / penalty, said * penalty)
    return log_probs.detach().clone().scatter_(1, history, said)


def _block_repeated_trigrams(log_probs: Tensor, history: Tensor) -> Tensor:
    """Forbid the words that would repeat a trigram already in each hypothesis.

    Args:
        log_probs: (N, V) next-word scores.
        history: (N, t) words so far.
    """
    if history.size(1) < 3:
        return log_probs
    trigrams = history.unfold(1, 3, 1)  # (N, t-2, 3)
    last_two = history[:, -2:].unsqueeze(1)  # (N, 1, 2)
    repeats = (trigrams[:, :, :2] == last_two).all(dim=2)  # (N, t-2)
    if not repeats.any():
        return log_probs
    row, position = repeats.nonzero(as_tuple=True)
    blocked = log_probs.detach().clone()
    blocked[row, trigrams[row, position, 2]] = float("-inf")
    # A hypothesis with every word blocked keeps its scores: the search must always go on.
    return torch.where(torch.isinf(blocked).all(dim=1, keepdim=True), log_probs, blocked)


def choice_scores(log_probs: Tensor, history: Tensor, step: int, config: DecodeConfig) -> Tensor:
    """The (N, V) scores every strategy chooses the next word from: the model's ``log_probs`` with
    the words ``config`` forbids at -inf (``_allowed``, ``block_trigrams``) and the repetition
    penalty applied. ``history``: (N, t) the words so far. A caption's ``log_prob`` stays the model's.
    """
    scores = _allowed(log_probs, step, config.min_length, config.forbid_unk)
    scores = penalize_repetitions(scores, history, config.repetition_penalty)
    if config.block_trigrams:
        scores = _block_repeated_trigrams(scores, history)
    return scores


def rollout(
    decoder: CaptionDecoder,
    annotations: Tensor,
    choose: Callable[[Tensor], Tensor],
    config: DecodeConfig,
    repeats: int = 1,
) -> Rollout:
    """Generate one caption per row, choosing each word with ``choose(scores) -> ids``.

    ``scores`` are ``choice_scores``: ``config``'s constraints (``max_length``, ``min_length``,
    ``forbid_unk``, ``block_trigrams``, ``repetition_penalty``) apply to every rollout, greedy,
    sampled or self-critical; the returned log-probabilities are the model's.

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
        log_probs, state, alpha, beta, location_log_prob = decoder.step(prepared, tokens, state)  # (N, V)
        chosen = choose(choice_scores(log_probs, history, t, config))
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


def _ranked(pool: list[Caption], count: int) -> Caption:
    """The best of ``pool`` (finished before unfinished, then by ``score``), holding the next
    distinct ones (``count`` in all) as its ``alternatives``."""
    ranked: list[Caption] = []
    # stable: ties keep pool order
    for caption in sorted(pool, key=lambda c: (c.finished, c.score), reverse=True):
        if all(caption.tokens != other.tokens for other in ranked):
            ranked.append(caption)
        if len(ranked) == count:
            break
    best = ranked[0]
    best.alternatives = ranked[1:]
    return best


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
    drop = torch.zeros_like(before, dtype=torch.bool).scatter_(1, order, before >= top_p)
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
    return [_ranked(pool, n) for pool in pools]


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
        log_probs, state, alpha, beta, _ = decoder.step(prepared, tokens, state)  # (n*K, V)
        vocab_size = log_probs.size(1)
        n = images.numel()
        choices = choice_scores(log_probs, history, t, config).view(n, groups, width, vocab_size)
        model_log_probs = log_probs.view(n, groups, width, vocab_size)
        used = torch.zeros(n, vocab_size, device=device)  # live beams of earlier groups per word
        next_scores, next_sums, next_tokens, next_rows = [], [], [], []
        for g in range(groups):
            step_scores = choices[:, g]  # (n, W, V)
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
        best.append(_ranked(pool, config.num_return))
    return best


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


def check_decoding_fits(
    config: DecodeConfig, vocab_size: int, positions: int, images: int, device: torch.device
) -> None:
    """Refuse, before any decoding, a beam wider than the vocabulary, or hypotheses whose search state
    does not fit in the device's free memory.

    A batch decodes ``min(decode.batch_size, images) x beam_size`` hypotheses at once; each keeps a
    few (V,) score rows and, for every word, its (P,) attention map.

    Raises:
        ConfigError: one line naming the keys (and the evaluate.py flags) to change.
    """
    beams = {"beam": config.beam_size, "sample": config.num_return}.get(config.strategy, 1)
    if config.strategy == "beam" and beams > vocab_size:
        raise ConfigError(
            f"decode.beam_size (--beam-size) must be at most the vocabulary's {vocab_size} words, got {beams}"
        )
    rows = min(config.batch_size, max(images, 1)) * beams
    needed = rows * 4 * (3 * vocab_size + (config.max_length + 1) * (positions + 2))  # float32 bytes
    free = available_bytes(device)
    if free is not None and needed > free:
        raise ConfigError(
            f"decode.beam_size {beams} x decode.batch_size {config.batch_size} hypotheses of up to "
            f"decode.max_length {config.max_length} words need about {gib(needed)}, more than the "
            f"{gib(free)} free on {device}; lower --beam-size or --max-length, or --set "
            "decode.batch_size="
        )
