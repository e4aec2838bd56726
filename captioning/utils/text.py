"""Text read from files, shown to a person: ``printable`` writes what would be invisible, garble a
terminal or break a line as escapes."""

from __future__ import annotations

import unicodedata

_UNPRINTABLE = frozenset({"Cc", "Cs", "Zl", "Zp"})


def printable(text: str) -> str:
    """``text`` with control characters, line separators and lone surrogates written as Python escapes
    (``\\x00``, ``\\x1b``, ``\\ud800``): a path read from a data file or a word of a model's vocabulary
    may hold any of them, and shown raw they would be invisible, garble the terminal, cut a one-line
    message in two, or fail to encode at all."""
    return "".join(
        character.encode("unicode_escape").decode("ascii")
        if unicodedata.category(character) in _UNPRINTABLE
        else character
        for character in text
    )
