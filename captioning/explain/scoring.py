"""The quantity every attribution explains: a score of a caption's word given its prefix.

A caption the model wrote is fed back to it (teacher forcing on its own words), so the score of word
t is, as chosen (``ExplainConfig.score``), ``log p(w_t | w_<t, grid)`` (``log_prob``, the default), the
word's logit before the softmax (``logit``) or its probability (``prob``): a differentiable function
of the annotation grid (B, P, C). The deletion and insertion curves always read the probability. Every
method of :mod:`captioning.explain.methods` and the curves of :mod:`captioning.explain.faithfulness`
read it through :class:`WordScorer`, which any callable of the same shape can stand in for (a test's
constructed model).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from captioning.data.vocab import Vocabulary
from captioning.models.base import CaptionDecoder


def caption_tensor(
    tokens: Sequence[Sequence[int]], start_id: int = Vocabulary.start_id, end_id: int = Vocabulary.end_id
) -> tuple[Tensor, Tensor]:
    """``<start> w1 .. wn <end>`` per caption, padded with 0: captions (N, L) and lengths (N,).

    Args:
        tokens: each caption's word ids, without ``<start>`` and ``<end>`` (``Caption.tokens``).
    """
    rows = [[start_id, *caption, end_id] for caption in tokens]
    longest = max(len(row) for row in rows)
    captions = torch.zeros(len(rows), longest, dtype=torch.long)
    for index, row in enumerate(rows):
        captions[index, : len(row)] = torch.tensor(row)
    return captions, torch.tensor([len(row) for row in rows])


class WordScorer:
    """``log p(w_t | w_<t, grid)`` of B captions under a decoder, as a function of the grids.

    Args:
        decoder: any ``CaptionDecoder`` (put in eval mode by the caller: dropout off, hard attention
            uses its expected context).
        captions: (B, L) ``<start> w1 .. wn <end>`` token ids padded with 0, caption b of image b.
        lengths: (B,) tokens per caption including ``<start>`` and ``<end>``.
        score: ``log_prob``, ``logit`` or ``prob``: what ``all_words`` and ``word`` return.

    The explained words are w1 .. wn (T = L - 2 at most); ``word_mask`` (B, T) marks the real ones.
    """

    def __init__(self, decoder: CaptionDecoder, captions: Tensor, lengths: Tensor, score: str = "log_prob"):
        self.decoder = decoder
        self.score = score
        self.captions = captions
        self.lengths = lengths
        self.words = int(lengths.max().item()) - 2  # T: the <end> token is not explained
        steps = torch.arange(self.words, device=lengths.device)
        self.word_mask = (lengths - 2).unsqueeze(1) > steps  # (B, T)

    @property
    def images(self) -> int:
        return self.captions.size(0)

    def all_words(self, annotations: Tensor) -> Tensor:
        """(M, P, C) grids, M a multiple of B (row m is image m % B) -> (M, T) word scores (``score``;
        0 after each caption's end)."""
        rows = torch.arange(annotations.size(0), device=annotations.device) % self.images
        captions, lengths = self.captions[rows], self.lengths[rows]
        output = self.decoder(annotations, captions, lengths)
        return self.scores_of(output.logits, captions) * self.word_mask[rows]

    def scores_of(self, logits: Tensor, captions: Tensor | None = None) -> Tensor:
        """(M, L', V) teacher-forced logits of ``captions`` (M, L) (default: the B captions) -> (M, T)
        the ``score`` of each caption's words (what a method with its own forward pass explains)."""
        captions = self.captions if captions is None else captions
        logits = logits[:, : self.words]  # (M, T, V)
        scores = logits.float() if self.score == "logit" else _log_softmax(logits)
        targets = captions[:, 1 : self.words + 1]  # (M, T) the word each step predicts
        chosen = scores.gather(2, targets.unsqueeze(2)).squeeze(2)  # (M, T)
        return chosen.exp() if self.score == "prob" else chosen

    def words_at(self, annotations: Tensor, rows: Tensor, words: Tensor) -> Tensor:
        """Word ``words[m]`` of caption ``rows[m]`` under grid m: (M, P, C), (M,), (M,) -> (M,)
        log-probabilities (whatever ``score``: the curves read the probability).

        Each row runs only as far as its word (the prefix and the word), so M scattered words cost
        no more than their prefixes.
        """
        captions = self.captions[rows]
        lengths = words + 2  # <start> .. w_t: t + 1 steps
        output = self.decoder(annotations, captions, lengths)
        log_probs = _log_softmax(output.logits)  # (M, T', V)
        targets = captions.gather(1, (words + 1).unsqueeze(1)).squeeze(1)  # (M,)
        step = log_probs[torch.arange(rows.numel(), device=rows.device), words]  # (M, V)
        return step.gather(1, targets.unsqueeze(1)).squeeze(1)

    def word(self, t: int):
        """The function (M, P, C) -> (M,) scoring word t of each caption (what captum attributes)."""

        def score(annotations: Tensor) -> Tensor:
            return self.all_words(annotations)[:, t]

        return score


def _log_softmax(logits: Tensor) -> Tensor:
    """Log-probabilities in float32 at least (float64 stays float64)."""
    return torch.log_softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
