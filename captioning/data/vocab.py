"""Word vocabulary: counted on the training split, saved as plain JSON, embedded in checkpoints."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from captioning.utils.errors import CaptioningError
from captioning.utils.files import atomic_write, not_a_regular_file
from captioning.utils.json_files import read_json_file

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)


class VocabularyError(CaptioningError, ValueError):
    """A vocabulary file or dict is malformed."""


def first_non_word(words: Sequence[object]) -> tuple[int, str] | None:
    """The first entry of ``words`` that is a string but not a word (empty, or holding whitespace: a
    caption's words are joined by spaces, so ``'a b'`` would read as two words and ``''`` as none),
    as ``(index, word)``; None when every string is a word. Checked where a saved model is read."""
    for index, word in enumerate(words):
        if isinstance(word, str) and (not word or word.split() != [word]):
            return index, word
    return None


class Vocabulary:
    """A fixed word list with the four special tokens first.

    Ids: ``<pad>`` = 0, ``<start>`` = 1, ``<end>`` = 2, ``<unk>`` = 3, then words by falling
    count (ties alphabetical), so the same training captions always give the same ids.
    """

    def __init__(self, words: Sequence[str]):
        words = list(words)
        if tuple(words[:4]) != SPECIALS:
            raise VocabularyError(f"a vocabulary must start with {', '.join(SPECIALS)}")
        if len(set(words)) != len(words):
            duplicate = next(w for w, n in Counter(words).items() if n > 1)
            raise VocabularyError(f"duplicate word {duplicate!r} in vocabulary")
        self.itos: list[str] = words
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(words)}

    pad_id, start_id, end_id, unk_id = 0, 1, 2, 3

    @classmethod
    def build(cls, captions: Iterable[Sequence[str]], min_count: int = 5) -> Vocabulary:
        """Count tokens over tokenized captions (training split only) and keep frequent words.

        Args:
            captions: token lists, one per caption.
            min_count: words seen fewer times map to ``<unk>``.
        """
        counts = Counter(token for caption in captions for token in caption)
        for special in SPECIALS:
            counts.pop(special, None)
        kept = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
        return cls(list(SPECIALS) + kept)

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def encode(self, tokens: Sequence[str], max_length: int | None = None) -> list[int]:
        """``<start> w1 .. wn <end>`` as ids; tokens beyond ``max_length`` words are dropped.

        Unknown words and the special tokens' own strings (a caption holding the text ``<end>``)
        become ``<unk>``, so the ids between ``<start>`` and ``<end>`` are never pad, start or end.
        """
        if max_length is not None:
            tokens = tokens[:max_length]
        words = [self.stoi.get(t, self.unk_id) for t in tokens]
        return [self.start_id] + [max(i, self.unk_id) for i in words] + [self.end_id]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words for ids, stopping at ``<end>`` and skipping ``<start>``/``<pad>``."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.end_id:
                break
            if i in (self.start_id, self.pad_id):
                continue
            words.append(self.itos[i])
        return words

    def to_dict(self) -> dict:
        return {"words": list(self.itos)}

    @classmethod
    def from_dict(cls, data: dict) -> Vocabulary:
        if not isinstance(data, dict) or not isinstance(data.get("words"), list):
            raise VocabularyError("a vocabulary must be an object with a 'words' list")
        if not all(isinstance(w, str) for w in data["words"]):
            raise VocabularyError("vocabulary words must be strings")
        return cls(data["words"])

    def save(self, path: str | Path) -> None:
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=0)
        atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        kind = not_a_regular_file(path)
        if kind is not None:
            raise VocabularyError(f"{path}: {kind}")
        try:
            data = read_json_file(Path(path))
        except (OSError, json.JSONDecodeError) as error:
            raise VocabularyError(f"{path}: cannot read vocabulary ({error})") from None
        try:
            return cls.from_dict(data)
        except VocabularyError as error:
            raise VocabularyError(f"{path}: {error}") from None
