"""The vocabulary (counted on train only, stable ids, JSON round trip, encode/decode) and tokenizer basics."""

from __future__ import annotations

import random
from pathlib import Path

from messages import raises_naming

from captioning.data import DatasetError, build_vocabulary
from captioning.data.records import ImageRecord
from captioning.data.tokenizers import detokenize, tokenize
from captioning.data.vocab import SPECIALS, Vocabulary, VocabularyError


def _records(captions_by_split: dict[str, list[str]]) -> list[ImageRecord]:
    return [
        ImageRecord(i, Path(f"{i}.jpg"), split, (tuple(caption.split()),), (caption,))
        for i, (split, caption) in enumerate((s, c) for s, cs in captions_by_split.items() for c in cs)
    ]


RECORDS = _records(
    {"train": ["a dog runs", "a dog sits", "a cat sits"], "val": ["a zebra runs"], "test": ["a giraffe"]}
)


def test_vocabulary_counts_train_only():
    vocab = build_vocabulary(RECORDS, min_count=1)
    assert vocab.itos[:4] == list(SPECIALS)
    assert "zebra" not in vocab and "giraffe" not in vocab
    assert vocab.encode(["a", "giraffe"]) == [vocab.start_id, vocab.stoi["a"], vocab.unk_id, vocab.end_id]


def test_min_count_and_id_order():
    vocab = build_vocabulary(RECORDS, min_count=2)
    assert vocab.itos[4:] == ["a", "dog", "sits"]  # by falling count, ties alphabetical; cat and runs dropped
    assert build_vocabulary(RECORDS, min_count=1).itos[4:] == ["a", "dog", "sits", "cat", "runs"]


def test_ids_do_not_depend_on_record_order():
    shuffled = RECORDS.copy()
    random.Random(0).shuffle(shuffled)
    assert build_vocabulary(shuffled, min_count=1) == build_vocabulary(RECORDS, min_count=1)


def test_vocabulary_needs_training_captions():
    with raises_naming(DatasetError, "train"):
        build_vocabulary(_records({"test": ["a dog"]}), min_count=1)


def test_shapes_vocabulary_holds_its_words(shapes_vocab):
    for word in ("circle", "red", "small", "left"):
        assert word in shapes_vocab


def test_json_round_trip(tmp_path):
    vocab = Vocabulary.build([["café", "à", "zürich"], ["café"]], min_count=1)
    vocab.save(tmp_path / "vocab.json")
    loaded = Vocabulary.load(tmp_path / "vocab.json")
    assert loaded == vocab and loaded.stoi["café"] == vocab.stoi["café"]
    assert Vocabulary.from_dict(vocab.to_dict()) == vocab


def test_bad_vocabulary_files(tmp_path):
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with raises_naming(VocabularyError, tmp_path / "broken.json", "JSON"):
        Vocabulary.load(tmp_path / "broken.json")
    with raises_naming(VocabularyError, ", ".join(SPECIALS)):
        Vocabulary(["a", "b"])
    with raises_naming(VocabularyError, "'a'", "duplicate"):
        Vocabulary([*SPECIALS, "a", "a"])


def test_encode_truncates_and_decode_stops_at_end():
    vocab = build_vocabulary(RECORDS, min_count=1)
    ids = vocab.encode(["a", "dog", "runs", "a", "cat"], max_length=3)
    assert ids == [vocab.start_id, vocab.stoi["a"], vocab.stoi["dog"], vocab.stoi["runs"], vocab.end_id]
    assert vocab.decode(ids + [vocab.stoi["cat"]]) == ["a", "dog", "runs"]
    assert vocab.decode([vocab.start_id, vocab.stoi["cat"], vocab.pad_id]) == ["cat"]


def test_tokenize_basics():
    assert tokenize("A dog's ball, isn't it?") == ["a", "dog", "'s", "ball", "is", "n't", "it"]
    assert tokenize("  Two   dogs\tplay.\n") == ["two", "dogs", "play"]
    assert tokenize("Un café à Zürich") == ["un", "café", "à", "zürich"]
    assert tokenize("") == [] and tokenize(" . , ") == []
    assert detokenize(["a", "dog"]) == "a dog"
