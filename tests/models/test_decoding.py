"""Greedy, sampling and beam search, pinned to references: greedy, exhaustive search, per-image decoding."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from search_options import settings

from captioning.config import DecodeConfig, LSTMDecoderConfig
from captioning.data.vocab import Vocabulary
from captioning.models import decoding
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.decoding import (
    Caption,
    beam_search,
    decode,
    greedy_search,
    rollout,
    sample_captions,
    sampler,
)

PAD, START, END = 0, 1, 2
C, P, V = 8, 9, 11  # annotation channels, grid positions, vocabulary (4 specials + 7 words)


pytestmark = pytest.mark.usefixtures("single_thread")


def make_decoder(
    seed: int = 0,
    vocab_size: int = V,
    scoring: str = "additive",
    gate: str = "scalar",
    gain: float = 3.0,
    end_bias: float | None = None,
) -> ShowAttendTellDecoder:
    """A random decoder in eval mode.

    ``gain`` scales every parameter: the default initialisation gives near-uniform word
    distributions and the same caption for every image; larger weights give captions that differ
    per image and end at different lengths. ``end_bias`` sets the output bias of ``<end>``.
    """
    torch.manual_seed(seed)
    config = LSTMDecoderConfig(
        scoring=scoring, num_heads=4, embed_dim=16, hidden_dim=16, attention_dim=16, gate=gate, dropout=0.0
    )
    decoder = ShowAttendTellDecoder.from_config(config, vocab_size, C).eval()
    with torch.no_grad():
        for parameter in decoder.parameters():
            parameter.mul_(gain)
        if end_bias is not None:
            decoder.out.bias[END] = end_bias
    return decoder


def annotations_for(batch: int, seed: int = 100) -> torch.Tensor:
    return torch.randn(batch, P, C, generator=torch.Generator().manual_seed(seed))


def varied_decoder(annotations: torch.Tensor, max_length: int, **options) -> ShowAttendTellDecoder:
    """The first random decoder (by seed) whose greedy captions of ``annotations`` end at 3+ lengths.

    Searching keeps the tests meaningful (images finish at different steps) whatever the
    initialisation of the layers draws from the random generator.
    """
    for seed in range(50):
        decoder = make_decoder(seed=seed, **options)
        if (
            len({len(c.tokens) for c in greedy_search(decoder, annotations, settings(max_length=max_length))})
            >= 3
        ):
            return decoder
    raise AssertionError("no random decoder gives captions of varied lengths")


@torch.no_grad()
def replay(decoder, annotations: torch.Tensor, tokens: list[int], finished: bool):
    """Feed ``<start> tokens`` through ``decoder.step`` for one image (1, P, C).

    Returns the caption's log-probability (plus ``<end>`` when finished), alphas (len, P), betas.
    """
    prepared, state = decoder.prepare(annotations), decoder.init_state(annotations)
    previous, log_prob, alphas, betas = START, 0.0, [], []
    for word in tokens + ([END] if finished else []):
        out = decoder.step(prepared, torch.tensor([previous]), state)
        log_prob += float(out.log_probs[0, word])
        alphas.append(out.alpha[0])
        betas.append(None if out.beta is None else out.beta[0])
        state, previous = out.state, word
    alphas = torch.stack(alphas[: len(tokens)]) if tokens else torch.zeros(0, P)
    betas = betas[: len(tokens)]
    betas = None if (betas and betas[0] is None) else (torch.stack(betas) if betas else torch.zeros(0))
    return log_prob, alphas, betas


def assert_same_caption(actual: Caption, expected: Caption, atol: float = 1e-5):
    assert actual.tokens == expected.tokens
    assert actual.finished == expected.finished
    assert actual.log_prob == pytest.approx(expected.log_prob, abs=atol)
    assert actual.score == pytest.approx(expected.score, abs=atol)
    torch.testing.assert_close(actual.attention, expected.attention, rtol=0, atol=atol)
    if expected.betas is None:
        assert actual.betas is None
    else:
        torch.testing.assert_close(actual.betas, expected.betas, rtol=0, atol=atol)


def trigrams(tokens: list[int]) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + 3]) for i in range(len(tokens) - 2)]


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


def test_beam_never_raises_when_trigram_blocking_leaves_no_word():
    # 4 specials + 1 word and no <end>: only 4 tokens can follow <end>-less, so at most 4**3 = 64
    # distinct trigrams exist and every hypothesis runs out of allowed words before 70 words.
    decoder = make_decoder(seed=7, vocab_size=5, end_bias=float("-inf"))
    (caption,) = beam_search(
        decoder, annotations_for(1), settings(beam_size=2, max_length=70, block_trigrams=True)
    )
    assert not caption.finished
    assert len(caption.tokens) <= 70 and caption.attention.shape == (len(caption.tokens), P)


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
def bigram_decoder(strength: float = 6.0) -> ShowAttendTellDecoder:
    """A decoder whose next word depends only on the previous one and loves the cycle 4 5 4 5 ...
    (its logits ``strength`` above the others' in the mean)."""
    decoder = make_decoder(seed=9, gate="none")
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(9))  # table[previous, next]
    table[START, 4] = table[4, 5] = table[5, 4] = strength
    table[:, END] = -4.0
    with torch.no_grad():
        decoder.embedding.weight.zero_()
        decoder.embedding.weight[:, :V] = torch.eye(V)  # one-hot embeddings (embed_dim 16 >= V)
        decoder.hidden_to_out.weight.zero_()
        decoder.hidden_to_out.bias.zero_()
        decoder.context_to_out.weight.zero_()
        decoder.out.weight.zero_()
        decoder.out.weight[:, :V] = table.T
        decoder.out.bias.zero_()
    return decoder


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
def all_strategies(decoder, annotations):
    torch.manual_seed(10)
    return {
        "greedy": greedy_search(decoder, annotations, settings(max_length=7)),
        "beam3": beam_search(decoder, annotations, settings(beam_size=3, max_length=7)),
        "beam4-alpha": beam_search(
            decoder, annotations, settings(beam_size=4, max_length=7, length_alpha=1.0)
        ),
        "sample": sample_captions(decoder, annotations, settings(max_length=7, temperature=1.5)),
    }


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
    original = decoding.choice_scores

    def choice_scores(log_probs, history, step, config):
        scores = original(log_probs, history, step, config)
        if config.word_cap:
            scores = scores.clone()
            scores[:, config.word_cap] = float("-inf")
        return scores

    monkeypatch.setattr(decoding, "choice_scores", choice_scores)  # the option's use
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


# ----------------------------------------------------------------------------- repetition penalty
def test_repetition_penalty_is_the_ctrl_form():
    scores = torch.tensor([[2.0, -1.0, 0.5, -3.0, 4.0], [1.0, 1.0, -2.0, -2.0, 0.0]])
    history = torch.tensor([[0, 1, 1], [3, 4, 3]])
    penalised = decoding.penalize_repetitions(scores, history, 2.0)
    expected = torch.tensor([[1.0, -2.0, 0.5, -3.0, 4.0], [1.0, 1.0, -2.0, -4.0, 0.0]])
    torch.testing.assert_close(penalised, expected)
    assert decoding.penalize_repetitions(scores, history, 1.0) is scores


@torch.no_grad()
def greedy_with_penalty(decoder, annotations, penalty: float, max_length: int) -> tuple[list[int], float]:
    """Greedy decoding of one image with the CTRL penalty applied by hand."""
    prepared, state = decoder.prepare(annotations), decoder.init_state(annotations)
    previous, tokens, log_prob = START, [], 0.0
    for _ in range(max_length + 1):
        out = decoder.step(prepared, torch.tensor([previous]), state)
        scores = out.log_probs[0].clone()
        scores[[PAD, START]] = float("-inf")
        for word in set(tokens):
            scores[word] = scores[word] / penalty if scores[word] > 0 else scores[word] * penalty
        word = int(scores.argmax())
        if len(tokens) == max_length and word != END:
            return tokens, log_prob
        log_prob += float(out.log_probs[0, word])
        if word == END:
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
