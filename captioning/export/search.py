"""The caption search over NumPy arrays, for the graphs of an ONNX export: greedy, sampling and
batched (diverse) beam search, with every option of ``DecodeConfig``.

Each function is ``captioning.models.decoding``'s, step for step, over ``OnnxNetworks`` instead of a
PyTorch decoder, so that an export captions without torch; tests hold the two to the same words and
log-probabilities on every strategy and option (``tests/export/test_numpy_search.py``). Sampling
draws from a ``numpy.random.Generator`` (``caption(..., seed=)``) by the inverse of each row's
cumulative distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from captioning.config import DecodeConfig
from captioning.data.vocab import Vocabulary
from captioning.export.runtime import OnnxNetworks

START, END, PAD, UNK = Vocabulary.start_id, Vocabulary.end_id, Vocabulary.pad_id, Vocabulary.unk_id
SAMPLE_ROUNDS = 5  # as captioning.models.decoding: rounds of draws while looking for distinct captions
State = tuple[np.ndarray, ...]


@dataclass
class Hypothesis:
    """One generated caption: ``tokens`` without ``<start>`` and ``<end>``, the model's ``log_prob``,
    ``attention`` (T, P), ``betas`` (T,) or None, whether ``<end>`` came (``finished``), the search's
    ``score`` and, with ``num_return`` n > 1, the next n - 1 distinct ones as ``alternatives``."""

    tokens: list[int]
    log_prob: float
    attention: np.ndarray
    betas: np.ndarray | None
    finished: bool
    score: float
    alternatives: list[Hypothesis] = field(default_factory=list)


def _select(arrays: State, index: np.ndarray) -> State:
    return tuple(array[index] for array in arrays)


def choice_scores(log_probs: np.ndarray, history: np.ndarray, step: int, config: DecodeConfig) -> np.ndarray:
    """(N, V) scores to choose from: ``log_probs`` (the step's logits in greedy decoding and sampling,
    its log-probabilities in beam search, as ``captioning.models.choices.choice_scores``) with
    ``<pad>``, ``<start>`` (``<unk>`` with ``forbid_unk``; ``<end>`` before ``min_length``) at -inf in
    place, the repetition penalty (the transformers library's sign rule), then repeated trigrams
    blocked. ``history``: (N, t) the words so far."""
    log_probs[:, [PAD, START, UNK] if config.forbid_unk else [PAD, START]] = -np.inf
    if step < config.min_length:
        log_probs[:, END] = -np.inf
    scores = log_probs
    if config.repetition_penalty != 1.0 and history.shape[1]:
        said = np.take_along_axis(scores, history, axis=1)  # (N, t)
        said = np.where(said > 0, said / config.repetition_penalty, said * config.repetition_penalty)
        scores = scores.copy()
        np.put_along_axis(scores, history, said.astype(scores.dtype), axis=1)
    if config.block_trigrams and history.shape[1] >= 3:
        trigrams = np.lib.stride_tricks.sliding_window_view(history, 3, axis=1)  # (N, t-2, 3)
        repeats = (trigrams[:, :, :2] == history[:, None, -2:]).all(axis=2)  # (N, t-2)
        if repeats.any():
            row, position = repeats.nonzero()
            blocked = scores.copy()
            blocked[row, trigrams[row, position, 2]] = -np.inf
            # A hypothesis with every word blocked keeps its scores: the search must always go on.
            scores = np.where(np.isinf(blocked).all(axis=1, keepdims=True), scores, blocked)
    return scores


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def sampler(config: DecodeConfig, rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    """Draws from softmax(scores / ``temperature``), restricted to the ``top_k`` most likely words and
    then to the ``top_p`` nucleus (words by decreasing probability, ties in index order, until their
    mass reaches ``top_p``; the most likely word always kept)."""

    def choose(scores: np.ndarray) -> np.ndarray:
        logits = scores.astype(np.float32) / np.float32(config.temperature)
        if config.top_k:
            k = min(config.top_k, logits.shape[1])
            kth = np.sort(logits, axis=1)[:, ::-1][:, k - 1 : k]  # (N, 1) the k-th largest
            logits = np.where(logits < kth, -np.inf, logits).astype(np.float32)
        if config.top_p < 1.0:
            probs = _softmax(logits)
            order = np.argsort(-probs, axis=1, kind="stable")
            ranked = np.take_along_axis(probs, order, axis=1)
            before = np.cumsum(ranked, axis=1) - ranked  # the mass of the more likely words
            drop = np.zeros_like(before, dtype=bool)
            np.put_along_axis(drop, order, before >= config.top_p, axis=1)
            logits = np.where(drop, -np.inf, logits).astype(np.float32)
        cumulative = np.cumsum(_softmax(logits), axis=1)  # (N, V)
        draws = rng.random(len(logits)) * cumulative[:, -1]
        chosen = (cumulative <= draws[:, None]).sum(axis=1)
        return np.minimum(chosen, logits.shape[1] - 1)

    return choose


def rollout(
    networks: OnnxNetworks,
    annotations: np.ndarray,
    choose: Callable[[np.ndarray], np.ndarray],
    config: DecodeConfig,
    repeats: int = 1,
) -> list[Hypothesis]:
    """One caption per row (``repeats`` rows per image, image-major), each word ``choose(scores)``."""
    batch = annotations.shape[0]
    rows = np.repeat(np.arange(batch), repeats)
    prepared = networks.prepare(annotations)  # once per image; the step reads the rows per image
    state = _select(networks.init_state(annotations), rows)
    n = rows.size
    tokens = np.full(n, START, dtype=np.int64)
    running, ended = np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
    history = np.empty((n, 0), dtype=np.int64)
    log_probs_out, masks, alphas, betas = [], [], [], []
    for t in range(config.max_length + 1):
        step = networks.step(prepared, tokens, state)
        state, log_probs = step.state, step.log_probs
        # chosen from the logits, the repetition penalty applied to them (as the PyTorch search)
        chosen = choose(choice_scores(step.logits, history, t, config))
        emit = running & (chosen == END) if t == config.max_length else running
        tokens = np.where(emit, chosen, PAD)
        history = np.concatenate([history, tokens[:, None]], axis=1)
        log_probs_out.append(np.take_along_axis(log_probs, chosen[:, None], axis=1)[:, 0] * emit)
        masks.append(emit)
        alphas.append(step.alpha)
        if step.beta is not None:
            betas.append(step.beta)
        ended = ended | (emit & (tokens == END))
        running = running & ~ended
        if not running.any():
            break
    lengths = (np.stack(masks, 1) & (history != END)).sum(axis=1)
    sums, alpha = np.stack(log_probs_out, 1), np.stack(alphas, 1)
    beta = np.stack(betas, 1) if betas else None
    captions = []
    for i in range(n):
        length, log_prob = int(lengths[i]), float(sums[i].sum())
        captions.append(
            Hypothesis(
                history[i, :length].tolist(),
                log_prob,
                alpha[i, :length].astype(np.float32),
                None if beta is None else beta[i, :length].astype(np.float32),
                bool(ended[i]),
                log_prob,
            )
        )
    return captions


def _ranked(pool: list[Hypothesis], count: int) -> Hypothesis:
    """The best of ``pool`` (finished first, then by score; ties in pool order) holding the next
    distinct ones (``count`` in all) as its ``alternatives``."""
    ranked: list[Hypothesis] = []
    for caption in sorted(pool, key=lambda c: (c.finished, c.score), reverse=True):
        if all(caption.tokens != other.tokens for other in ranked):
            ranked.append(caption)
        if len(ranked) == count:
            break
    ranked[0].alternatives = ranked[1:]
    return ranked[0]


def greedy_search(networks: OnnxNetworks, annotations: np.ndarray, config: DecodeConfig) -> list[Hypothesis]:
    """The most likely word at every step, for each of the B images in (B, P, C)."""
    return rollout(networks, annotations, lambda scores: scores.argmax(axis=1), config)


def sample_captions(
    networks: OnnxNetworks, annotations: np.ndarray, config: DecodeConfig, rng: np.random.Generator
) -> list[Hypothesis]:
    """Sampled captions (temperature, top-k, top-p); with ``num_return`` n > 1, n draws per image, again
    up to ``SAMPLE_ROUNDS`` times while an image has fewer than n distinct ones, ranked."""
    n = config.num_return
    if n == 1:
        return rollout(networks, annotations, sampler(config, rng), config)
    pools: list[list[Hypothesis]] = [[] for _ in range(annotations.shape[0])]
    for _ in range(SAMPLE_ROUNDS):
        for i, caption in enumerate(rollout(networks, annotations, sampler(config, rng), config, n)):
            pools[i // n].append(caption)
        if all(len({tuple(c.tokens) for c in pool}) >= n for pool in pools):
            break
    return [_ranked(pool, n) for pool in pools]


__all__ = ["Hypothesis", "choice_scores", "greedy_search", "rollout", "sample_captions", "sampler"]
