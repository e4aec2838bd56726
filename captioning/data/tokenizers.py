"""The caption tokenizers, shared by the readers, training and the Java-less evaluation path.

``TOKENIZERS`` (a registry) names them for ``data.tokenizer``: ``ptb`` (English, below),
``whitespace`` (pre-tokenised text), ``jieba`` (Chinese words, as AI Challenger and COCO-CN score
them), ``mecab`` (Japanese words, as STAIR Captions scores them) and ``characters`` (one token per
character, for languages without a segmenter).

The PTB tokenizer reproduces what the COCO caption evaluation does (pycocoevalcap's ``PTBTokenizer``: the
Stanford PTB tokenizer with ``-lowerCase``, then removal of its ``PUNCTUATIONS`` tokens) in pure
Python. NLTK's Treebank tokenizer applies the same Penn Treebank rules (contractions split as
``do n't``, possessive ``'s`` split off, hyphenated words kept whole); a few pre-passes add the
Stanford behaviour it lacks, so ordinary captions get the same tokens as the official toolkit:

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

import functools
import importlib
import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache
from typing import Any, ClassVar

from nltk.tokenize import TreebankWordTokenizer
from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

from captioning.registry import Registry
from captioning.utils.errors import CaptioningError

# Tokens the official evaluation drops after tokenizing (pycocoevalcap's list, used verbatim).
PUNCTUATION = frozenset(PUNCTUATIONS)

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

_WHITESPACE = re.compile(r"\s+")
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


_LONE_SURROGATES = re.compile("[\ud800-\udfff]")


class TokenizerError(CaptioningError, ValueError):
    """A tokenizer that cannot run here (its segmenter is not installed)."""


def replace_lone_surrogates(text: str) -> str:
    """``text`` with lone surrogates (from JSON escapes such as ``"\\ud800"``) replaced by U+FFFD.

    They are not characters: UTF-8 cannot encode them, so any file or Java process they reached
    would fail. A Python ``str`` never holds a valid surrogate pair (JSON's pairs decode to one
    character), so every surrogate code point in one is lone.
    """
    return _LONE_SURROGATES.sub("\ufffd", text)


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


def _plain_text(text: str) -> str:
    """``text`` with control and format characters as spaces, whitespace runs as one space, stripped."""
    if not text.isprintable():
        text = "".join(" " if unicodedata.category(ch).startswith("C") else ch for ch in text)
    return _WHITESPACE.sub(" ", text).strip()


def tokenize(caption: str) -> list[str]:
    """Split a raw caption into lower-case word tokens with punctuation removed.

    Args:
        caption: any Unicode text; control characters and odd whitespace are tolerated.
    Returns:
        The tokens, e.g. ``"A dog's ball (red), isn't it?"`` ->
        ``["a", "dog", "'s", "ball", "-lrb-", "red", "-rrb-", "is", "n't", "it"]``.
        Empty for text with no words.
    """
    text = _plain_text(unicodedata.normalize("NFKC", caption).translate(_TYPOGRAPHIC))
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
    return [token for token in tokens if token not in PUNCTUATION]


def _is_punctuation(token: str) -> bool:
    return all(unicodedata.category(ch).startswith("P") for ch in token)


def tokenize_whitespace(caption: str) -> list[str]:
    """Split pre-tokenised text (Vietnamese, segmented Chinese) at whitespace, lower-cased.

    Tokens made of punctuation only (``.``, ``,``, ``。``) are dropped, as the PTB path drops its
    punctuation; every other token is kept whole, e.g. ``"Một con_chó đang chạy ."`` ->
    ``["một", "con_chó", "đang", "chạy"]``.
    """
    text = _plain_text(unicodedata.normalize("NFKC", caption)).lower()
    return [token for token in text.split(" ") if token and not _is_punctuation(token)]


# One token per character, save runs of Latin letters and digits (an English word or a number inside
# a Chinese caption stays whole). NFKC has already made full-width Latin letters and digits ASCII.
_CHARACTER_TOKENS = re.compile(r"[0-9a-z\u00c0-\u024f]+|\S")


def tokenize_characters(caption: str) -> list[str]:
    """One token per character, for languages written without spaces (Chinese, Japanese) when no
    segmenter is at hand; whitespace and punctuation characters (``，`` ``。``) are dropped.

    Runs of Latin letters and digits stay one token: ``"两只猫在TV前，3个人。"`` ->
    ``["两", "只", "猫", "在", "tv", "前", "3", "个", "人"]``.
    """
    text = _plain_text(unicodedata.normalize("NFKC", caption)).lower()
    return [token for token in _CHARACTER_TOKENS.findall(text) if not _is_punctuation(token)]


# data.tokenizer -> the function that splits a caption into the tokens the vocabulary, training targets
# and BLEU/CIDEr-D use. Only ptb is English's: METEOR and SPICE are computed with it alone. A module of
# your own registers another with @TOKENIZERS.register("name") and --import.
TOKENIZERS: Registry[Callable[[str], list[str]]] = Registry("tokenizer", "data.tokenizer")
TOKENIZERS.add("ptb", tokenize)
TOKENIZERS.add("whitespace", tokenize_whitespace)
TOKENIZERS.add("characters", tokenize_characters)


def _needs(module: str, extra: str, tokenizer: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise TokenizerError(
            f'data.tokenizer={tokenizer} needs the {module} package: pip install -e ".[{extra}]"'
        ) from error


@TOKENIZERS.register("jieba")
def tokenize_jieba(caption: str) -> list[str]:
    """Chinese words as the AI Challenger evaluator (also used for COCO-CN) segments them: jieba's
    precise mode on the stripped caption with ``。`` removed (``jieba.cut(caption.strip().replace("。",
    ""), cut_all=False)``), whitespace tokens left out."""
    jieba = _needs("jieba", "zh", "jieba")
    jieba.setLogLevel(60)  # no "Building prefix dict" lines on stderr
    return [word for word in jieba.cut(caption.strip().replace("。", ""), cut_all=False) if word.strip()]


@functools.cache
def _mecab_tagger() -> Any:
    fugashi = _needs("fugashi", "ja", "mecab")
    _needs("unidic_lite", "ja", "mecab")
    return fugashi.Tagger()


@TOKENIZERS.register("mecab")
def tokenize_mecab(caption: str) -> list[str]:
    """Japanese words as STAIR Captions scores them: MeCab's segmentation (fugashi with the
    unidic-lite dictionary), the surface form of each word, whitespace and punctuation-only words
    left out."""
    words = [word.surface for word in _mecab_tagger()(_plain_text(unicodedata.normalize("NFKC", caption)))]
    return [word for word in words if word.strip() and not _is_punctuation(word)]


def tokenizer_version(name: str) -> str:
    """``name`` with the version of the segmenter behind it, for a scores signature:
    ``jieba-0.42.1``, ``mecab-fugashi-1.5.2.unidic-lite-1.0.8``; other names as they are."""
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "missing"

    if name == "jieba":
        return f"jieba-{of('jieba')}"
    if name == "mecab":
        return f"mecab-fugashi-{of('fugashi')}.unidic-lite-{of('unidic-lite')}"
    return name


def tokenizer_for(name: str) -> Callable[[str], list[str]]:
    """The tokenizer ``data.tokenizer`` names (registered in :data:`TOKENIZERS`).

    Raises:
        UnknownNameError: an unknown name, listing the registered ones.
    """
    return TOKENIZERS[name]


# Tokenizers whose words a benchmark's results files join without spaces (Chinese and Japanese
# words, as AI Challenger, COCO-CN and STAIR Captions write them); the others join with spaces.
JOINED_WITHOUT_SPACES = frozenset({"jieba", "mecab"})


def detokenize(tokens: list[str], tokenizer: str = "ptb") -> str:
    """Join tokens into the caption string written to results files.

    Space separated, so that every tokenizer gives back the tokens the model produced; Chinese and
    Japanese words (``jieba``, ``mecab``) joined without spaces, as their benchmarks write captions,
    and scored as those benchmarks score them: segmented again by the same tokenizer.
    """
    return ("" if tokenizer in JOINED_WITHOUT_SPACES else " ").join(tokens)
