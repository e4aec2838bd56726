"""The one caption tokenizer, shared by training and by the Java-less evaluation path.

It reproduces what the COCO caption evaluation does (pycocoevalcap's ``PTBTokenizer``: the
Stanford PTB tokenizer with ``-lowerCase``, then removal of its ``PUNCTUATIONS`` tokens) in pure
Python. NLTK's Treebank tokenizer applies the same Penn Treebank rules (contractions split as
``do n't``, possessive ``'s`` split off, hyphenated words kept whole); a few pre-passes add the
Stanford behaviour it lacks, so ordinary captions get the same tokens as the official toolkit:

- brackets become ``-lrb-``, ``-rrb-``, ``-lsb-``, ... and are kept, as in the official output
  (the official punctuation list holds only the upper-case forms, which lower-casing never leaves);
- single quotes used as quotation marks (``'no'``) are split off and dropped;
- curly quotes and dashes count as their ASCII forms;
- runs of ``!`` / ``?`` stay one token (``!!!`` is kept, a single ``!`` dropped);
- a sentence-final abbreviation keeps its period (``etc.``, ``u.s.``, ``mr.``) while a period
  ending a sentence in mid-caption is split off (``runs. it`` -> ``runs it``);
- all-capital ``&`` abbreviations stay whole (``AT&T`` -> ``at&t``).
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import ClassVar

from nltk.tokenize import TreebankWordTokenizer
from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

# Tokens the official evaluation drops after tokenizing (pycocoevalcap's list, used verbatim).
PUNCTUATION = frozenset(PUNCTUATIONS)

# Words the Stanford tokenizer treats as abbreviations, keeping their period at a sentence end.
ABBREVIATIONS = frozenset([
    "mr", "mrs", "ms", "dr", "prof", "gen", "capt", "sgt", "lt", "st", "jr", "sr", "bros", "inc", "co", "corp",
    "ltd", "etc", "al", "vs", "ave", "mt", "ft", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept",
    "oct", "nov", "dec", "mon", "tue", "wed", "thu", "fri", "calif", "dept", "gov", "sq",
])

_WHITESPACE = re.compile(r"\s+")
_TYPOGRAPHIC = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
                              "\u2013": " -- ", "\u2014": " -- "})
# A private-use character cannot survive the control-character clean-up, so it is a safe stand-in.
_AMPERSAND = "\ue000"
_CAPITAL_AMPERSAND = re.compile(r"(?<![A-Za-z])([A-Z]+)&(?=[A-Z]+(?![A-Za-z]))")
# An opening single quote: at a word start, before a letter, and not an elided word ('em, 'til).
_OPENING_QUOTE = re.compile(
    r"(?<![^\s(\[{\"`])'(?=[^\W\d_])(?!(?:em|til|cause|tis|twas|s|re|ll|ve|d|m)\b|n')", re.IGNORECASE
)
# A period ending a chunk of non-space text (anchored at chunk starts to stay linear in time).
_MID_PERIOD = re.compile(r"(?<!\S)(\S+)\.(?=\s+[^\W\d_])")
_FINAL_PERIOD = re.compile(r"(?<!\S)(\S+)\.[)\]}\"'`]*$")
_DOTTED = re.compile(r"[^\W\d_](?:\.[^\W\d_])*")


def _is_abbreviation(chunk: str) -> bool:
    """Whether ``chunk`` (the text before a period) is an abbreviation: ``mr``, ``e.g``, ``b``."""
    word = chunk.lstrip("([{\"'`")
    return word.lower() in ABBREVIATIONS or "." in word or _DOTTED.fullmatch(word) is not None


def _split_sentence_period(match: re.Match[str]) -> str:
    chunk = match.group(1)
    return match.group(0) if _is_abbreviation(chunk) else f"{chunk} ."


class _CaptionTreebankTokenizer(TreebankWordTokenizer):
    """Treebank rules with the Stanford tokenizer's handling of ``!!!`` runs."""

    PUNCTUATION: ClassVar[list] = [
        (re.compile(r"[?!]+"), r" \g<0> ") if regexp.pattern == "[?!]" else (regexp, substitution)
        for regexp, substitution in TreebankWordTokenizer.PUNCTUATION
    ]


@lru_cache(maxsize=1)
def _treebank() -> TreebankWordTokenizer:
    return _CaptionTreebankTokenizer()


def tokenize(caption: str) -> list[str]:
    """Split a raw caption into lower-case word tokens with punctuation removed.

    Args:
        caption: any Unicode text; control characters and odd whitespace are tolerated.
    Returns:
        The tokens, e.g. ``"A dog's ball (red), isn't it?"`` ->
        ``["a", "dog", "'s", "ball", "-lrb-", "red", "-rrb-", "is", "n't", "it"]``.
        Empty for text with no words.
    """
    text = unicodedata.normalize("NFKC", caption).translate(_TYPOGRAPHIC)
    if not text.isprintable():  # control and format characters count as spaces
        text = "".join(" " if unicodedata.category(ch).startswith("C") else ch for ch in text)
    text = _WHITESPACE.sub(" ", text).strip()
    if not text:
        return []
    text = _CAPITAL_AMPERSAND.sub(rf"\1{_AMPERSAND}", text)
    text = _OPENING_QUOTE.sub("' ", text)
    text = _MID_PERIOD.sub(_split_sentence_period, text)
    final = _FINAL_PERIOD.search(text)
    if final is not None and _is_abbreviation(final.group(1)):
        text += " ."  # the Treebank rules split the last period: let it be this one
    tokens = _treebank().tokenize(text.lower(), convert_parentheses=True)
    tokens = [token.lower().replace(_AMPERSAND, "&") for token in tokens]  # -LRB- -> -lrb-
    return [token for token in tokens if token not in PUNCTUATION]


def detokenize(tokens: list[str]) -> str:
    """Join tokens into the caption string written to results files (space separated)."""
    return " ".join(tokens)
