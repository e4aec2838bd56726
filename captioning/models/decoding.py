"""Caption generation over a batch of images: greedy, sampling and batched beam search.

All functions drive ``CaptionDecoder.step`` (any decoder family). The per-image work is done once
per image (``decoder.prepare``) and read, without copies, by that image's samples or beams
(``Prepared.group``); every image's hypotheses advance together as one tensor batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
        score: the value the search ranked by (``log_prob`` after length normalisation).
    """

    tokens: list[int]
    log_prob: float
    attention: Tensor
    betas: Tensor | None
    finished: bool
    score: float

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


def rollout(
    decoder: CaptionDecoder,
    annotations: Tensor,
    choose: Callable[[Tensor], Tensor],
    max_length: int,
    min_length: int = 0,
    repeats: int = 1,
    forbid_unk: bool = False,
) -> Rollout:
    """Generate one caption per row, choosing each word with ``choose(log_probs) -> ids``.

    Args:
        annotations: (B, P, C) image grids.
        choose: maps (N, V) log-probabilities to (N,) token ids (argmax, a sample, ...).
        max_length: words at most; a row still running then is returned unfinished.
        min_length: ``<end>`` is not chosen before this many words.
        repeats: rows per image (samples for SCST); rows are image-major (image 0's first).
        forbid_unk: ``<unk>`` is never chosen.
    """
    batch = annotations.size(0)
    rows = torch.arange(batch, device=annotations.device).repeat_interleave(repeats)
    prepared = decoder.prepare(annotations)._replace(group=repeats)  # once per image, read by its rows
    state = decoder.init_state(annotations).select(rows)
    n = rows.numel()
    tokens = torch.full((n,), START, dtype=torch.long, device=annotations.device)
    running = torch.ones(n, dtype=torch.bool, device=annotations.device)
    ended = torch.zeros_like(running)
    out_tokens, out_log_probs, out_mask, out_alphas, out_betas, out_locations = [], [], [], [], [], []
    for t in range(max_length + 1):
        log_probs, state, alpha, beta, location_log_prob = decoder.step(prepared, tokens, state)  # (N, V)
        chosen = choose(_allowed(log_probs, t, min_length, forbid_unk))
        # After max_length words only <end> may follow: other choices leave the row unfinished.
        emit = running & (chosen == END) if t == max_length else running
        tokens = chosen.masked_fill(~emit, PAD)
        out_tokens.append(tokens)
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
    tokens_t = torch.stack(out_tokens, 1)  # (N, T)
    mask = torch.stack(out_mask, 1)
    words = mask & (tokens_t != END)
    return Rollout(
        tokens_t,
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
def greedy_search(
    decoder: CaptionDecoder,
    annotations: Tensor,
    max_length: int = 20,
    min_length: int = 0,
    forbid_unk: bool = False,
) -> list[Caption]:
    """The most likely word at every step, for each of the B images in (B, P, C)."""
    result = rollout(
        decoder, annotations, lambda lp: lp.argmax(dim=1), max_length, min_length, forbid_unk=forbid_unk
    )
    return _captions_from_rollout(result)


def sampler(temperature: float = 1.0, top_k: int = 0) -> Callable[[Tensor], Tensor]:
    """A ``choose`` function drawing from softmax(log_probs / temperature), optionally the top k only."""

    def choose(log_probs: Tensor) -> Tensor:
        logits = log_probs.detach().float() / temperature
        if top_k:
            kth = logits.topk(min(top_k, logits.size(1)), dim=1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(torch.softmax(logits, dim=1), 1).squeeze(1)

    return choose


@torch.inference_mode()
def sample_captions(
    decoder: CaptionDecoder,
    annotations: Tensor,
    max_length: int = 20,
    min_length: int = 0,
    temperature: float = 1.0,
    top_k: int = 0,
    forbid_unk: bool = False,
) -> list[Caption]:
    """One sampled caption per image (temperature, top-k)."""
    result = rollout(
        decoder, annotations, sampler(temperature, top_k), max_length, min_length, forbid_unk=forbid_unk
    )
    return _captions_from_rollout(result)


def _length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT: ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


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
    blocked = log_probs.clone()
    blocked[row, trigrams[row, position, 2]] = float("-inf")
    # A hypothesis with every word blocked keeps its scores: the search must always go on.
    return torch.where(torch.isinf(blocked).all(dim=1, keepdim=True), log_probs, blocked)


@torch.inference_mode()
def beam_search(
    decoder: CaptionDecoder,
    annotations: Tensor,
    beam_size: int = 3,
    max_length: int = 20,
    min_length: int = 0,
    length_alpha: float = 0.0,
    block_trigrams: bool = False,
    forbid_unk: bool = False,
) -> list[Caption]:
    """Batched beam search: the beams of all B images advance as one (B*K) batch.

    An image is finished once ``beam_size`` hypotheses have produced ``<end>`` (the usual early stop:
    a live beam that might still have ended higher is not followed); its rows are then dropped from
    the batch. The live beams are the ``beam_size`` best by log-probability; the finished ones are
    ranked by log-probability divided by the GNMT length penalty (``length_alpha`` = 0 ranks by
    log-probability). An image none of whose hypotheses reached ``<end>`` within ``max_length``
    words gets its best unfinished hypothesis.

    Args:
        annotations: (B, P, C) image grids.
    Returns:
        The best caption of each image, in order.
    """
    device = annotations.device
    batch, k = annotations.size(0), beam_size
    images = torch.arange(batch, device=device)  # which image each active block of K rows belongs to
    prepared = decoder.prepare(annotations)._replace(group=k)  # (B, ...): each image's K beams read it once
    state = decoder.init_state(annotations).select(images.repeat_interleave(k))
    tokens = torch.full((batch * k,), START, dtype=torch.long, device=device)
    # Only the first beam is live at the start, so the K beams do not duplicate each other.
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    history = torch.empty(batch * k, 0, dtype=torch.long, device=device)  # (B*K, t)
    alpha_history: Tensor | None = None  # (B*K, t, P), None before the first step
    beta_history: Tensor | None = None  # (B*K, t)
    finished: list[list[Caption]] = [[] for _ in range(batch)]

    def hypothesis(row: int, log_prob: float, done: bool) -> Caption:
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
            score=log_prob / float(_length_penalty(length + int(done), length_alpha)),
        )

    for t in range(max_length + 1):
        log_probs, state, alpha, beta, _ = decoder.step(prepared, tokens, state)  # (n*K, V)
        vocab_size = log_probs.size(1)
        log_probs = _allowed(log_probs, t, min_length, forbid_unk)
        if block_trigrams:
            log_probs = _block_repeated_trigrams(log_probs, history)
        n = images.numel()
        candidates = (scores.unsqueeze(2) + log_probs.view(n, k, vocab_size)).view(n, k * vocab_size)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab_size), dim=1)  # (n, 2K)
        top_beam, top_token = top_index // vocab_size, top_index % vocab_size
        is_end = (top_token == END) & torch.isfinite(top_scores)
        # Finished hypotheses: <end> among the K best candidates of an image.
        for block, position in is_end[:, :k].nonzero().tolist():
            image = int(images[block])
            row = block * k + int(top_beam[block, position])
            finished[image].append(hypothesis(row, float(top_scores[block, position]), True))
        if t == max_length:  # after max_length words only <end> may follow
            break
        # Live beams: the K best candidates that did not end.
        keep = (~is_end).float().argsort(dim=1, descending=True, stable=True)[:, :k]  # (n, K)
        scores = top_scores.gather(1, keep)
        source_rows = (top_beam.gather(1, keep) + torch.arange(n, device=device).unsqueeze(1) * k).view(-1)
        tokens = top_token.gather(1, keep).view(-1)
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
        # Drop images that have K finished hypotheses.
        done = torch.tensor([len(finished[i]) >= k for i in images.tolist()], device=device)
        if done.all():
            break
        if done.any():
            alive = (~done).nonzero().squeeze(1)
            alive_rows = (alive.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            images, scores = images.index_select(0, alive), scores.index_select(0, alive)
            tokens, history = tokens.index_select(0, alive_rows), history.index_select(0, alive_rows)
            alpha_history = alpha_history.index_select(0, alive_rows)
            if beta_history is not None:
                beta_history = beta_history.index_select(0, alive_rows)
            state, prepared = state.select(alive_rows), prepared.select(alive)

    best = []
    for image in range(batch):
        pool = finished[image]
        if not pool:  # no hypothesis reached <end>: the best unfinished one of max_length words
            block = (images == image).nonzero()
            if block.numel():
                b = int(block[0])
                pool = [
                    hypothesis(b * k + beam, float(scores[b, beam]), False)
                    for beam in range(k)
                    if torch.isfinite(scores[b, beam])
                ]
        best.append(max(pool, key=lambda c: c.score))
    return best


def decode(decoder: CaptionDecoder, annotations: Tensor, config: DecodeConfig) -> list[Caption]:
    """Caption B images (B, P, C) with the strategy and options of ``config``."""
    strategies: dict[str, Callable[[], list[Caption]]] = {
        "greedy": lambda: greedy_search(
            decoder, annotations, config.max_length, config.min_length, config.forbid_unk
        ),
        "beam": lambda: beam_search(
            decoder,
            annotations,
            config.beam_size,
            config.max_length,
            config.min_length,
            config.length_alpha,
            config.block_trigrams,
            config.forbid_unk,
        ),
        "sample": lambda: sample_captions(
            decoder,
            annotations,
            config.max_length,
            config.min_length,
            config.temperature,
            config.top_k,
            config.forbid_unk,
        ),
    }
    return strategies[config.strategy]()


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
    beams = config.beam_size if config.strategy == "beam" else 1
    if beams > vocab_size:
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
