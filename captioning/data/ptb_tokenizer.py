"""The PTB tokenizer, ``data.tokenizer`` ``ptb`` (English's; ``tokenize``, registered in ``TOKENIZERS``
by ``captioning.data.tokenizers``).

It reproduces what the COCO caption evaluation does (pycocoevalcap's ``PTBTokenizer``: the Stanford
PTB tokenizer with ``-lowerCase``, then removal of its ``PUNCTUATIONS`` tokens) in pure Python.
NLTK's Treebank tokenizer applies the same Penn Treebank rules (contractions split as ``do n't``,
possessive ``'s`` split off, hyphenated words kept whole); a few pre-passes add the Stanford
behaviour it lacks, so ordinary captions get the same tokens as the official toolkit:

- what the Stanford lexer always emits as ONE token stays one (``_ATOMS``): SGML-like tags such as
  the vocabulary's ``<unk>``, ``<end>``, ``<pad>``, ``<start>``; ``'n'`` (``rock 'n' roll``);
  ``pro-`` / ``anti-``; ``c++``; URLs;
- brackets become ``-lrb-``, ``-rrb-``, ``-lsb-``, ... and are kept, as in the official output
  (the official punctuation list holds only the upper-case forms, which lower-casing never leaves);
- single quotes used as quotation marks (``'no'``) are split off and dropped;
- curly quotes and dashes count as their ASCII forms;
- runs of ``!`` / ``?`` stay one token (``!!!`` is kept, a single ``!`` dropped);
- a period ending a word is split off, in mid-caption (``runs. it`` -> ``runs it``) and inside
  quotes or brackets (``"Stop."`` -> ``stop``) too, while an abbreviation keeps it (``etc.``,
  ``u.s.``, ``mr.``); ``..`` is two periods, since only 3 to 5 dots make an ellipsis;
- a hyphen or slash at a word's edge is split off (``player-`` -> ``player -``, ``w/`` -> ``w /``),
  while one between letters or digits stays (``t-shirt``, ``w/o``), as does a minus sign (``-5``);
- ``+ = ~ ^ |`` and ``*`` runs are tokens of their own (``a+b`` -> ``a + b``), but a ``+`` before
  a digit is a sign (``5+5`` -> ``5 +5``) and all-capital ``&`` / ``+`` abbreviations stay whole
  (``AT&T`` -> ``at&t``, ``A+B`` -> ``a+b``).
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any, ClassVar

from nltk.tokenize import TreebankWordTokenizer

from captioning.data.caption_text import plain_text


@lru_cache(maxsize=1)
def punctuation() -> frozenset[str]:
    """Tokens the official evaluation drops after tokenizing (pycocoevalcap's list, used verbatim);
    read on first use, so that a model run by ONNX Runtime needs no pycocoevalcap."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

    return frozenset(PUNCTUATIONS)


def __getattr__(name: str) -> Any:
    if name == "PUNCTUATION":  # punctuation(), as a name
        return punctuation()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Words the Stanford tokenizer treats as abbreviations, keeping their period at a sentence end.
ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "gen",
        "capt",
        "sgt",
        "lt",
        "st",
        "jr",
        "sr",
        "bros",
        "inc",
        "co",
        "corp",
        "ltd",
        "etc",
        "al",
        "vs",
        "ave",
        "mt",
        "ft",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "mon",
        "tue",
        "wed",
        "thu",
        "fri",
        "calif",
        "dept",
        "gov",
        "sq",
        "ph.d",
        "ed.d",
    ]
)

_TYPOGRAPHIC = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": " -- ", "\u2014": " -- "}
)
# Private-use characters cannot survive the control-character clean-up, so they are safe stand-ins.
_AMPERSAND = "\ue000"
_PLUS = "\ue001"
_ATOM = "\ue002"
# Strings the Stanford lexer has a rule of their own for, so it always emits each as ONE token, where
# the Treebank rules (or the splitting rules below) would cut it (NLTK makes ``<unk>`` ``< unk >``) or
# leave it glued to a neighbour (``rock'n'roll`` -> ``rock 'n' roll``). They are set aside as stand-ins
# padded with spaces and put back after tokenizing.
_ATOMS = re.compile(
    # SGML-like tags, such as the vocabulary's <unk>, <end>, <pad>, <start>, which a model emits. Java
    # also takes a tag holding spaces, as non-breaking spaces; here a token never holds a space.
    r"</?[A-Za-z!?][^<>\s]*>"
    r"|(?<![\w.])(?<!\w-)https?://[^\s\"<>|()]+"  # URLs starting a token (_set_aside_atoms trims them)
    r"|-(?:lrb|rrb|lsb|rsb|lcb|rcb)-"  # escaped brackets: our own output must tokenize the same again
    r"|(?<![^\W\d_])(?:pro|anti)-(?![\w-])"  # "pro- and anti-war": hyphen-final words kept whole
    r"|(?<![\w+])c\+\+(?![\w+])"  # the language, while "g++" -> "g + +"
    r"|'n'|'n(?=\s|$)",  # "rock 'n' roll", "fish 'n chips"; but "'nice" is a quote and a word
    re.IGNORECASE,
)
_URL_END = ".!?{},-"  # characters a URL does not end with
_CAPITAL_JOINED = re.compile(r"(?<![A-Za-z])([A-Z]+)([&+])(?=[A-Z]+(?![A-Za-z]))")
_JOINERS = {"&": _AMPERSAND, "+": _PLUS}
# Symbols the Stanford lexer always makes tokens of their own, where the Treebank rules leave them
# inside words: "a+b" -> "a + b", "a=b" -> "a = b", "a**b" -> "a ** b". A "+" before a digit is the
# number's sign instead: "a+5" -> "a +5".
_SYMBOLS = re.compile(r"\*+|[=~^|]|\+(?!\d)")
_SIGN = re.compile(r"(?<=\S)\+(?=\d)")
# A hyphen or slash belongs to a word only as ONE character between letters or digits (t-shirt, 9-11,
# w/o, 1/2); anywhere else the Stanford lexer makes it a token: "player-" -> "player -", "-player" ->
# "- player", "w/" -> "w /", "a//b" -> "a / / b", "a--b" -> "a -- b". A lone hyphen starting a number
# is its minus sign ("-5").
_EDGE_SLASH = re.compile(r"(?<![^\W_])/|/(?![^\W_])")
_HYPHEN_RUN = re.compile(r"-+")
# Dot runs: the Stanford lexer takes 3 to 5 dots as an ellipsis and the rest as periods ("..", the
# sixth of "......"), all of them punctuation; a word before keeps its own dot only if it is an
# abbreviation ("etc..." -> "etc." and punctuation). A period starting a word is a token too (".a").
_PERIOD_RUN = re.compile(r"\.{2,}")
_LEADING_PERIOD = re.compile(r"(?<![\w.])\.(?=[^\W\d_])")
# An opening single quote: at a word start, before a letter, and not an elided word ('em, 'til).
_OPENING_QUOTE = re.compile(
    r"(?<![^\s(\[{\"`])'(?=[^\W\d_])(?!(?:em|til|cause|tis|twas|s|re|ll|ve|d|m)\b|n')", re.IGNORECASE
)
# A period ending a word is a token of its own to the Stanford lexer whatever follows it (a space, a
# closing quote or bracket, "!", "'s"), save ",;:" ("dog., cat" keeps "dog.") and what makes it part
# of a longer token ("3.5", "u.s.", "...", "u.s.-led"). The chunk runs from a space to the period;
# anchoring the match at chunk starts keeps it linear in time.
_MID_PERIOD = re.compile(r"(?<!\S)(\S*?[^.\s])\.(?![\w.,;:]|-[^\W_])")
_FINAL_PERIOD = re.compile(r"(?<!\S)(\S+)\.[)\]}\"'`]*$")
_WORD_END = re.compile(r"[\w.'/]*")  # matched on the reversed chunk, which keeps it linear in time
_DOTTED = re.compile(r"[^\W\d_](?:\.[^\W\d_])*")


def _is_abbreviation(chunk: str) -> bool:
    """Whether ``chunk`` (the text before a period) is an abbreviation: ``mr``, ``e.g``, ``b``.

    Only letters between the dots make an acronym: ``3.5.`` ends a sentence after ``3.5``.
    """
    # Its last word: "u.s" in ",u.s" or "anti-u.s", "etc" in "(etc", but "don't" (not "t") in "don't".
    match = _WORD_END.match(chunk[::-1])
    word = (match.group() if match else "")[::-1].lstrip("'")
    return word.lower() in ABBREVIATIONS or _DOTTED.fullmatch(word) is not None


def _set_aside_atoms(text: str) -> tuple[str, list[str]]:
    """Replace each ``_ATOMS`` match by a stand-in token; return the text and the matches, lower-cased."""
    atoms = []

    def set_aside(match: re.Match[str]) -> str:
        atom, tail = match.group(), ""
        if atom[0] in "hH":  # a URL ends, as in the Stanford lexer, before the sentence's punctuation
            url = atom.rstrip(_URL_END)
            if len(url) < atom.index("//") + 4:  # it needs 2 characters after the "//"
                return atom
            atom, tail = url, atom[len(url) :]
        atoms.append(atom.lower())  # Java lower-cases them like any token
        return f" {_ATOM} {tail}"

    return _ATOMS.sub(set_aside, text), atoms


def _split_edge_hyphens(match: re.Match[str]) -> str:
    run, text, start, end = match.group(), match.string, match.start(), match.end()
    # Like the Stanford lexer's hyphenated words, the part before may end in "." or "," ("u.s.-led").
    joined_before = start > 0 and (
        text[start - 1].isalnum() or (text[start - 1] in ".," and start > 1 and text[start - 2].isalnum())
    )
    joined_after = end < len(text) and text[end].isalnum()
    if run == "-" and joined_before and joined_after:
        return run
    if run == "-" and not joined_before and joined_after and text[end].isdigit():
        return " -"  # a signed number: "-5", "x -5-" -> "x -5 -"
    return f" {run} "


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
    """Split a raw caption into lower-case word tokens with the COCO toolkit's punctuation removed.

    Only the tokens of pycocoevalcap's ``PUNCTUATIONS`` list go (``.`` ``,`` ``?`` ``!`` ``:`` ``;``
    ``-`` ``--`` ``...`` and quotes; curly quotes, dashes and, here, full-width forms count as their
    ASCII forms), as in the official evaluation: ``!!!``, ``?!``, ``¿`` or ``。`` are kept, as there.

    Args:
        caption: any Unicode text; control characters and odd whitespace are tolerated.
    Returns:
        The tokens, e.g. ``"A dog's ball (red), isn't it?"`` ->
        ``["a", "dog", "'s", "ball", "-lrb-", "red", "-rrb-", "is", "n't", "it"]``.
        Empty for text with no words.
    """
    text = plain_text(unicodedata.normalize("NFKC", caption).translate(_TYPOGRAPHIC))
    if not text:
        return []
    text, atoms = _set_aside_atoms(text)
    text = _CAPITAL_JOINED.sub(lambda m: m.group(1) + _JOINERS[m.group(2)], text)
    text = _SYMBOLS.sub(r" \g<0> ", text)
    text = _SIGN.sub(" +", text)
    text = _EDGE_SLASH.sub(" / ", text)
    text = _HYPHEN_RUN.sub(_split_edge_hyphens, text)
    text = _OPENING_QUOTE.sub("' ", text)
    text = _PERIOD_RUN.sub(". ... ", text)  # the word's own period (kept by an abbreviation), then "..."
    text = _LEADING_PERIOD.sub(". ", text)
    text = _MID_PERIOD.sub(_split_sentence_period, text)
    final = _FINAL_PERIOD.search(text)
    if final is not None and _is_abbreviation(final.group(1)):
        text += " ."  # the Treebank rules split the last period: let it be this one
    tokens = _treebank().tokenize(text.lower(), convert_parentheses=True)
    tokens = [
        token.lower().replace(_AMPERSAND, "&").replace(_PLUS, "+") for token in tokens
    ]  # -LRB- -> -lrb-
    if atoms:  # each stand-in, padded with spaces, came out as a token of its own, in order
        remaining = iter(atoms)
        tokens = [next(remaining) if token == _ATOM else token for token in tokens]
    return [token for token in tokens if token not in punctuation()]
