"""Batched (diverse) beam search over NumPy arrays, for the graphs of an ONNX export: step for step
``captioning.models.beam_search.beam_search`` (its docstring says what the search does: groups that
choose in turn, Hamming diversity, the early stop, GNMT length normalisation), tested to give the
same words and log-probabilities (``tests/export/test_numpy_search.py``)."""

from __future__ import annotations

import numpy as np

from captioning.config import DecodeConfig
from captioning.export.runtime import OnnxNetworks
from captioning.export.search import END, START, Hypothesis, _ranked, _select, choice_scores


def _length_penalty(length: float, alpha: float) -> float:
    """GNMT: ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


class _Beams:
    """The live rows of a beam search: n image blocks of K rows each, and what each row said."""

    def __init__(self, networks: OnnxNetworks, annotations: np.ndarray, k: int, groups: int):
        batch, width = annotations.shape[0], k // groups
        self.k, self.positions = k, networks.positions
        self.images = np.arange(batch)  # which image each active block of K rows belongs to
        self.prepared = networks.prepare(annotations)  # (B, ...): each image's K beams read it once
        self.state = _select(networks.init_state(annotations), np.repeat(self.images, k))
        self.tokens = np.full(batch * k, START, dtype=np.int64)
        # Only the first beam of a group is live at the start, so its beams do not duplicate each other.
        self.scores = np.full((batch, groups, width), -np.inf, dtype=np.float32)
        self.scores[:, :, 0] = 0.0
        self.sums = np.zeros((batch, groups, width), dtype=np.float32)  # the model's log-probabilities
        self.history = np.empty((batch * k, 0), dtype=np.int64)  # (n*K, t)
        self.alphas: np.ndarray | None = None  # (n*K, t, P), None before the first step
        self.betas: np.ndarray | None = None  # (n*K, t)
        self.gated = False

    def hypothesis(self, row: int, score: float, log_prob: float, done: bool, alpha: float) -> Hypothesis:
        length = self.history.shape[1]
        attention = (
            np.zeros((0, self.positions), np.float32) if self.alphas is None else self.alphas[row, :length]
        )
        betas = None
        if self.gated:
            betas = np.zeros(0, np.float32) if self.betas is None else self.betas[row]
        return Hypothesis(
            self.history[row].tolist(),
            log_prob,
            attention.astype(np.float32),
            None if betas is None else betas.astype(np.float32),
            done,
            score / float(_length_penalty(length + int(done), alpha)),
        )

    def advance(
        self, rows: np.ndarray, tokens: np.ndarray, alpha: np.ndarray, beta: np.ndarray | None
    ) -> None:
        """Each row continues ``rows``' hypothesis with ``tokens``; the step's maps are kept."""
        self.tokens = tokens
        self.history = np.concatenate([self.history[rows], tokens[:, None]], axis=1)
        step_alpha = alpha[rows][:, None]
        self.alphas = (
            step_alpha if self.alphas is None else np.concatenate([self.alphas[rows], step_alpha], 1)
        )
        if beta is not None:
            step_beta = beta[rows][:, None]
            self.betas = step_beta if self.betas is None else np.concatenate([self.betas[rows], step_beta], 1)
        self.state = _select(self.state, rows)

    def keep(self, alive: np.ndarray) -> None:
        """Only the image blocks ``alive``."""
        rows = (alive[:, None] * self.k + np.arange(self.k)).reshape(-1)
        self.images, self.scores, self.sums = self.images[alive], self.scores[alive], self.sums[alive]
        self.tokens, self.history = self.tokens[rows], self.history[rows]
        self.alphas = None if self.alphas is None else self.alphas[rows]
        self.betas = None if self.betas is None else self.betas[rows]
        self.state, self.prepared = _select(self.state, rows), _select(self.prepared, alive)


def beam_search(networks: OnnxNetworks, annotations: np.ndarray, config: DecodeConfig) -> list[Hypothesis]:
    """The best caption of each of the B images in (B, P, C), holding the next ``num_return - 1``
    distinct ones as its ``alternatives`` (see ``captioning.models.beam_search.beam_search``)."""
    batch, groups = annotations.shape[0], config.beam_groups
    beams = _Beams(networks, annotations, config.beam_size, groups)
    finished: list[list[list[Hypothesis]]] = [[[] for _ in range(groups)] for _ in range(batch)]
    for t in range(config.max_length + 1):
        step = networks.step(beams.prepared, beams.tokens, beams.state)
        beams.state, beams.gated = step.state, step.beta is not None
        scores, sums, rows, tokens = _choose_words(beams, step.log_probs, t, config, finished)
        if t == config.max_length:  # after max_length words only <end> may follow
            break
        beams.scores, beams.sums = scores, sums
        beams.advance(rows, tokens, step.alpha, step.beta)
        # A finished group's beams stop (no more hypotheses, no diversity cost); finished images go.
        width = beams.scores.shape[2]
        group_done = np.array([[len(pool) >= width for pool in finished[i]] for i in beams.images.tolist()])
        beams.scores = np.where(group_done[:, :, None], np.float32(-np.inf), beams.scores)
        done = group_done.all(axis=1)
        if done.all():
            break
        if done.any():
            beams.keep((~done).nonzero()[0])
    return _best(beams, finished, config)


def _choose_words(
    beams: _Beams,
    log_probs: np.ndarray,
    t: int,
    config: DecodeConfig,
    finished: list[list[list[Hypothesis]]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One step of every group in turn, from the step's ``log_probs`` (n*K, V): the candidates that end
    join ``finished``. Returns the live beams' scores and log-probability sums (n, G, W), the row
    (n*K,) each continues and the word (n*K,) it continues with."""
    n, groups, width = beams.scores.shape
    vocab_size = log_probs.shape[1]
    choices = choice_scores(log_probs, beams.history, t, config).reshape(n, groups, width, vocab_size)
    model_log_probs = log_probs.reshape(n, groups, width, vocab_size)  # masked as the choices
    used = np.zeros((n, vocab_size), dtype=np.float32)  # live beams of earlier groups per word
    next_scores, next_sums, next_tokens, next_rows = [], [], [], []
    for g in range(groups):
        step_scores = choices[:, g]  # (n, W, V)
        if g:
            step_scores = step_scores - np.float32(config.diversity) * used[:, None]
        kept_scores, kept_sums, kept_tokens, kept_beams = _group_step(
            beams, g, step_scores, model_log_probs[:, g], finished, config.length_alpha
        )
        next_scores.append(kept_scores)
        next_sums.append(kept_sums)
        next_tokens.append(kept_tokens)
        next_rows.append(kept_beams + g * width)
        if g + 1 < groups:  # the next groups pay for the words these live beams chose
            np.add.at(used, (np.arange(n)[:, None], kept_tokens), np.isfinite(kept_scores))
    rows = (np.concatenate(next_rows, 1) + np.arange(n)[:, None] * beams.k).reshape(-1)
    return np.stack(next_scores, 1), np.stack(next_sums, 1), rows, np.concatenate(next_tokens, 1).reshape(-1)


def _group_step(
    beams: _Beams,
    g: int,
    step_scores: np.ndarray,
    model_log_probs: np.ndarray,
    finished: list[list[list[Hypothesis]]],
    length_alpha: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Group ``g``'s step from its beams' ``step_scores`` (n, W, V) and the model's ``model_log_probs``
    (n, W, V): its candidates that end join ``finished``; returns the live beams' scores, sums, words
    and source beams within the group, (n, W) each."""
    n, width, vocab_size = step_scores.shape
    candidates = (beams.scores[:, g][:, :, None] + step_scores).reshape(n, width * vocab_size)
    top_index = np.argsort(-candidates, axis=1, kind="stable")[:, : min(2 * width, width * vocab_size)]
    top_scores = np.take_along_axis(candidates, top_index, axis=1)  # (n, 2W)
    top_beam, top_token = top_index // vocab_size, top_index % vocab_size
    top_sums = np.take_along_axis(beams.sums[:, g], top_beam, axis=1) + np.take_along_axis(
        model_log_probs.reshape(n, -1), top_index, axis=1
    )
    is_end = (top_token == END) & np.isfinite(top_scores)
    for block, position in zip(*is_end[:, :width].nonzero(), strict=True):
        row = block * beams.k + g * width + int(top_beam[block, position])
        finished[int(beams.images[block])][g].append(
            beams.hypothesis(
                row, float(top_scores[block, position]), float(top_sums[block, position]), True, length_alpha
            )
        )
    keep = np.argsort(-(~is_end).astype(np.float32), axis=1, kind="stable")[:, :width]  # (n, W)
    return (
        np.take_along_axis(top_scores, keep, 1),
        np.take_along_axis(top_sums, keep, 1),
        np.take_along_axis(top_token, keep, 1),
        np.take_along_axis(top_beam, keep, 1),
    )


def _best(beams: _Beams, finished: list[list[list[Hypothesis]]], config: DecodeConfig) -> list[Hypothesis]:
    """Each image's ranked captions: its finished ones, then (when fewer than ``num_return``) its
    live beams of ``max_length`` words."""
    best = []
    n, k = beams.images.size, beams.k
    flat_scores, flat_sums = beams.scores.reshape(n, k), beams.sums.reshape(n, k)
    for image in range(len(finished)):
        pool = [caption for group in finished[image] for caption in group]
        block = (beams.images == image).nonzero()[0]
        if len(pool) < config.num_return and block.size:
            b = int(block[0])
            pool += [
                beams.hypothesis(
                    b * k + beam,
                    float(flat_scores[b, beam]),
                    float(flat_sums[b, beam]),
                    False,
                    config.length_alpha,
                )
                for beam in range(k)
                if np.isfinite(flat_scores[b, beam])
            ]
        best.append(_ranked(pool, config.num_return))
    return best
