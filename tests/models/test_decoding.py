"""What every search does, pinned to references: per-image decoding, a replay through the decoder's
steps, the configured constraints, dispatch by strategy."""

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
    all_strategies,
    annotations_for,
    assert_same_caption,
    bigram_decoder,
    make_decoder,
    replay,
    trigrams,
    varied_decoder,
)
from search_options import settings

from captioning.config import DecodeConfig
from captioning.data.vocab import Vocabulary
from captioning.models import choices, decoding
from captioning.models.beam_search import beam_search
from captioning.models.decoding import (
    Caption,
    decode,
    greedy_search,
    rollout,
    sample_captions,
    sampler,
)

pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------- batching
@pytest.mark.parametrize(
    "strategy, options",
    [
        ("greedy", {}),
        ("greedy", {"min_length": 2}),
        ("beam", {"beam_size": 3}),
        ("beam", {"beam_size": 5}),
        ("beam", {"beam_size": 3, "length_alpha": 0.7}),
        ("beam", {"beam_size": 5, "block_trigrams": True}),
        ("beam", {"beam_size": 5, "length_alpha": 1.0, "block_trigrams": True, "min_length": 2}),
    ],
    ids=["greedy", "greedy-min2", "beam3", "beam5", "beam3-alpha", "beam5-trigrams", "beam5-all"],
)
@pytest.mark.parametrize("scoring, gate", [("additive", "scalar"), ("multihead", "channel")])
def test_batching_does_not_change_any_image(strategy, options, scoring, gate):
    annotations = annotations_for(5, seed=5)
    decoder = varied_decoder(annotations, 10, scoring=scoring, gate=gate)
    search = greedy_search if strategy == "greedy" else beam_search
    batched = search(decoder, annotations, settings(max_length=10, **options))
    assert len(batched) == 5
    for i in range(5):
        (alone,) = search(decoder, annotations[i : i + 1], settings(max_length=10, **options))
        assert_same_caption(batched[i], alone)


# ----------------------------------------------------------------------------- no <end> reachable
@pytest.mark.parametrize(
    "search, options, end_bias",
    [
        (greedy_search, {}, -1e9),
        (beam_search, {"beam_size": 1}, -1e9),
        (beam_search, {"beam_size": 3}, -1e9),
        (beam_search, {"beam_size": 3, "block_trigrams": True, "length_alpha": 1.0}, -1e9),
        (beam_search, {"beam_size": 4}, float("-inf")),
        (beam_search, {"beam_size": 20}, float("-inf")),  # more beams than tokens
        (beam_search, {"beam_size": 3, "min_length": 5}, float("-inf")),
    ],
    ids=["greedy", "beam1", "beam3", "beam3-trigrams", "beam4-inf", "beam20-inf", "beam3-min-inf"],
)
def test_no_end_gives_best_unfinished_caption_of_max_length(search, options, end_bias):
    decoder = make_decoder(seed=6, end_bias=end_bias)
    annotations = annotations_for(3)
    captions = search(decoder, annotations, settings(max_length=5, **options))
    for i, caption in enumerate(captions):
        assert not caption.finished
        assert len(caption.tokens) == 5 and END not in caption.tokens
        assert math.isfinite(caption.log_prob)
        log_prob, alphas, _ = replay(decoder, annotations[i : i + 1], caption.tokens, finished=False)
        assert caption.log_prob == pytest.approx(log_prob, abs=1e-4)
        torch.testing.assert_close(caption.attention, alphas, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- min_length
@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_min_length_is_respected(strategy):
    decoder = make_decoder(seed=8, end_bias=5.0)  # <end> is likely early
    annotations = annotations_for(6)
    run = {
        "greedy": lambda **kw: greedy_search(decoder, annotations, settings(max_length=8, **kw)),
        "beam": lambda **kw: beam_search(decoder, annotations, settings(beam_size=3, max_length=8, **kw)),
        "sample": lambda **kw: sample_captions(decoder, annotations, settings(max_length=8, **kw)),
    }[strategy]
    torch.manual_seed(0)
    free = run()
    assert min(len(c.tokens) for c in free) < 4  # without the constraint, short captions occur
    torch.manual_seed(0)
    constrained = run(min_length=4)
    assert any(c.finished for c in constrained)
    for i, caption in enumerate(constrained):
        assert len(caption.tokens) >= 4
        # the reported log-probability is the model's, not the constrained distribution's
        log_prob, _, _ = replay(decoder, annotations[i : i + 1], caption.tokens, caption.finished)
        assert caption.log_prob == pytest.approx(log_prob, abs=1e-4)


# ----------------------------------------------------------------------------- trigram blocking
@pytest.mark.parametrize("beam_size", [1, 3, 5])
def test_block_trigrams(beam_size):
    decoder = bigram_decoder()
    annotations = annotations_for(3)
    repeated = beam_search(decoder, annotations, settings(beam_size=beam_size, max_length=10))
    for caption in repeated:
        assert caption.tokens[:4] == [4, 5, 4, 5]  # the unconstrained search repeats "4 5 4"
        assert len(set(trigrams(caption.tokens))) < len(trigrams(caption.tokens))
    blocked = beam_search(
        decoder, annotations, settings(beam_size=beam_size, max_length=10, block_trigrams=True)
    )
    for i, caption in enumerate(blocked):
        assert len(caption.tokens) >= 4 and math.isfinite(caption.log_prob)
        assert len(set(trigrams(caption.tokens))) == len(trigrams(caption.tokens)), caption.tokens
        log_prob, _, _ = replay(decoder, annotations[i : i + 1], caption.tokens, caption.finished)
        assert caption.log_prob == pytest.approx(log_prob, abs=1e-4)


# ----------------------------------------------------------------------------- returned captions
@pytest.mark.parametrize(
    "scoring, gate",
    [("additive", "scalar"), ("multihead", "channel"), ("scaled_dot", "none"), ("general", "scalar")],
)
def test_captions_carry_their_attention_and_log_prob(scoring, gate):
    decoder = make_decoder(seed=11, scoring=scoring, gate=gate)
    annotations = annotations_for(4)
    for name, captions in all_strategies(decoder, annotations).items():
        assert len(captions) == 4, name
        for i, caption in enumerate(captions):
            n = len(caption.tokens)
            assert all(t != END for t in caption.tokens)
            assert caption.attention.shape == (n, P), name
            torch.testing.assert_close(caption.attention.sum(1), torch.ones(n))
            log_prob, alphas, betas = replay(
                decoder, annotations[i : i + 1], caption.tokens, caption.finished
            )
            assert caption.log_prob == pytest.approx(log_prob, abs=1e-4), name
            torch.testing.assert_close(caption.attention, alphas, rtol=0, atol=1e-5, msg=name)
            if gate == "none":
                assert caption.betas is None, name
            else:
                assert caption.betas.shape == (n,), name
                torch.testing.assert_close(caption.betas, betas, rtol=0, atol=1e-5, msg=name)


def test_pad_and_start_are_never_emitted():
    # A decoder that puts nearly all its mass on <pad> and <start> still writes only words and <end>,
    # with every strategy and in self-critical rollouts.
    decoder = make_decoder(seed=13)
    with torch.no_grad():
        decoder.out.bias[PAD] = 20.0
        decoder.out.bias[START] = 20.0
        decoder.out.bias[END] = -20.0  # full-length captions: seven choices each
    annotations = annotations_for(4)
    for name, captions in all_strategies(decoder, annotations).items():
        for caption in captions:
            assert len(caption.tokens) == 7 and not {PAD, START, END} & set(caption.tokens), (
                name,
                caption.tokens,
            )
    torch.manual_seed(0)
    sampled = rollout(decoder, annotations, sampler(), settings(max_length=7), repeats=3)
    emitted = sampled.tokens[sampled.mask]
    assert emitted.numel() > 0 and not ((emitted == PAD) | (emitted == START)).any()


@pytest.mark.parametrize("gate", ["scalar", "none"])
def test_certain_end_gives_empty_captions(gate):
    decoder = make_decoder(seed=12, gate=gate, end_bias=50.0)
    annotations = annotations_for(2)
    torch.manual_seed(0)
    for captions in all_strategies(decoder, annotations).values():
        for caption in captions:
            assert caption.tokens == [] and caption.finished
            assert caption.attention.shape == (0, P)
            assert caption.log_prob == pytest.approx(0.0, abs=1e-4)
            if gate == "none":
                assert caption.betas is None
            else:
                assert caption.betas is not None and caption.betas.shape == (0,)


def test_caption_words():
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a", "red", "circle"])
    caption = Caption(
        tokens=[4, 5, 6], log_prob=-1.0, attention=torch.zeros(3, P), betas=None, finished=True, score=-1.0
    )
    assert caption.words(vocab) == ["a", "red", "circle"]


# ----------------------------------------------------------------------------- decode()
@pytest.mark.parametrize(
    "config, strategy",
    [
        (DecodeConfig(strategy="greedy", max_length=6, min_length=1), "greedy_search"),
        (
            DecodeConfig(
                strategy="beam",
                beam_size=4,
                max_length=6,
                length_alpha=0.5,
                block_trigrams=True,
                forbid_unk=False,
            ),
            "beam_search",
        ),
        (DecodeConfig(strategy="sample", max_length=6, temperature=1.5, top_k=3), "sample_captions"),
    ],
    ids=["greedy", "beam", "sample"],
)
def test_decode_dispatches_to_the_strategy(config, strategy, monkeypatch):
    decoder = make_decoder(seed=16)
    annotations = annotations_for(3)
    torch.manual_seed(0)
    captions = decode(decoder, annotations, config)
    torch.manual_seed(0)
    expected = getattr(decoding, strategy)(decoder, annotations, config)
    for actual, reference in zip(captions, expected, strict=True):
        assert_same_caption(actual, reference, atol=0)
    # exactly the named strategy runs, given the whole configuration
    calls = []
    for name in ("greedy", "beam", "sample"):
        monkeypatch.setitem(
            decoding.STRATEGIES, name, lambda *args, name=name: calls.append((name, args[2])) or []
        )
    decode(decoder, annotations, config)
    assert calls == [(config.strategy, config)]


@dataclasses.dataclass(frozen=True)
class _WithCap(DecodeConfig):
    """A fork's new decoding option: one field (read by the choice below), no signature changed."""

    word_cap: int = 0  # a word id the search may not choose


def test_a_new_decoding_option_is_one_field_plus_its_use(monkeypatch):
    decoder = make_decoder(seed=16)
    annotations = annotations_for(3)
    plain = _WithCap(strategy="beam", max_length=6, forbid_unk=False)
    forbidden = decode(decoder, annotations, plain)[0].tokens[0]  # a word the model does say
    original = choices.choice_scores

    def choice_scores(log_probs, history, step, config):
        scores = original(log_probs, history, step, config)
        if config.word_cap:
            scores = scores.clone()
            scores[:, config.word_cap] = float("-inf")
        return scores

    monkeypatch.setattr(choices, "choice_scores", choice_scores)  # the option's use, in every search
    for strategy in ("greedy", "beam", "sample"):
        config = dataclasses.replace(plain, strategy=strategy, word_cap=forbidden)
        torch.manual_seed(0)
        captions = decode(decoder, annotations, config)  # the option reached the search unchanged
        assert all(forbidden not in c.tokens for c in captions), strategy
        torch.manual_seed(0)
        free = decode(decoder, annotations, dataclasses.replace(config, word_cap=0))
        assert any(forbidden in c.tokens for c in free), strategy


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_forbid_unk_keeps_unk_out_of_every_strategy(strategy):
    decoder = make_decoder(seed=18)
    with torch.no_grad():
        decoder.out.bias[Vocabulary.unk_id] = 25.0  # a model that says <unk> whenever it can
    annotations = annotations_for(3)
    for forbid, expect_unk in ((False, True), (True, False)):
        torch.manual_seed(0)
        config = DecodeConfig(strategy=strategy, max_length=5, forbid_unk=forbid)
        tokens = [t for caption in decode(decoder, annotations, config) for t in caption.tokens]
        assert (Vocabulary.unk_id in tokens) == expect_unk, (forbid, tokens)
        assert tokens  # forbidding <unk> leaves words to say


def test_decoding_does_not_track_gradients():
    decoder = make_decoder(seed=17)
    for captions in all_strategies(decoder, annotations_for(2)).values():
        assert all(not c.attention.requires_grad for c in captions)


@pytest.mark.parametrize(
    "strategy, options",
    [
        ("greedy", {"repetition_penalty": 1.8}),
        ("beam", {"beam_size": 4, "repetition_penalty": 1.5, "num_return": 3}),
        ("beam", {"beam_size": 6, "beam_groups": 3, "diversity": 0.7, "num_return": 6}),
        ("beam", {"beam_size": 4, "beam_groups": 2, "diversity": 1.5, "block_trigrams": True}),
        ("sample", {"top_p": 1e-6, "repetition_penalty": 0.5}),
    ],
    ids=["greedy-penalty", "beam-penalty-n3", "diverse-n6", "diverse-trigrams", "nucleus-penalty"],
)
def test_batching_does_not_change_any_image_with_the_new_options(strategy, options):
    annotations = annotations_for(5, seed=5)
    decoder = varied_decoder(annotations, 10)
    config = settings(strategy=strategy, max_length=10, **options)
    batched = decode(decoder, annotations, config)
    for i in range(5):
        (alone,) = decode(decoder, annotations[i : i + 1], config)
        assert len(alone.alternatives) == len(batched[i].alternatives)
        for a, b in zip([batched[i], *batched[i].alternatives], [alone, *alone.alternatives], strict=True):
            assert_same_caption(a, b)
