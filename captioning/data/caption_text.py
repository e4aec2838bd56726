"""A caption's text made plain before a tokenizer splits it: control and format characters as
spaces, whitespace runs as one space, and (for the tokenizers other than ptb) the joiners and marks
that hold a grapheme cluster together kept where they sit inside a word; lone surrogates replaced."""

from __future__ import annotations

import re
import unicodedata

import regex

_WHITESPACE = re.compile(r"\s+")
_LONE_SURROGATES = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(text: str) -> str:
    """``text`` with lone surrogates (from JSON escapes such as ``"\\ud800"``) replaced by U+FFFD.

    They are not characters: UTF-8 cannot encode them, so any file or Java process they reached
    would fail. A Python ``str`` never holds a valid surrogate pair (JSON's pairs decode to one
    character), so every surrogate code point in one is lone.
    """
    return _LONE_SURROGATES.sub("\ufffd", text)


# The format characters a grapheme cluster holds: ZWNJ and ZWJ (emoji sequences such as 👩‍👩‍👧,
# Indic and Persian spellings) and the tag characters of subdivision flags (🏴 and tags). Inside a
# word they are part of it; anywhere else they join nothing.
ZERO_WIDTH_JOINERS = "\u200c\u200d"
_CLUSTER_FORMATS = frozenset(ZERO_WIDTH_JOINERS + "".join(map(chr, range(0xE0020, 0xE0080))))
_LOOSE_JOINERS = re.compile(r"(?<!\S)[\u200c\u200d]+|[\u200c\u200d]+(?!\S)")
_LOOSE_TAGS = re.compile(r"(?<!\S)[\U000e0020-\U000e007f]+")
_STRAY_MARKS = regex.compile(r"(?<!\S)\p{M}+")  # combining marks with no character to sit on


def plain_text(text: str, keep_joiners: bool = False) -> str:
    """``text`` with control and format characters as spaces, whitespace runs as one space, stripped.

    With ``keep_joiners`` (the tokenizers other than ptb), the joiners and tags of
    ``_CLUSTER_FORMATS`` stay where they sit inside a word (and go elsewhere), so that an emoji
    sequence or a word spelt with a ZWNJ stays whole, and combining marks that start a word, with
    nothing to sit on, go.
    """
    if not text.isprintable():
        kept = _CLUSTER_FORMATS if keep_joiners else frozenset()
        text = "".join(
            " " if unicodedata.category(ch).startswith("C") and ch not in kept else ch for ch in text
        )
        if keep_joiners:
            text = _LOOSE_TAGS.sub("", _LOOSE_JOINERS.sub("", text))
    if keep_joiners:
        text = _STRAY_MARKS.sub("", text)
    return _WHITESPACE.sub(" ", text).strip()
