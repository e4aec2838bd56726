"""Properties over arbitrary input: the tokenizer, the vocabulary and the Java-less metrics.

Complements test_text_ptb.py (arbitrary Unicode gives clean lower-case tokens) and test_metrics.py
(arbitrary Unicode scores stay in range; identical captions over a fixed word list score 1).
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from captioning.data.tokenizers import tokenize
from captioning.data.vocab import SPECIALS, Vocabulary
from captioning.evaluation.metrics import score_captions

# ------------------------------------------------------------------ tokenizer

# Whole words the Treebank rules split although they hold letters only ("cannot" -> "can not").
_SPLIT_WORDS = {"cannot", "gimme", "gonna", "gotta", "lemme", "wanna"}
plain_words = st.from_regex(r"[A-Za-z]{1,8}", fullmatch=True).filter(lambda w: w.lower() not in _SPLIT_WORDS)
separators = st.sampled_from([" ", "  ", "\t", ", ", " ; ", " - ", " : ", "\n"])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(plain_words, separators), min_size=1, max_size=10),
    st.sampled_from(["", "?", "!", " !!"]),
)
def test_plain_words_come_back_lower_cased_whatever_the_spacing_and_punctuation(pieces, ending):
    text = "".join(word + separator for word, separator in pieces).rstrip() + ending
    expected = [word.lower() for word, _ in pieces] + (["!!"] if ending == " !!" else [])
    assert tokenize(text) == expected


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_surrounding_whitespace_does_not_change_the_tokens(text: str):
    assert tokenize(f" \t{text}\n  ") == tokenize(text)


# ------------------------------------------------------------------ vocabulary

common_words = st.sampled_from(
    ["a", "dog", "red", "circle", "über", "猫", "кошка", "<end>", "<pad>", "<unk>"]
)
any_word = st.text(min_size=1, max_size=6)
word = st.one_of(common_words, common_words, any_word)  # repeats, so that min_count matters
token_lists = st.lists(st.lists(word, max_size=12), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(token_lists, st.integers(1, 3))
def test_build_keeps_frequent_words_in_count_order(captions, min_count):
    vocab = Vocabulary.build(captions, min_count)
    counts = Counter(token for caption in captions for token in caption)
    words = vocab.itos[len(SPECIALS) :]
    assert tuple(vocab.itos[: len(SPECIALS)]) == SPECIALS
    assert len(set(vocab.itos)) == len(vocab)
    assert set(words) == {w for w, n in counts.items() if n >= min_count and w not in SPECIALS}
    assert words == sorted(words, key=lambda w: (-counts[w], w))
    assert all(vocab.stoi[w] == i for i, w in enumerate(vocab.itos))


@settings(max_examples=100, deadline=None)
@given(token_lists, st.lists(word, max_size=30), st.one_of(st.none(), st.integers(1, 15)))
def test_encode_decode_round_trip(captions, tokens, max_length):
    vocab = Vocabulary.build(captions, min_count=1)
    ids = vocab.encode(tokens, max_length)
    kept = tokens if max_length is None else tokens[:max_length]
    assert ids[0] == vocab.start_id and ids[-1] == vocab.end_id and len(ids) == len(kept) + 2
    assert all(vocab.unk_id <= i < len(vocab) for i in ids[1:-1])  # never pad, start or end inside
    expected = [t if t in vocab and t not in SPECIALS else "<unk>" for t in kept]
    assert vocab.decode(ids) == expected
    assert vocab.decode(ids + [vocab.pad_id] * 3) == expected


@settings(max_examples=60, deadline=None)
@given(token_lists)
def test_json_round_trip(captions):
    vocab = Vocabulary.build(captions, min_count=1)
    assert Vocabulary.from_dict(json.loads(json.dumps(vocab.to_dict()))) == vocab
    with tempfile.TemporaryDirectory() as folder:
        vocab.save(Path(folder) / "vocab.json")
        loaded = Vocabulary.load(Path(folder) / "vocab.json")
    assert loaded == vocab and loaded.stoi == vocab.stoi


# ------------------------------------------------------------------ metrics


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=50), min_size=1, max_size=4))
def test_identical_unicode_captions_score_the_maximum(texts: list[str]):
    references = {i: [text, text] for i, text in enumerate(texts)}
    scores = score_captions(references, dict(enumerate(texts)), use_java=False)
    lengths = [len(tokenize(text)) for text in texts]
    for i, length in enumerate(lengths):
        for n in range(1, min(length, 4) + 1):  # every n-gram order the caption has
            assert scores.per_image[i][f"BLEU-{n}"] == pytest.approx(1.0, abs=1e-6)
        if length:
            assert scores.per_image[i]["ROUGE-L"] == pytest.approx(1.0)
        assert scores.per_image[i]["CIDEr-D"] >= 0.0
    if min(lengths) >= 4:
        for n in range(1, 5):
            assert scores.overall[f"BLEU-{n}"] == pytest.approx(1.0, abs=1e-6)
    assert scores.overall["CIDEr-D"] >= 0.0
