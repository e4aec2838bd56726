"""Beam search and diverse beam search, pinned to references: greedy, exhaustive search, a plain
diverse beam search written beam by beam."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from search_decoders import (
    END,
    PAD,
    START,
    P,
    V,
    annotations_for,
    assert_same_caption,
    make_decoder,
    replay,
    varied_decoder,
)
from search_options import settings

from captioning.models.beam_search import beam_search
from captioning.models.decoding import (
    greedy_search,
)

pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------- beam 1 == greedy
@pytest.mark.parametrize("min_length", [0, 3])
@pytest.mark.parametrize(
    "scoring, gate", [("additive", "scalar"), ("multihead", "channel"), ("general", "none")]
)
def test_beam_size_one_equals_greedy(scoring, gate, min_length):
    annotations = annotations_for(6)
    decoder = varied_decoder(annotations, 8, scoring=scoring, gate=gate)
    greedy = greedy_search(decoder, annotations, settings(max_length=8, min_length=min_length))
    beam = beam_search(decoder, annotations, settings(beam_size=1, max_length=8, min_length=min_length))
    for g, b in zip(greedy, beam, strict=True):
        assert_same_caption(b, g)


# ----------------------------------------------------------------------------- exhaustive search
@torch.no_grad()
def exhaustive_best(
    decoder, annotations: torch.Tensor, max_length: int, min_length: int = 0, length_alpha: float = 0.0
) -> tuple[list[int], float, bool]:
    """The best caption of one image (1, P, C) by enumerating every sequence of words (<end>, <pad>
    and <start> excluded: a caption never contains them).

    Finished captions (``<end>`` after 0..max_length words, not before ``min_length``) are ranked by
    log-probability / ((5 + words + 1) / 6) ** alpha; unfinished ones of max_length words (ranked
    by log-probability / ((5 + words) / 6) ** alpha) count only when no finished caption exists.
    """
    words = [w for w in range(decoder.vocab_size) if w not in (END, PAD, START)]
    prepared, initial = decoder.prepare(annotations), decoder.init_state(annotations)
    finished, unfinished = [], []
    frontier = [([], 0.0, initial, START)]
    for t in range(max_length + 1):
        next_frontier = []
        for tokens, log_prob, state, previous in frontier:
            out = decoder.step(prepared, torch.tensor([previous]), state)
            log_probs = out.log_probs[0].double()
            end = log_prob + float(log_probs[END])
            if t >= min_length and math.isfinite(end):
                finished.append((end / ((5 + t + 1) / 6) ** length_alpha, tokens, end))
            if t == max_length:
                unfinished.append((log_prob / ((5 + t) / 6) ** length_alpha, tokens, log_prob))
                continue
            next_frontier += [(tokens + [w], log_prob + float(log_probs[w]), out.state, w) for w in words]
        frontier = next_frontier
    if finished:
        _, tokens, log_prob = max(finished, key=lambda item: item[0])
        return tokens, log_prob, True
    _, tokens, log_prob = max(unfinished, key=lambda item: item[0])
    return tokens, log_prob, False


@pytest.mark.parametrize(
    "min_length, length_alpha, end_bias",
    [(0, 0.0, None), (0, 2.0, None), (2, 0.0, None), (0, 0.0, float("-inf"))],
    ids=["plain", "length_alpha", "min_length", "no_end"],
)
def test_large_beam_equals_exhaustive_search(min_length, length_alpha, end_bias):
    vocab_size, max_length = 6, 3
    annotations = annotations_for(4, seed=3)
    options = {"max_length": max_length, "min_length": min_length, "length_alpha": length_alpha}
    # A decoder for which the reference is not trivial: a beam of 2 misses the best caption of some
    # image (without <end>, a small beam finds the best unfinished caption of every random decoder).
    for seed in range(20):
        decoder = make_decoder(seed=seed, vocab_size=vocab_size, end_bias=end_bias)
        best = [exhaustive_best(decoder, annotations[i : i + 1], **options) for i in range(4)]
        small_beams = beam_search(decoder, annotations, settings(beam_size=2, **options))
        unnormalised = [
            exhaustive_best(decoder, annotations[i : i + 1], max_length, min_length) for i in range(4)
        ]
        misses = any(small.tokens != b[0] for small, b in zip(small_beams, best, strict=True))
        # with length_alpha, also a decoder for which the normalisation changes some image's best caption
        normalised = length_alpha == 0 or any(a[0] != b[0] for a, b in zip(unnormalised, best, strict=True))
        if end_bias is not None or (misses and normalised):
            break
    else:
        raise AssertionError("every random decoder is solved by a beam of 2")
    # Every live hypothesis and every one of its continuations fits in the beam: 5**3 * 6 = 750.
    beam_size = (vocab_size - 1) ** max_length * vocab_size
    beams = beam_search(decoder, annotations, settings(beam_size=beam_size, **options))
    for caption, (tokens, log_prob, finished) in zip(beams, best, strict=True):
        assert caption.tokens == tokens
        assert caption.finished == finished == (end_bias is None)
        assert caption.log_prob == pytest.approx(log_prob, abs=1e-4)
        penalty = ((5 + len(tokens) + int(finished)) / 6) ** length_alpha
        assert caption.score == pytest.approx(log_prob / penalty, abs=1e-4)
        assert len(tokens) >= min_length


def test_beam_never_raises_when_trigram_blocking_leaves_no_word():
    # 4 specials + 1 word and no <end>: only 4 tokens can follow <end>-less, so at most 4**3 = 64
    # distinct trigrams exist and every hypothesis runs out of allowed words before 70 words.
    decoder = make_decoder(seed=7, vocab_size=5, end_bias=float("-inf"))
    (caption,) = beam_search(
        decoder, annotations_for(1), settings(beam_size=2, max_length=70, block_trigrams=True)
    )
    assert not caption.finished
    assert len(caption.tokens) <= 70 and caption.attention.shape == (len(caption.tokens), P)


# ----------------------------------------------------------------------------- diverse beam search
@torch.no_grad()
def diverse_beam_reference(decoder, annotations, beam_size, groups, diversity, max_length, length_alpha):
    """Diverse beam search for one image (1, P, C), written plainly: every group's beams one by one.

    Returns every hypothesis kept (finished ones first, then by score) as (tokens, score, log_prob).
    """
    width = beam_size // groups
    prepared, start_state = decoder.prepare(annotations), decoder.init_state(annotations)
    live = [[([], 0.0, 0.0, start_state)] for _ in range(groups)]  # (tokens, score, log_prob, state)
    finished: list[list[tuple]] = [[] for _ in range(groups)]
    done = [False] * groups
    for t in range(max_length + 1):
        used = [0] * V  # the words the earlier groups' live beams took at this step
        next_live = []
        for g in range(groups):
            if done[g]:
                next_live.append([])
                continue
            candidates = []
            for tokens, score, log_prob, state in live[g]:
                out = decoder.step(prepared, torch.tensor([tokens[-1] if tokens else START]), state)
                scores = out.log_probs[0].clone()
                scores[[PAD, START]] = float("-inf")
                for word in range(V):
                    if math.isfinite(scores[word]):
                        cost = float(scores[word]) - (diversity * used[word] if g else 0.0)
                        model = log_prob + float(out.log_probs[0, word])
                        candidates.append((score + cost, tokens, word, model, out.state))
            candidates.sort(key=lambda c: -c[0])
            best = candidates[: 2 * width]
            for score, tokens, word, model, _ in best[:width]:
                if word == END:
                    penalty = ((5 + len(tokens) + 1) / 6) ** length_alpha
                    finished[g].append((tokens, score / penalty, model, True))
            kept = [c for c in best if c[2] != END][:width]
            next_live.append(
                [(tokens + [word], score, model, state) for score, tokens, word, model, state in kept]
            )
            for c in kept:
                used[c[2]] += 1
        if t == max_length:
            break
        live = next_live
        done = [len(pool) >= width for pool in finished]
        if all(done):
            break
    pool = [h for group in finished for h in group]
    for g in range(groups):
        if not done[g]:
            for tokens, score, log_prob, _ in live[g]:
                pool.append((tokens, score / ((5 + len(tokens)) / 6) ** length_alpha, log_prob, False))
    pool.sort(key=lambda h: (h[3], h[1]), reverse=True)
    ranked = []
    for h in pool:
        if all(h[0] != other[0] for other in ranked):
            ranked.append(h)
    return ranked


@pytest.mark.parametrize(
    "beam_size, groups, diversity, length_alpha",
    [(2, 1, 0.0, 0.0), (4, 2, 0.8, 0.0), (6, 3, 0.5, 1.0), (6, 2, 3.0, 0.0)],
    ids=["one-group", "2x2", "3x2-alpha", "2x3-strong"],
)
def test_diverse_beam_search_equals_a_plain_reference(beam_size, groups, diversity, length_alpha):
    annotations = annotations_for(4, seed=22)
    decoder = varied_decoder(annotations, 6)
    config = settings(
        beam_size=beam_size,
        beam_groups=groups,
        diversity=diversity,
        max_length=6,
        length_alpha=length_alpha,
        num_return=beam_size,
    )
    captions = beam_search(decoder, annotations, config)
    plain = beam_search(decoder, annotations, dataclasses.replace(config, diversity=0.0))
    differs = False
    for i, caption in enumerate(captions):
        reference = diverse_beam_reference(
            decoder, annotations[i : i + 1], beam_size, groups, diversity, 6, length_alpha
        )
        ranked = [caption, *caption.alternatives]
        assert [c.tokens for c in ranked] == [h[0] for h in reference[:beam_size]]
        for c, (_, score, log_prob, done) in zip(ranked, reference, strict=False):
            assert c.score == pytest.approx(score, abs=1e-4)
            assert c.log_prob == pytest.approx(log_prob, abs=1e-4)
            assert c.finished == done
        differs |= [c.tokens for c in ranked] != [c.tokens for c in [plain[i], *plain[i].alternatives]]
    assert differs == (groups > 1)  # the penalty changes some image's captions


def test_one_group_is_beam_search_whatever_the_diversity():
    annotations = annotations_for(5, seed=5)
    decoder = varied_decoder(annotations, 10)
    plain = beam_search(decoder, annotations, settings(beam_size=4, max_length=10, length_alpha=0.5))
    grouped = beam_search(
        decoder, annotations, settings(beam_size=4, max_length=10, length_alpha=0.5, diversity=7.0)
    )
    for a, b in zip(grouped, plain, strict=True):
        assert_same_caption(a, b, atol=0)


# ----------------------------------------------------------------------------- several captions
def test_num_return_gives_distinct_ranked_captions_led_by_the_best():
    annotations = annotations_for(4)
    decoder = varied_decoder(annotations, 8)
    best = beam_search(decoder, annotations, settings(beam_size=5, max_length=8))
    several = beam_search(decoder, annotations, settings(beam_size=5, max_length=8, num_return=3))
    for i, (one, caption) in enumerate(zip(best, several, strict=True)):
        assert_same_caption(caption, one, atol=0)  # the first is the system's output as before
        ranked = [caption, *caption.alternatives]
        assert len(ranked) == 3 and len({tuple(c.tokens) for c in ranked}) == 3
        keys = [(c.finished, c.score) for c in ranked]
        assert keys == sorted(keys, reverse=True)
        for c in ranked:
            log_prob, alphas, _ = replay(decoder, annotations[i : i + 1], c.tokens, c.finished)
            assert c.log_prob == pytest.approx(log_prob, abs=1e-4)
            torch.testing.assert_close(c.attention, alphas, rtol=0, atol=1e-5)
    assert best[0].alternatives == []
