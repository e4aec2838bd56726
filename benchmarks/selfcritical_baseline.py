"""The most used captioning framework's self-critical step (ruotianluo/self-critical.pytorch, its
``Att2in`` model), re-implemented here from its description for ``speed.py --parts scst``: the
algorithm as that framework runs it, at the sizes of ``scst_speed.ScstSizes``, so the two steps are
timed side by side (``selfcritical_scst_step_ms``, ``speedup_scst``).

What it does per step, as the framework does:

- the model: word embedding (+ ReLU, dropout), the grid embedded to the LSTM's width (+ ReLU,
  dropout) and projected for the additive attention, an ``Att2in`` core (the attended context enters
  only the cell input, through a max-out of two halves), an output layer over the vocabulary;
- the greedy baseline: the model in eval mode, no gradients, argmax at every step;
- the sampled captions: each image's embedded and projected grid is repeated once per sample (a
  copy, as its ``repeat_tensors`` makes), then ``samples`` captions per image drawn with
  ``torch.multinomial`` on the probabilities, step by step;
- the reward: every caption turned into a string of ids with the end token (``array_to_str``), then
  CIDEr-D in Python: each caption's and each reference's n-grams counted again at every step, TF-IDF
  vectors with the corpus's document frequencies, clipped similarity with the Gaussian length penalty,
  times 10; the sample's reward minus its image's greedy reward;
- the loss: ``-log p(word) * advantage`` over the words up to the first end, averaged over them;
  backward, gradients clipped by value (0.1, the framework's default), Adam.

Its vocabulary numbers words from 1 and uses 0 for both the end and the padding; here ``<end>`` is
made unreachable (bias -1e4 on index 0) as on our side, so every caption runs ``words`` words.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

END = 0  # the framework's end and padding id


def sample_words(
    step: Callable[[Tensor, Any], tuple[Tensor, Any]],
    state: Any,
    rows: int,
    length: int,
    start: int,
    end: int,
    greedy: bool,
    like: Tensor,
) -> tuple[Tensor, Tensor]:
    """The framework's sampling loop: ``step(words, state) -> (log-probabilities, state)`` run
    ``length`` times from ``start``, each row's word drawn with ``torch.multinomial`` (or the
    argmax), rows that ended padded with ``end``; (rows, length) ids and the log-probabilities taken."""
    word = torch.full((rows,), start, dtype=torch.long, device=like.device)
    seq = torch.full((rows, length), end, dtype=torch.long, device=like.device)
    log_probs_taken = like.new_zeros(rows, length)
    unfinished = torch.ones(rows, dtype=torch.bool, device=like.device)
    for t in range(length):
        log_probs, state = step(word, state)
        if greedy:
            word = log_probs.detach().argmax(1)
        else:
            word = torch.multinomial(log_probs.detach().exp(), 1).squeeze(1)
        taken = log_probs.gather(1, word.unsqueeze(1)).squeeze(1)
        if t > 0:
            unfinished = unfinished & (seq[:, t - 1] != end)
        word = torch.where(unfinished, word, torch.full_like(word, end))
        seq[:, t] = word
        log_probs_taken[:, t] = taken * unfinished
        if not bool(unfinished.any()):
            break
    return seq, log_probs_taken


class Att2inCore(nn.Module):
    """One step of the Att2in LSTM: attention from the previous hidden state, then the gates."""

    def __init__(self, embed: int, hidden: int, attention: int):
        super().__init__()
        self.hidden = hidden
        self.i2h = nn.Linear(embed, 5 * hidden)
        self.h2h = nn.Linear(hidden, 5 * hidden)
        self.a2c = nn.Linear(hidden, 2 * hidden)
        self.h2att = nn.Linear(hidden, attention)
        self.alpha_net = nn.Linear(attention, 1)
        self.dropout = nn.Dropout(0.5)

    def attend(self, h: Tensor, att: Tensor, p_att: Tensor) -> Tensor:
        scores = self.alpha_net(torch.tanh(p_att + self.h2att(h).unsqueeze(1))).squeeze(2)  # (N, P)
        weights = F.softmax(scores, dim=1)
        return torch.bmm(weights.unsqueeze(1), att).squeeze(1)  # (N, hidden)

    def forward(
        self, x: Tensor, att: Tensor, p_att: Tensor, state: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        h, c = state
        context = self.attend(h, att, p_att)
        sums = self.i2h(x) + self.h2h(h)
        gates = torch.sigmoid(sums[:, : 3 * self.hidden])
        in_gate, forget_gate, out_gate = gates.chunk(3, dim=1)
        transform = sums[:, 3 * self.hidden :] + self.a2c(context)
        transform = torch.max(transform[:, : self.hidden], transform[:, self.hidden :])
        c = forget_gate * c + in_gate * transform
        h = out_gate * torch.tanh(c)
        return self.dropout(h), (h, c)


class Att2inModel(nn.Module):
    """The framework's ``Att2inModel`` at the reference sizes (vocabulary ids 1..V-1, 0 = end)."""

    def __init__(
        self, vocab_size: int, channels: int, embed: int = 512, hidden: int = 512, attention: int = 512
    ):
        super().__init__()
        self.embed = nn.Sequential(nn.Embedding(vocab_size, embed), nn.ReLU(), nn.Dropout(0.5))
        self.att_embed = nn.Sequential(nn.Linear(channels, hidden), nn.ReLU(), nn.Dropout(0.5))
        self.ctx2att = nn.Linear(hidden, attention)
        self.core = Att2inCore(embed, hidden, attention)
        self.logit = nn.Linear(hidden, vocab_size)
        with torch.no_grad():
            self.logit.bias[END] = -1e4  # every caption runs the full length, as on our side

    def sample(self, grids: Tensor, length: int, samples: int, greedy: bool) -> tuple[Tensor, Tensor]:
        """(B*samples, length) word ids and their log-probabilities, sample-major within an image."""
        att = self.att_embed(grids)
        p_att = self.ctx2att(att)
        if samples > 1:  # one copy of the prepared grid per sample, as repeat_tensors makes
            att = att.repeat_interleave(samples, dim=0)
            p_att = p_att.repeat_interleave(samples, dim=0)
        rows = att.size(0)
        state = (att.new_zeros(rows, self.core.hidden), att.new_zeros(rows, self.core.hidden))

        def step(word: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
            output, state = self.core(self.embed(word), att, p_att, state)
            return F.log_softmax(self.logit(output), dim=1), state

        return sample_words(step, state, rows, length, END, END, greedy, att)  # <start> shares id 0


def array_to_str(row: Sequence[int], end: int = END) -> str:
    """The caption's ids as a string, up to and with the first end (the framework's reward input)."""
    out = []
    for token in row:
        out.append(str(int(token)))
        if token == end:
            break
    return " ".join(out)


def _ngrams(text: str, n: int = 4) -> Counter:
    words = text.split()
    return Counter(tuple(words[i : i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1))


class PythonCiderD:
    """CIDEr-D computed caption by caption in Python, with a reference corpus's document frequencies:
    the way the framework's reward scorer works (n-grams counted at every call)."""

    def __init__(self, corpus: dict[int, list[str]], sigma: float = 6.0):
        self.sigma = sigma
        self.df: defaultdict[tuple, float] = defaultdict(float)
        for references in corpus.values():
            for ngram in set(ngram for ref in references for ngram in _ngrams(ref)):
                self.df[ngram] += 1
        self.log_documents = math.log(float(len(corpus)))

    def _vector(self, counts: Counter) -> tuple[list[dict], list[float], int]:
        vectors: list[dict] = [{} for _ in range(4)]
        norms = [0.0] * 4
        length = 0
        for ngram, tf in counts.items():
            n = len(ngram) - 1
            weight = tf * (self.log_documents - math.log(max(1.0, self.df[ngram])))
            vectors[n][ngram] = weight
            norms[n] += weight * weight
            if n == 1:
                length += tf
        return vectors, [math.sqrt(x) for x in norms], length

    def _similarity(self, hyp: tuple, ref: tuple) -> np.ndarray:
        (vh, nh, lh), (vr, nr, lr) = hyp, ref
        delta = float(lh - lr)
        values = np.zeros(4)
        for n in range(4):
            for ngram, weight in vh[n].items():
                values[n] += min(weight, vr[n].get(ngram, 0.0)) * vr[n].get(ngram, 0.0)
            if nh[n] != 0 and nr[n] != 0:
                values[n] /= nh[n] * nr[n]
            values[n] *= math.e ** (-(delta**2) / (2 * self.sigma**2))
        return values

    def score(self, captions: list[str], references: list[list[str]]) -> np.ndarray:
        scores = []
        for caption, refs in zip(captions, references, strict=True):
            hyp = self._vector(_ngrams(caption))
            total = np.zeros(4)
            for ref in refs:
                total += self._similarity(hyp, self._vector(_ngrams(ref)))
            scores.append(float(np.mean(total) / len(refs) * 10.0))
        return np.array(scores)


class DecoderSampler:
    """The framework's sampling loop driving one of our decoders (``prepare``, ``init_state``,
    ``step``): the same function as our rollout, the framework's way of computing it (the prepared
    grid copied per sample, the greedy baseline a separate pass, one ``multinomial`` per step), so
    that ``speedup_scst_same_decoder`` compares the algorithms alone."""

    def __init__(self, decoder: nn.Module, start: int, end: int):
        self.decoder, self.start, self.end = decoder, start, end

    def parameters(self):
        return self.decoder.parameters()

    def train(self, mode: bool = True) -> None:
        self.decoder.train(mode)

    def eval(self) -> None:
        self.decoder.eval()

    def sample(self, grids: Tensor, length: int, samples: int, greedy: bool) -> tuple[Tensor, Tensor]:
        rows = torch.arange(grids.size(0), device=grids.device).repeat_interleave(samples)
        prepared = self.decoder.prepare(grids).select(rows)  # one copy of the projections per sample
        state = self.decoder.init_state(grids).select(rows)

        def step(word: Tensor, state: Any) -> tuple[Tensor, Any]:
            log_probs, state, *_ = self.decoder.step(prepared, word, state)
            return log_probs, state

        return sample_words(step, state, rows.numel(), length, self.start, self.end, greedy, grids)


def self_critical_step(
    model: Att2inModel | DecoderSampler,
    optimizer: torch.optim.Optimizer,
    scorer: PythonCiderD,
    grids: Tensor,
    references: list[list[str]],
    samples: int,
    length: int,
    end: int = END,
) -> float:
    """One self-critical step as the framework runs it; returns the loss. ``end``: the end token's
    id in ``model``'s vocabulary."""
    model.eval()
    with torch.no_grad():
        greedy, _ = model.sample(grids, length, 1, greedy=True)
    model.train()
    seq, log_probs = model.sample(grids, length, samples, greedy=False)
    images = grids.size(0)
    captions = [array_to_str(row, end) for row in seq.cpu().numpy()]
    baselines = [array_to_str(row, end) for row in greedy.cpu().numpy()]
    scores = scorer.score(
        captions + baselines, [references[i // samples] for i in range(len(captions))] + references
    )
    sampled, baseline = scores[: images * samples], scores[images * samples :]
    advantage = sampled - np.repeat(baseline, samples)
    reward = torch.as_tensor(advantage, dtype=log_probs.dtype, device=log_probs.device)
    before_end = (seq[:, :-1] != end).long().cumprod(dim=1)  # no end among the earlier words
    ended = torch.cat([torch.ones_like(seq[:, :1]), before_end], dim=1).to(log_probs.dtype)
    loss = -(log_probs * reward.unsqueeze(1) * ended).sum() / ended.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    optimizer.step()
    return float(loss.detach())
