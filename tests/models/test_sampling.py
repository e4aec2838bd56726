"""Sampling, pinned to references: greedy (top-1, a tiny nucleus), an explicit sort for the nucleus,
the model's own distribution for top-k."""

from __future__ import annotations

import pytest
import torch
from search_decoders import (
    END,
    PAD,
    START,
    V,
    annotations_for,
    assert_same_caption,
    make_decoder,
    replay,
)
from search_options import settings

from captioning.models import decoding
from captioning.models.decoding import (
    greedy_search,
    rollout,
    sample_captions,
    sampler,
)

pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------- sampling
def test_sampling_with_top_1_equals_greedy():
    decoder = make_decoder(seed=13)
    annotations = annotations_for(5)
    greedy = greedy_search(decoder, annotations, settings(max_length=8, min_length=1))
    torch.manual_seed(0)
    sampled = sample_captions(
        decoder, annotations, settings(max_length=8, min_length=1, top_k=1, temperature=5.0)
    )
    for s, g in zip(sampled, greedy, strict=True):
        assert_same_caption(s, g)


def test_sampling_is_reproducible_with_a_seed_and_varies_without():
    decoder = make_decoder(seed=14)
    annotations = annotations_for(4)
    draws = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        draws.append(sample_captions(decoder, annotations, settings(max_length=8, temperature=2.0)))
    for a, b in zip(draws[0], draws[1], strict=True):
        assert_same_caption(a, b, atol=0)
    assert [c.tokens for c in draws[0]] != [c.tokens for c in draws[2]]


@torch.no_grad()
def test_top_k_restricts_sampled_words():
    decoder = make_decoder(seed=15)
    annotations = annotations_for(4)
    torch.manual_seed(0)
    captions = sample_captions(decoder, annotations, settings(max_length=6, top_k=2, temperature=3.0))
    for i, caption in enumerate(captions):
        prepared, state = decoder.prepare(annotations[i : i + 1]), decoder.init_state(annotations[i : i + 1])
        previous = START
        for word in caption.tokens + ([END] if caption.finished else []):
            out = decoder.step(prepared, torch.tensor([previous]), state)
            allowed = out.log_probs[0].clone()
            allowed[[PAD, START]] = float("-inf")  # never emitted, so never among the top k
            assert word in allowed.topk(2).indices.tolist()
            state, previous = out.state, word


# ----------------------------------------------------------------------------- nucleus sampling
def test_nucleus_keeps_exactly_the_smallest_set_reaching_top_p():
    generator = torch.Generator().manual_seed(21)
    logits = torch.randn(64, 12, generator=generator) * 2.0
    logits[0, 3] = float("-inf")  # a word already forbidden stays forbidden
    for top_p in (0.05, 0.3, 0.5, 0.9, 0.999):
        kept = torch.isfinite(decoding.nucleus(logits, top_p))
        for row in range(logits.size(0)):
            probs = torch.softmax(logits[row], dim=0).tolist()
            order = sorted(range(len(probs)), key=lambda w: -probs[w])  # an explicit sort
            expected, mass = set(), 0.0
            for word in order:
                expected.add(word)
                mass += probs[word]
                if mass >= top_p:
                    break
            assert set(kept[row].nonzero().squeeze(1).tolist()) == expected, (top_p, row)
    torch.testing.assert_close(decoding.nucleus(logits, 1.0), logits)


@torch.no_grad()
def test_top_p_combines_with_top_k_and_temperature_when_sampling():
    decoder = make_decoder(seed=15)
    annotations = annotations_for(4)
    config = settings(max_length=6, top_k=4, top_p=0.6, temperature=1.5)
    torch.manual_seed(0)
    captions = sample_captions(decoder, annotations, config)
    for i, caption in enumerate(captions):
        prepared, state = decoder.prepare(annotations[i : i + 1]), decoder.init_state(annotations[i : i + 1])
        previous = START
        for word in caption.tokens + ([END] if caption.finished else []):
            out = decoder.step(prepared, torch.tensor([previous]), state)
            scores = out.log_probs[0].clone()
            scores[[PAD, START]] = float("-inf")
            logits = scores / 1.5
            kth = logits.topk(4).values[-1]
            logits[logits < kth] = float("-inf")
            probs = torch.softmax(logits, dim=0).tolist()
            nucleus, mass = [], 0.0
            for w in sorted(range(V), key=lambda w: -probs[w]):
                nucleus.append(w)
                mass += probs[w]
                if mass >= 0.6:
                    break
            assert word in nucleus and len(nucleus) <= 4
            state, previous = out.state, word
    # a tiny nucleus is the most likely word: greedy
    torch.manual_seed(0)
    tiny = sample_captions(decoder, annotations, settings(max_length=6, top_p=1e-6, temperature=3.0))
    for s, g in zip(tiny, greedy_search(decoder, annotations, settings(max_length=6)), strict=True):
        assert_same_caption(s, g)


def test_self_critical_rollouts_sample_from_the_nucleus():
    decoder = make_decoder(seed=19)
    annotations = annotations_for(3)
    torch.manual_seed(0)
    sampled = rollout(decoder, annotations, sampler(settings(top_p=1e-6)), settings(max_length=6), repeats=4)
    greedy = greedy_search(decoder, annotations, settings(max_length=6))
    for row in range(12):
        length = int(sampled.lengths[row])
        assert sampled.tokens[row, :length].tolist() == greedy[row // 4].tokens
    torch.manual_seed(0)
    free = rollout(decoder, annotations, sampler(settings()), settings(max_length=6), repeats=4)
    assert not torch.equal(free.tokens, sampled.tokens)  # the whole distribution samples other words


def test_num_return_samples_distinct_captions_ranked_by_log_prob():
    decoder = make_decoder(seed=14)
    annotations = annotations_for(3)
    torch.manual_seed(0)
    captions = sample_captions(
        decoder, annotations, settings(strategy="sample", max_length=8, num_return=4, temperature=2.0)
    )
    for i, caption in enumerate(captions):
        ranked = [caption, *caption.alternatives]
        assert len(ranked) == 4 and len({tuple(c.tokens) for c in ranked}) == 4
        keys = [(c.finished, c.log_prob) for c in ranked]
        assert keys == sorted(keys, reverse=True)
        for c in ranked:
            log_prob, _, _ = replay(decoder, annotations[i : i + 1], c.tokens, c.finished)
            assert c.log_prob == pytest.approx(log_prob, abs=1e-4)
