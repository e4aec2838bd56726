"""What every search shares: the ``Caption`` it returns, its ranking of a pool of hypotheses, and
the scores it chooses each word from (the words a configuration forbids, the repetition penalty,
the trigram block)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from captioning.config import ConfigError, DecodeConfig
from captioning.data.vocab import Vocabulary
from captioning.models.base import StepOutput

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


def ranked(pool: list[Caption], count: int) -> Caption:
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


def penalize_repetitions(scores: Tensor, history: Tensor, penalty: float) -> Tensor:
    """The repetition penalty with the sign rule of the transformers library's
    ``RepetitionPenaltyLogitsProcessor``: the score of every word already in a row's history is
    divided by ``penalty`` where positive and multiplied by it where negative, so that with
    ``penalty`` > 1 a word said before always loses ground (and < 1 favours it). CTRL (Keskar et al.
    2019), which introduced the penalty, divides whatever the sign.

    Greedy decoding and sampling apply it to the logits, before the softmax, as both references do;
    beam search to the log-softmax scores, as the transformers library's beam search does (a
    log-probability is never positive, so there it is always multiplied).

    Args:
        scores: (N, V) next-word scores (logits, or log-probabilities in beam search).
        history: (N, t) words so far (``<pad>`` after a row's ``<end>``).
        penalty: 1 leaves the scores as they are.
    Returns:
        (N, V) a new tensor when anything changes.
    """
    if penalty == 1.0 or history.size(1) == 0:
        return scores
    said = scores.gather(1, history)  # (N, t), a word said twice is penalised once
    said = torch.where(said < 0, said * penalty, said / penalty)
    return scores.detach().clone().scatter_(1, history, said)


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


def choice_scores(scores: Tensor, history: Tensor, step: int, config: DecodeConfig) -> Tensor:
    """The (N, V) scores every strategy chooses the next word from: the step's ``scores`` (the logits
    in greedy decoding and sampling, the log-probabilities in beam search) with the words ``config``
    forbids at -inf (``_allowed``, ``block_trigrams``) and the repetition penalty applied.
    ``history``: (N, t) the words so far. A caption's ``log_prob`` stays the model's.
    """
    scores = _allowed(scores, step, config.min_length, config.forbid_unk)
    scores = penalize_repetitions(scores, history, config.repetition_penalty)
    if config.block_trigrams:
        scores = _block_repeated_trigrams(scores, history)
    return scores


def step_logits(output: StepOutput, config: DecodeConfig) -> Tensor:
    """The (N, V) scores greedy decoding and sampling choose from: the step's logits (its
    log-probabilities for a decoder that gives none, the same choice without the repetition penalty).

    Raises:
        ConfigError: ``decode.repetition_penalty`` with a decoder that gives no logits.
    """
    if output.logits is not None:
        return output.logits
    if config.repetition_penalty != 1.0:
        raise ConfigError(
            f"decode.repetition_penalty {config.repetition_penalty:g} acts on the logits, and this "
            "decoder's step gives log-probabilities only (StepOutput.logits is None): set it to 1"
        )
    return output.log_probs
