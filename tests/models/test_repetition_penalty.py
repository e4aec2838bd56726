"""The repetition penalty, pinned to a transcription of the transformers library's
``RepetitionPenaltyLogitsProcessor`` (a plain loop) and to the worked example of its definition:
on the logits for greedy decoding and sampling, on the log-probabilities in beam search."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from search_decoders import START, V, annotations_for, bigram_decoder, make_decoder, replay
from search_options import settings

from captioning.config import ConfigError
from captioning.models import decoding
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.decoding import decode, greedy_search, sample_captions

pytestmark = pytest.mark.usefixtures("single_thread")


def processor_reference(
    scores: list[list[float]], history: list[list[int]], penalty: float
) -> list[list[float]]:
    """transformers' ``RepetitionPenaltyLogitsProcessor.__call__`` written as a loop: each word id in a
    row's ``input_ids`` (once, however often it occurs) has its score multiplied by the penalty
    where it is negative and divided by it otherwise."""
    out = [list(row) for row in scores]
    for row, words in enumerate(history):
        for word in set(words):
            value = scores[row][word]
            out[row][word] = value * penalty if value < 0 else value / penalty
    return out


@pytest.mark.parametrize("penalty", [0.5, 1.2, 2.0, 7.5])
def test_the_penalty_equals_the_transformers_processor_on_random_logits(penalty):
    generator = torch.Generator().manual_seed(31)
    logits = torch.randn(64, 30, generator=generator) * 4.0
    logits[5, 3] = 0.0  # zero: divided (stays 0)
    history = torch.randint(0, 30, (64, 9), generator=generator)  # words said, some more than once
    penalised = decoding.penalize_repetitions(logits, history, penalty)
    expected = processor_reference(logits.tolist(), history.tolist(), penalty)
    torch.testing.assert_close(penalised, torch.tensor(expected))
    assert decoding.penalize_repetitions(logits, history, 1.0) is logits


def table_decoder(table: torch.Tensor) -> ShowAttendTellDecoder:
    """A decoder whose logits after word ``previous`` are ``table[previous]`` exactly (one-hot
    embeddings straight to the output layer), with ``len(table)`` words."""
    size = table.size(0)
    decoder = make_decoder(seed=9, vocab_size=size, gate="none")
    with torch.no_grad():
        decoder.embedding.weight.zero_()
        decoder.embedding.weight[:, :size] = torch.eye(size)
        decoder.hidden_to_out.weight.zero_()
        decoder.hidden_to_out.bias.zero_()
        decoder.context_to_out.weight.zero_()
        decoder.out.weight.zero_()
        decoder.out.weight[:, :size] = table.T
        decoder.out.bias.zero_()
    return decoder


# The worked example: four words with logits [3, 2.5, 0.5, -1], the first already said once.
EXAMPLE = [3.0, 2.5, 0.5, -1.0]
FIRST = 4  # its id: the four words are ids 4..7 after <pad> <start> <end> <unk>


def example_decoder() -> ShowAttendTellDecoder:
    table = torch.full((8, 8), -30.0)
    table[START, FIRST] = 30.0  # the first word comes first
    table[FIRST, 4:] = torch.tensor(EXAMPLE)  # then the example's logits
    return table_decoder(table)


# <end> is forbidden before 2 words and <unk> never: the next word is one of the example's four.
EXAMPLE_OPTIONS = {"min_length": 2, "max_length": 2, "forbid_unk": True}


@pytest.mark.parametrize(("penalty", "published"), [(1.2, 0.462), (2.0, 0.240), (1.0, None)])
def test_sampling_draws_from_the_penalised_logits_softmax(penalty, published, monkeypatch):
    drawn_from = []
    multinomial = torch.multinomial

    def recording(probs, *args, **kwargs):
        drawn_from.append(probs.clone())
        return multinomial(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", recording)
    torch.manual_seed(0)
    config = settings(strategy="sample", repetition_penalty=penalty, **EXAMPLE_OPTIONS)
    (caption,) = sample_captions(example_decoder(), annotations_for(1), config)
    assert caption.tokens[0] == FIRST
    second = drawn_from[1][0]  # the distribution of the second word
    penalised = [EXAMPLE[0] / penalty, *EXAMPLE[1:]]  # the first word's logit is positive: divided
    total = sum(math.exp(x) for x in penalised)
    expected = [math.exp(x) / total for x in penalised]
    torch.testing.assert_close(second[4:], torch.tensor(expected), rtol=0, atol=1e-5)
    assert float(second[:4].sum()) == 0.0
    if published is not None:
        assert float(second[FIRST]) == pytest.approx(published, abs=5e-4)
        # the rule on log-probabilities (a negative score multiplied) gives another distribution
        log_probs = torch.log_softmax(torch.tensor(EXAMPLE), 0)
        log_probs[0] *= penalty
        assert float(torch.softmax(log_probs, 0)[0]) > float(second[FIRST]) + 0.05


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_applies_the_temperature_after_the_penalty(temperature, monkeypatch):
    drawn_from = []
    multinomial = torch.multinomial
    monkeypatch.setattr(
        torch, "multinomial", lambda p, *a, **k: drawn_from.append(p) or multinomial(p, *a, **k)
    )
    config = settings(strategy="sample", repetition_penalty=2.0, temperature=temperature, **EXAMPLE_OPTIONS)
    sample_captions(example_decoder(), annotations_for(1), config)
    scaled = [x / temperature for x in [EXAMPLE[0] / 2.0, *EXAMPLE[1:]]]
    total = sum(math.exp(x) for x in scaled)
    torch.testing.assert_close(
        drawn_from[1][0, 4:], torch.tensor([math.exp(x) / total for x in scaled]), rtol=0, atol=1e-5
    )


@pytest.mark.parametrize(("penalty", "second"), [(1.0, 4), (1.3, 5), (2.0, 5), (0.5, 4)])
def test_greedy_takes_the_best_penalised_logit(penalty, second):
    # 3 / 1.3 = 2.31 < 2.5: the second word wins on logits, where the log-probabilities' rule
    # (log p of the first word -0.54 x 1.3 = -0.70 > -1.04) would keep the first.
    config = settings(repetition_penalty=penalty, **EXAMPLE_OPTIONS)
    (caption,) = greedy_search(example_decoder(), annotations_for(1), config)
    penalised = processor_reference([[-30.0] * 4 + EXAMPLE], [[FIRST]], penalty)[0]
    assert second == max(range(4, 8), key=lambda w: penalised[w])  # the reference's own choice
    assert caption.tokens == [FIRST, second]


@torch.no_grad()
def greedy_with_penalty(decoder, annotations, penalty: float, max_length: int) -> tuple[list[int], float]:
    """Greedy decoding of one image with the processor's rule applied to the step's logits by hand."""
    prepared, state = decoder.prepare(annotations), decoder.init_state(annotations)
    previous, tokens, log_prob = START, [], 0.0
    for _ in range(max_length + 1):
        out = decoder.step(prepared, torch.tensor([previous]), state)
        scores = processor_reference(out.logits.tolist(), [tokens], penalty)[0]
        scores[0] = scores[START] = float("-inf")  # <pad> and <start> are never said
        word = max(range(len(scores)), key=lambda w: scores[w])
        if len(tokens) == max_length and word != 2:
            return tokens, log_prob
        log_prob += float(out.log_probs[0, word])
        if word == 2:  # <end>
            return tokens, log_prob
        tokens.append(word)
        state, previous = out.state, word
    return tokens, log_prob


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_repetition_penalty_applies_in_every_strategy(strategy):
    decoder = bigram_decoder(strength=2.5)  # repeats 4 5 4 5 ... unconstrained
    annotations = annotations_for(3)
    plain = settings(strategy=strategy, beam_size=3, max_length=10)
    torch.manual_seed(0)
    free = decode(decoder, annotations, plain)
    torch.manual_seed(0)
    penalised = decode(decoder, annotations, dataclasses.replace(plain, repetition_penalty=3.0))
    repeats = [len(c.tokens) - len(set(c.tokens)) for c in free]
    fewer = [len(c.tokens) - len(set(c.tokens)) for c in penalised]
    assert sum(fewer) < sum(repeats), (fewer, repeats)
    for i, caption in enumerate(penalised):  # the reported log-probability stays the model's
        log_prob, _, _ = replay(decoder, annotations[i : i + 1], caption.tokens, caption.finished)
        assert caption.log_prob == pytest.approx(log_prob, abs=1e-4)
    if strategy == "greedy":
        for i, caption in enumerate(penalised):
            tokens, log_prob = greedy_with_penalty(decoder, annotations[i : i + 1], 3.0, 10)
            assert caption.tokens == tokens
            assert caption.log_prob == pytest.approx(log_prob, abs=1e-4)


@torch.no_grad()
def test_beam_search_penalises_the_log_softmax_scores():
    # As the transformers library's beam search: the rule on log-probabilities (never positive, so
    # multiplied). Beam 1 is then greedy over the penalised log-probabilities, written here by hand.
    decoder = bigram_decoder(strength=2.5)
    annotations = annotations_for(3)
    captions = decode(decoder, annotations, settings(beam_size=1, max_length=8, repetition_penalty=1.5))
    for i, caption in enumerate(captions):
        prepared, state = decoder.prepare(annotations[i : i + 1]), decoder.init_state(annotations[i : i + 1])
        previous, tokens = START, []
        for _ in range(9):
            out = decoder.step(prepared, torch.tensor([previous]), state)
            scores = processor_reference(out.log_probs.tolist(), [tokens], 1.5)[0]
            scores[0] = scores[START] = float("-inf")
            word = max(range(V), key=lambda w: scores[w])
            if word == 2 or len(tokens) == 8:  # <end>, or 8 words and no <end>: unfinished
                break
            tokens.append(word)
            state, previous = out.state, word
        assert caption.tokens == tokens


class _LogProbsOnly(torch.nn.Module):
    """A decoder of one's own whose step gives log-probabilities and no logits."""

    def __init__(self, decoder):
        super().__init__()
        self.inner = decoder
        self.prepare, self.init_state = decoder.prepare, decoder.init_state

    def step(self, prepared, tokens, state):
        return self.inner.step(prepared, tokens, state)._replace(logits=None)


def test_a_decoder_without_logits_is_refused_the_penalty_in_one_line():
    decoder = make_decoder(seed=3)
    annotations = annotations_for(2)
    wrapped = _LogProbsOnly(decoder)
    same = greedy_search(wrapped, annotations, settings(max_length=6))  # without the penalty: the same
    reference = greedy_search(decoder, annotations, settings(max_length=6))
    assert [c.tokens for c in same] == [c.tokens for c in reference]
    with pytest.raises(ConfigError) as error:
        greedy_search(wrapped, annotations, settings(max_length=6, repetition_penalty=1.2))
    assert "decode.repetition_penalty" in str(error.value) and "logits" in str(error.value)
