"""The caption tokenizers, shared by the readers, training and the Java-less evaluation path.

``TOKENIZERS`` (a registry) names them for ``data.tokenizer``: ``ptb`` (English, below),
``whitespace`` (pre-tokenised text), ``jieba`` (Chinese words, as AI Challenger and COCO-CN score
them), ``mecab`` (Japanese words, as STAIR Captions scores them) and ``characters`` (one token per
character, for languages without a segmenter).

What they drop. ``whitespace``, ``characters``, ``jieba`` and ``mecab`` normalise the text (NFKC;
jieba, which the benchmarks run on the text as written, NFC only), lower-case it and keep a token
only if it holds a letter, a number or a symbol (Unicode categories L*, N*, S*): tokens made only
of punctuation (P*: ``.``, ``...!!!``, ``?!``, ``。。。``, ``——``, ``，``, ``「」``), with any
combining marks or joiners on them, are dropped, and so is a stray combining mark. Symbols are
words: ``$``, ``+``, ``°``, ``©`` and emoji stay, and so does a token that mixes them with
punctuation (``?!$`` under ``whitespace``). ``ptb`` drops what the COCO toolkit drops, its
``PUNCTUATIONS`` list (curly quotes and dashes read as their ASCII forms, as there, and full-width
forms too, which the toolkit keeps), so that its tokens stay the toolkit's: ``!!!``, ``?!``, ``¿``
and ``。`` are kept there, as in the official output.

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

import regex
from nltk.tokenize import TreebankWordTokenizer

from captioning.registry import Registry
from captioning.utils.errors import CaptioningError
from captioning.utils.extras import extra_message


@lru_cache(maxsize=1)
def _punctuation() -> frozenset[str]:
    """Tokens the official evaluation drops after tokenizing (pycocoevalcap's list, used verbatim);
    read on first use, so that a model run by ONNX Runtime needs no pycocoevalcap."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

    return frozenset(PUNCTUATIONS)


def __getattr__(name: str) -> Any:
    if name == "PUNCTUATION":  # _punctuation(), as a name
        return _punctuation()
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
    """A tokenizer that cannot run here (its segmenter is not installed), or one of the user's that
    breaks the contract (returns no list of str, calls ``sys.exit``)."""


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


# The format characters a grapheme cluster holds: ZWNJ and ZWJ (emoji sequences such as 👩‍👩‍👧,
# Indic and Persian spellings) and the tag characters of subdivision flags (🏴 and tags). Inside a
# word they are part of it; anywhere else they join nothing.
_ZERO_WIDTH_JOINERS = "\u200c\u200d"
_CLUSTER_FORMATS = frozenset(_ZERO_WIDTH_JOINERS + "".join(map(chr, range(0xE0020, 0xE0080))))
_LOOSE_JOINERS = re.compile(r"(?<!\S)[\u200c\u200d]+|[\u200c\u200d]+(?!\S)")
_LOOSE_TAGS = re.compile(r"(?<!\S)[\U000e0020-\U000e007f]+")
_STRAY_MARKS = regex.compile(r"(?<!\S)\p{M}+")  # combining marks with no character to sit on


def _plain_text(text: str, keep_joiners: bool = False) -> str:
    """``text`` with control and format characters as spaces, whitespace runs as one space, stripped.

    With ``keep_joiners`` (the tokenizers other than ptb), the joiners and tags of
    :data:`_CLUSTER_FORMATS` stay where they sit inside a word (and go elsewhere), so that an emoji
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


def _normalized(caption: str) -> str:
    """``caption`` as ``whitespace``, ``characters`` and ``mecab`` read it: NFKC (full-width forms as
    ASCII, ``…`` as ``...``, what is typed with combining marks composed as NFC writes it), plain text
    (:func:`_plain_text`, joiners kept inside words), lower-cased (and NFC again after that)."""
    text = _plain_text(unicodedata.normalize("NFKC", caption), keep_joiners=True).lower()
    return unicodedata.normalize("NFC", text)


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
    return [token for token in tokens if token not in _punctuation()]


def _is_word(token: str) -> bool:
    """Whether the tokenizers other than ptb keep ``token``: it holds a letter, a number or a symbol
    (categories L*, N*, S*). Punctuation (P*) alone, with any combining marks (M*) or joiners on it,
    is not a word (``...!!!``, ``?!``, ``。。。``, ``——``, ``‼️``), nor is a stray mark; symbols are
    (``$``, ``+``, ``°``, emoji), and a token holding one is kept whole (``?!$``)."""
    return any(unicodedata.category(ch)[0] in "LNS" for ch in token)


def tokenize_whitespace(caption: str) -> list[str]:
    """Split pre-tokenised text (Vietnamese, segmented Chinese) at whitespace, lower-cased.

    Tokens with no letter, number or symbol (``.``, ``,``, ``。``, ``...!!!``, see :func:`_is_word`)
    are dropped, as the PTB path drops its punctuation; every other token is kept whole, punctuation
    attached to a word included, e.g. ``"Một con_chó đang chạy ."`` -> ``["một", "con_chó", "đang",
    "chạy"]``.
    """
    return [token for token in _normalized(caption).split(" ") if _is_word(token)]


# One token per grapheme cluster (a user-perceived character: a letter with its combining marks, a
# Hangul syllable, an Indic conjunct, an emoji sequence with its ZWJs, skin tone or variation
# selector, a flag), as Unicode's extended grapheme clusters (UAX #29, the regex package's \X) cut
# them; save runs of Latin-script letters and digits, which stay whole (an English or Vietnamese word,
# a number inside a Chinese caption). NFKC has already made full-width Latin letters and digits ASCII.
# The clusters follow the Unicode version of the installed regex package (an Indic conjunct such as
# "स्ते" is one cluster since Unicode 15.1, two before).
_CHARACTER_TOKENS = regex.compile(r"(?:(?=[\p{Latin}0-9])\X)+|\X")


def tokenize_characters(caption: str) -> list[str]:
    """One token per character, for languages written without spaces (Chinese, Japanese) when no
    segmenter is at hand; whitespace and punctuation characters (``，`` ``。``) are dropped.

    A character is a grapheme cluster, so that text typed with combining marks (NFD) gives the same
    tokens as precomposed text and no mark, ZWJ or skin tone becomes a token of its own: ``"👍🏽"`` and
    ``"👩‍👩‍👧"`` are one token each, ``"नमस्ते"`` is ``["न", "म", "स्ते"]``. Runs of Latin letters and
    digits stay one token: ``"两只猫在TV前，3个人。"`` -> ``["两", "只", "猫", "在", "tv", "前", "3",
    "个", "人"]``, ``"một café"`` -> ``["một", "café"]``.
    """
    clusters = _CHARACTER_TOKENS.findall(_normalized(caption))
    # A cluster is whitespace, or (after a prepended character such as Malayalam's dot reph) ends in
    # it; a joiner ending a cluster joins it to nothing (the next cluster is another character).
    tokens = (part.rstrip(_ZERO_WIDTH_JOINERS) for cluster in clusters for part in cluster.split())
    return [token for token in tokens if _is_word(token)]


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
        raise TokenizerError(extra_message(extra, f"data.tokenizer={tokenizer}", [module])) from error


@TOKENIZERS.register("jieba")
def tokenize_jieba(caption: str) -> list[str]:
    """Chinese words as the AI Challenger evaluator (also used for COCO-CN) scores them: jieba's
    precise mode on the stripped caption with ``。`` removed (``jieba.cut(caption.strip().replace("。",
    ""), cut_all=False)``, on the NFC text with control characters as spaces), then what the COCO
    toolkit's PTB tokenizer, which the evaluator runs on those words, does to them: lower-cased, and
    the tokens of its ``PUNCTUATIONS`` list (``...``, ``!``, ``?``, ``,``, dashes) and whitespace left
    out. Full-width punctuation (``，``, ``！``, ``、``) stays, as it stays in the evaluator's scores:
    this tokenizer follows the benchmark, not the punctuation rule of the others.
    """
    jieba = _needs("jieba", "zh", "jieba")
    jieba.setLogLevel(60)  # no "Building prefix dict" lines on stderr
    text = _plain_text(unicodedata.normalize("NFC", caption), keep_joiners=True)
    words = (word.strip().lower() for word in jieba.cut(text.strip().replace("。", ""), cut_all=False))
    # a piece holding only joiners or marks (jieba splits emoji sequences) is no word to score
    visible = (w for w in words if any(unicodedata.category(ch)[0] in "LNSP" for ch in w))
    return [word for word in visible if word not in _punctuation()]


@functools.cache
def _mecab_tagger() -> Any:
    fugashi = _needs("fugashi", "ja", "mecab")
    _needs("unidic_lite", "ja", "mecab")
    return fugashi.Tagger()


@TOKENIZERS.register("mecab")
def tokenize_mecab(caption: str) -> list[str]:
    """Japanese words as STAIR Captions scores them: MeCab's segmentation (fugashi with the
    unidic-lite dictionary) of the NFKC text, the surface form of each word, lower-cased; whitespace
    and the words with no letter, number or symbol (punctuation, :func:`_is_word`) left out."""
    text = _plain_text(unicodedata.normalize("NFKC", caption), keep_joiners=True)
    words = [word.surface for word in _mecab_tagger()(text)]
    return [unicodedata.normalize("NFC", word.lower()) for word in words if _is_word(word)]


# The version of each built-in tokenizer's own rules, named in the scores' signature: bump it whenever
# the tokens of some caption change, so that scores computed on the old tokens are never compared
# with new ones unawares. The first version is written without a number (``tok:ptb``); ptb (``python``
# in signatures, its Python copy) follows the COCO toolkit and is still at its first.
# 2: grapheme clusters for characters; NFC text for jieba; joiners kept inside words; jieba and mecab
# lower-case too; all four drop the tokens with no letter, number or symbol (punctuation alone).
TOKENIZER_VERSIONS: dict[str, int] = {"whitespace": 2, "characters": 2, "jieba": 2, "mecab": 2}


def tokenizer_version(name: str) -> str:
    """``name`` with the version of its rules and of the segmenter behind it, for a scores signature:
    ``characters.v2``, ``jieba.v2-0.42.1``, ``mecab.v2-fugashi-1.5.2.unidic-lite-1.0.8``; ``ptb``,
    ``python`` and tokenizers of your own as they are."""
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "missing"

    rules = TOKENIZER_VERSIONS.get(name, 1)
    versioned = name if rules == 1 else f"{name}.v{rules}"
    if name == "jieba":
        return f"{versioned}-{of('jieba')}"
    if name == "mecab":
        return f"{versioned}-fugashi-{of('fugashi')}.unidic-lite-{of('unidic-lite')}"
    return versioned


def tokenizer_for(name: str) -> Callable[[str], list[str]]:
    """The tokenizer ``data.tokenizer`` names (registered in :data:`TOKENIZERS`); one registered by a
    module of the user's is wrapped in :class:`CheckedTokenizer`.

    Raises:
        UnknownNameError: an unknown name, listing the registered ones.
    """
    function = TOKENIZERS[name]
    if getattr(function, "__module__", None) == __name__:  # the built-in ones return lists of str
        return function
    return CheckedTokenizer(name, function)


class CheckedTokenizer:
    """A tokenizer of the user's, held to the contract: a caption in, a list of str out. What breaks it
    (ints or bytes returned, a ``sys.exit()`` inside) is one line naming the tokenizer, where it would
    be a traceback far from it or, for ``SystemExit(0)``, a run that ends with status 0 having done
    nothing. An exception it raises keeps its traceback (a bug in the user's code)."""

    def __init__(self, name: str, function: Callable[[str], list[str]]) -> None:
        self.name, self.function = name, function

    def __call__(self, caption: str) -> list[str]:
        try:
            tokens = self.function(caption)
        except SystemExit as stop:
            raise TokenizerError(
                f"data.tokenizer {self.name!r}: called sys.exit({stop.code!r}) on caption {caption!r:.60}; "
                "a tokenizer returns a list of str"
            ) from None
        if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
            found = (
                type(tokens).__name__
                if not isinstance(tokens, list)
                else "a list holding " + type(next(t for t in tokens if not isinstance(t, str))).__name__
            )
            raise TokenizerError(
                f"data.tokenizer {self.name!r}: returned {found} for caption {caption!r:.60}; a tokenizer "
                "returns a list of str"
            )
        return tokens


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
