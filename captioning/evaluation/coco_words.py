"""Which MS-COCO object categories a caption mentions.

One table of the words and phrases that name each of the 80 COCO categories, used by attention
grounding and by anything else that needs the objects a caption talks about (an
object-hallucination rate such as CHAIR counts the mentioned categories missing from the image).

How a caption's tokens are matched (:meth:`CategoryWords.mentions`):

1. Longer phrases first: every phrase of the table is looked for before any shorter one, and
   the tokens of a match are consumed, so "teddy bear" is one teddy bear (not also a bear),
   "hot dog" a hot dog, "toilet bowl" a toilet, "wine glasses" wine glasses.
2. Plurals: every word or phrase also matches with its head noun in the plural (``dogs``,
   ``knives``, ``buses``, ``mice``, ``sheep``, ``teddy bears``, ``glasses of wine``); the plural is
   made from the singular, so an unrelated word is never taken for one (``skies`` is not ``skis``).
3. Head nouns of two-word names map on their own only where captions use them for that object:
   ``bat`` (baseball bat), ``meter`` (parking meter), ``hydrant``, ``racket``, ``teddy``, ``table``
   (dining table). They do not where the word usually means something else, so a lone ``sign``,
   ``light``, ``glass``/``glasses`` (eyewear), ``glove``/``mitt``, ``dryer``, ``plant`` and ``seat``
   name no category; ``stop sign``, ``traffic light``, ``wine glass``, ``baseball glove``,
   ``hair dryer`` and ``potted plant`` do.
4. Modifiers: a few words name their category only when they are the noun, not when they
   qualify the next word (``MODIFIER_WORDS``): "a baby elephant" is an elephant and no person,
   "ski lift" names no skis, "computer monitor" is a tv, "bus stop" no bus, "an orange cat" no
   orange. Such a word is taken as a noun when the caption ends after it or the next token is
   punctuation, a function word or an ``-ing`` verb, unless that is ``and``/``or`` before a
   colour ("orange and white"). ``orange`` also needs a determiner before it ("an orange",
   "the orange"): "a girl in orange" is a colour.
5. Some phrases are consumed and name nothing (``NOT_OBJECTS``): "jet ski" is no skis, "toilet
   paper" no toilet, "oven mitt" no oven, "flower bed" no bed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

from captioning.evaluation.coco_word_tables import (
    COCO_SYNONYMS,
    COLOUR_WORDS,
    DETERMINERS,
    FUNCTION_WORDS,
    IRREGULAR_PLURALS,
    MODIFIER_WORDS,
    NEEDS_DETERMINER,
    NOT_OBJECTS,
)

__all__ = [
    "COCO_SYNONYMS",
    "COCO_WORDS",
    "IRREGULAR_PLURALS",
    "MODIFIER_WORDS",
    "NOT_OBJECTS",
    "CategoryWords",
    "Mention",
    "mentioned_categories",
    "plural",
]


def plural(word_or_phrase: str) -> str:
    """The plural of a word, or of a phrase's head noun (``"teddy bear"`` -> ``"teddy bears"``,
    ``"glass of wine"`` -> ``"glasses of wine"``, ``"knife"`` -> ``"knives"``)."""
    words = word_or_phrase.split()
    head = words.index("of") - 1 if "of" in words[1:] else len(words) - 1
    word = words[head]
    if word in IRREGULAR_PLURALS:
        words[head] = IRREGULAR_PLURALS[word]
    elif word.endswith("man"):
        words[head] = word[:-3] + "men"  # man, woman, gentleman, policeman
    elif word.endswith(("s", "x", "z", "ch", "sh")):
        words[head] = word + "es"  # bus, box, bench, glass, toothbrush
    elif word.endswith("y") and word[-2:-1] not in ("a", "e", "i", "o", "u"):
        words[head] = word[:-1] + "ies"  # puppy, pony, lady (not boy, key)
    else:
        words[head] = word + "s"
    return " ".join(words)


class Mention(NamedTuple):
    """A category named by the caption's tokens ``span[0]:span[1]``."""

    span: tuple[int, int]
    category: str


class CategoryWords:
    """A table of the words and phrases that name object categories, matched in token lists.

    Args:
        synonyms: category -> words and phrases (singular, space-separated) that name it; the
            category's own name is included, and every entry also matches in the plural.
        not_objects: phrases consumed without naming any category.
        modifiers: words that name their category only when they are the noun (see the module).
    """

    def __init__(
        self,
        synonyms: Mapping[str, Iterable[str]],
        not_objects: Iterable[str] = (),
        modifiers: Collection[str] = (),
    ):
        self.synonyms = {category.lower(): tuple(words) for category, words in synonyms.items()}
        self.not_objects = tuple(not_objects)
        self.modifiers = frozenset(modifiers)
        self.forms: dict[tuple[str, ...], str | None] = {}
        for phrase in self.not_objects:
            self._add(phrase, None)
        for category, words in self.synonyms.items():
            for phrase in (category, *words):
                self._add(phrase, category)
        self._longest = max(map(len, self.forms), default=0)

    def _add(self, phrase: str, category: str | None) -> None:
        for form in {phrase.lower(), plural(phrase.lower())}:
            self.forms[tuple(form.split())] = category

    @property
    def categories(self) -> list[str]:
        """The category names, in table order."""
        return list(self.synonyms)

    def with_categories(self, names: Iterable[str]) -> CategoryWords:
        """This table plus ``names`` as categories of their own (each naming itself and its plural).

        A name that the table reads differently wins (a dataset with a category ``"sign"``), so
        the category names of an instances file always name their objects.
        """
        own = [name.lower() for name in names]
        extra = sorted({name for name in own if self.forms.get(tuple(name.split())) != name})
        if not extra:
            return self
        # Added last, so that their forms replace any other reading of the same words.
        synonyms = {category: words for category, words in self.synonyms.items() if category not in extra}
        synonyms.update((name, self.synonyms.get(name, ())) for name in extra)
        return CategoryWords(synonyms, self.not_objects, self.modifiers)

    def mentions(self, tokens: Sequence[str]) -> list[Mention]:
        """The categories that ``tokens`` (one caption, tokenised) name, in caption order.

        Longer phrases are matched first and their tokens are consumed, so no token belongs to two
        mentions; a category named twice gives two mentions.
        """
        words = [token.lower() for token in tokens]
        taken = [False] * len(words)
        found: list[Mention] = []
        for length in range(self._longest, 0, -1):
            for start in range(len(words) - length + 1):
                key = tuple(words[start : start + length])
                if key not in self.forms or any(taken[start : start + length]):
                    continue
                if length == 1 and key[0] in self.modifiers and not _is_noun(words, start):
                    continue
                taken[start : start + length] = [True] * length
                category = self.forms[key]
                if category is not None:
                    found.append(Mention((start, start + length), category))
        return sorted(found)


def _is_noun(words: Sequence[str], index: int) -> bool:
    """Whether the modifier-prone ``words[index]`` is its phrase's noun rather than qualifying the next."""
    if words[index] in NEEDS_DETERMINER and (index == 0 or words[index - 1] not in DETERMINERS):
        return False
    if index + 1 == len(words):
        return True
    following = words[index + 1]
    if following in ("and", "or") and index + 2 < len(words) and words[index + 2] in COLOUR_WORDS:
        return False  # "orange and white cat"
    return not following.isalpha() or following in FUNCTION_WORDS or following.endswith("ing")


COCO_WORDS = CategoryWords(COCO_SYNONYMS, NOT_OBJECTS, MODIFIER_WORDS)


def mentioned_categories(tokens: Sequence[str]) -> list[Mention]:
    """The MS-COCO categories that a tokenised caption mentions: ``[((start, end), category), ...]``.

    ``tokens`` are lower-case words as :func:`captioning.data.tokenizers.tokenize` gives them. See the module
    docstring for the rules; ``COCO_SYNONYMS`` for the words.
    """
    return COCO_WORDS.mentions(tokens)
