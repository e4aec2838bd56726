"""The one caption tokenizer, shared by training and by the Java-less evaluation path.

It follows what the COCO caption evaluation does: the Stanford PTB tokenizer with lower-casing,
then removal of punctuation tokens. NLTK's Treebank tokenizer applies the same Penn Treebank
rules (contractions split as ``do n't``, possessive ``'s`` split off, hyphenated words kept
whole), so on ordinary captions both give the same tokens.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from nltk.tokenize import TreebankWordTokenizer

# Tokens pycocoevalcap's PTBTokenizer drops after tokenizing (its PUNCTUATIONS list), plus the
# Treebank forms NLTK gives for the same characters.
PUNCTUATION = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--",
     "...", ";", "(", ")", "[", "]", "{", "}", '"', "-lrb-", "-rrb-", "-lcb-", "-rcb-"]
)

_WHITESPACE = re.compile(r"\s+")


@lru_cache(maxsize=1)
def _treebank() -> TreebankWordTokenizer:
    return TreebankWordTokenizer()


def tokenize(caption: str) -> list[str]:
    """Split a raw caption into lower-case word tokens with punctuation removed.

    Args:
        caption: any Unicode text; control characters and odd whitespace are tolerated.
    Returns:
        The tokens, e.g. ``"A dog's ball, isn't it?"`` -> ``["a", "dog", "'s", "ball", "is", "n't", "it"]``.
        Empty for text with no words.
    """
    text = unicodedata.normalize("NFKC", caption)
    text = "".join(" " if unicodedata.category(ch).startswith("C") else ch for ch in text)
    text = _WHITESPACE.sub(" ", text).strip().lower()
    if not text:
        return []
    tokens = _treebank().tokenize(text)
    return [token for token in tokens if token not in PUNCTUATION and token.strip()]


def detokenize(tokens: list[str]) -> str:
    """Join tokens into the caption string written to results files (space separated)."""
    return " ".join(tokens)
