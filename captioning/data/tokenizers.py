"""The caption tokenizers, shared by the readers, training and the Java-less evaluation path.

``TOKENIZERS`` (a registry) names them for ``data.tokenizer``: ``ptb`` (English, the COCO toolkit's
rules: ``captioning.data.ptb_tokenizer``), ``whitespace`` (pre-tokenised text), ``jieba`` (Chinese
words, as AI Challenger and COCO-CN score them), ``mecab`` (Japanese words, as STAIR Captions scores
them) and ``characters`` (one token per character, for languages without a segmenter). Each first
makes the caption's text plain (``captioning.data.caption_text``).

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
"""

from __future__ import annotations

import functools
import importlib
import unicodedata
from collections.abc import Callable
from typing import Any

import regex

from captioning.data.caption_text import ZERO_WIDTH_JOINERS, plain_text
from captioning.data.ptb_tokenizer import punctuation, tokenize
from captioning.registry import Registry
from captioning.utils.errors import CaptioningError
from captioning.utils.extras import extra_message


def __getattr__(name: str) -> Any:
    if name == "PUNCTUATION":  # the COCO toolkit's punctuation list (ptb_tokenizer.PUNCTUATION)
        return punctuation()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TokenizerError(CaptioningError, ValueError):
    """A tokenizer that cannot run here (its segmenter is not installed), or one of the user's that
    breaks the contract (returns no list of str, calls ``sys.exit``)."""


def _normalized(caption: str) -> str:
    """``caption`` as ``whitespace``, ``characters`` and ``mecab`` read it: NFKC (full-width forms as
    ASCII, ``…`` as ``...``, what is typed with combining marks composed as NFC writes it), plain text
    (``caption_text.plain_text``, joiners kept inside words), lower-cased (and NFC again after that)."""
    text = plain_text(unicodedata.normalize("NFKC", caption), keep_joiners=True).lower()
    return unicodedata.normalize("NFC", text)


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
    tokens = (part.rstrip(ZERO_WIDTH_JOINERS) for cluster in clusters for part in cluster.split())
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
    text = plain_text(unicodedata.normalize("NFC", caption), keep_joiners=True)
    words = (word.strip().lower() for word in jieba.cut(text.strip().replace("。", ""), cut_all=False))
    # a piece holding only joiners or marks (jieba splits emoji sequences) is no word to score
    visible = (w for w in words if any(unicodedata.category(ch)[0] in "LNSP" for ch in w))
    return [word for word in visible if word not in punctuation()]


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
    text = plain_text(unicodedata.normalize("NFKC", caption), keep_joiners=True)
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


_BUILT_IN_MODULES = (__name__, tokenize.__module__)


def tokenizer_for(name: str) -> Callable[[str], list[str]]:
    """The tokenizer ``data.tokenizer`` names (registered in :data:`TOKENIZERS`); one registered by a
    module of the user's is wrapped in :class:`CheckedTokenizer`.

    Raises:
        UnknownNameError: an unknown name, listing the registered ones.
    """
    function = TOKENIZERS[name]
    if getattr(function, "__module__", None) in _BUILT_IN_MODULES:  # the built-in ones return lists of str
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
