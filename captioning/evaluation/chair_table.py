"""CHAIR's object words as the authors' released code reads captions (Rohrbach et al., 2018).

Published CHAIR numbers come from the code released with "Object Hallucination in Image
Captioning" (repository LisaAnne/Hallucination, ``utils/chair.py``) and its word table
``data/synonyms.txt``, shipped here as ``chair_synonyms.txt``. :class:`ReleasedChairTable`
follows its rules, in its order:

1. Every token is singularised with the rules of Pattern 3.6's ``singularize`` (the version the
   released code pins), quirks included: ``bus`` becomes ``bu`` and ``glass`` ``glas``, so a
   lone "bus" names nothing while "buses" is a bus (the released code's ``wine glas`` rule
   exists for the same reason).
2. Left to right, a pair of tokens that is one of its two-word names is one word: ``motor
   bike``, ``traffic light``, ``hot dog``, ``laptop computer``, ``toilet seat`` (a toilet),
   ``bow tie`` (a tie), ``baby``/``adult`` + an animal word (the animal, not a person),
   ``passenger jet``/``train`` (the vehicle, not a person).
3. With ``toilet`` in the caption, every ``seat`` is dropped (a toilet seat, not a chair).
4. What is left is looked up in the table: each line is a category (its first entry) and the
   words that name it, read as ``', '``-separated entries; a word on two lines names the later
   line's category.

The project's own, extended table (:mod:`captioning.evaluation.coco_words`) stays available as the
``extended`` table; this one is ``released`` (:data:`CHAIR_TABLES`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from importlib.resources import files

from captioning.config import CHAIR_TABLES
from captioning.evaluation.coco_words import COCO_WORDS, CategoryWords, Mention

# ---------------------------------------------------------------------------- singular nouns
# Pattern 3.6's English singularisation, in its order of checks. Words that stay as they are: a
# token that is the ending of one of these ("ice" of "rice") is kept whole, as Pattern does.
_UNCHANGED = (
    "bison",
    "bream",
    "breeches",
    "britches",
    "carp",
    "chassis",
    "christmas",
    "clippers",
    "cod",
    "contretemps",
    "corps",
    "debris",
    "diabetes",
    "djinn",
    "eland",
    "elk",
    "flounder",
    "gallows",
    "georgia",
    "graffiti",
    "headquarters",
    "herpes",
    "high-jinks",
    "homework",
    "innings",
    "jackanapes",
    "mackerel",
    "measles",
    "mews",
    "mumps",
    "news",
    "pincers",
    "pliers",
    "proceedings",
    "rabies",
    "salmon",
    "scissors",
    "series",
    "shears",
    "species",
    "swine",
    "swiss",
    "trout",
    "tuna",
    "whiting",
    "wildebeest",  # no plural form
    "advice",
    "bread",
    "butter",
    "cheese",
    "electricity",
    "equipment",
    "fruit",
    "furniture",
    "garbage",
    "gravel",
    "happiness",
    "information",
    "ketchup",
    "knowledge",
    "love",
    "luggage",
    "mathematics",
    "mayonnaise",
    "meat",
    "mustard",
    "progress",
    "research",
    "rice",
    "sand",
    "software",
    "understanding",
    "water",  # uncountable
)
# Singulars in -ie, whose plurals Pattern returns unchanged (``"doggies"``, ``"collies"``: no dog); the
# -ies rule below would otherwise make them -y (Pattern's "^pie" and "^tie"
# never match, their caret being taken literally, so "ties" -> "ty": kept that way).
_IE_WORDS = (
    "alergie",
    "auntie",
    "beanie",
    "birdie",
    "bogie",
    "bombie",
    "collie",
    "cookie",
    "cutie",
    "doggie",
    "eyrie",
    "freebie",
    "goonie",
    "groupie",
    "hankie",
    "hippie",
    "hoagie",
    "hottie",
    "indie",
    "junkie",
    "laddie",
    "laramie",
    "lingerie",
    "meanie",
    "newbie",
    "nightie",
    "oldie",
    "pixie",
    "quickie",
    "reverie",
    "rookie",
    "softie",
    "sortie",
    "stoolie",
    "sweetie",
    "techie",
    "toughie",
    "valkyrie",
    "veggie",
    "weenie",
    "yuppie",
    "zombie",
)
_IRREGULAR = {
    "atlantes": "atlas",
    "atlases": "atlas",
    "axes": "axe",
    "beeves": "beef",
    "brethren": "brother",
    "children": "child",
    "corpora": "corpus",
    "corpuses": "corpus",
    "ephemerides": "ephemeris",
    "feet": "foot",
    "ganglia": "ganglion",
    "geese": "goose",
    "genera": "genus",
    "genii": "genie",
    "graffiti": "graffito",
    "helves": "helve",
    "kine": "cow",
    "leaves": "leaf",
    "loaves": "loaf",
    "men": "man",
    "mongooses": "mongoose",
    "monies": "money",
    "moves": "move",
    "mythoi": "mythos",
    "numena": "numen",
    "occipita": "occiput",
    "octopodes": "octopus",
    "opera": "opus",
    "opuses": "opus",
    "our": "my",
    "oxen": "ox",
    "penes": "penis",
    "penises": "penis",
    "people": "person",
    "sexes": "sex",
    "soliloquies": "soliloquy",
    "teeth": "tooth",
    "testes": "testis",
    "trilbys": "trilby",
    "turves": "turf",
    "zoa": "zoon",
}
# (ending, replacement): the first ending that matches is replaced. Unmatched groups give "".
_ENDINGS = [
    (re.compile(ending), replacement)
    for ending, replacement in (
        (r"(.)ae$", r"\1a"),
        (r"(.)itis$", r"\1itis"),
        (r"(.)eaux$", r"\1eau"),
        (r"(quiz)zes$", r"\1"),
        (r"(matr)ices$", r"\1ix"),
        (r"(ap|vert|ind)ices$", r"\1ex"),
        (r"^(ox)en", r"\1"),
        (r"(alias|status)es$", r"\1"),
        (r"([octop|vir])i$", r"\1us"),
        (r"(cris|ax|test)es$", r"\1is"),
        (r"(shoe)s$", r"\1"),
        (r"(o)es$", r"\1"),
        (r"(bus)es$", r"\1"),
        (r"([m|l])ice$", r"\1ouse"),
        (r"(x|ch|ss|sh)es$", r"\1"),
        (r"(m)ovies$", r"\1ovie"),
        (r"(.)ombies$", r"\1ombie"),
        (r"(s)eries$", r"\1eries"),
        (r"([^aeiouy]|qu)ies$", r"\1y"),
        # -f and -fe that take -ves (lives, wolves)
        (r"([aeo]l)ves$", r"\1f"),
        (r"([^d]ea)ves$", r"\1f"),
        (r"arves$", "arf"),
        (r"erves$", "erve"),
        (r"([nlw]i)ves$", r"\1fe"),
        (r"([lr])ves$", r"\1f"),
        (r"([aeo])ves$", r"\1ve"),
        (r"(sive)s$", r"\1"),
        (r"(tive)s$", r"\1"),
        (r"(hive)s$", r"\1"),
        (r"([^f])ves$", r"\1fe"),
        # -ses
        (r"(^analy)ses$", r"\1sis"),
        (r"((a)naly|(b)a|(d)iagno|(p)arenthe|(p)rogno|(s)ynop|(t)he)ses$", r"\1\2sis"),
        (r"(.)opses$", r"\1opsis"),
        (r"(.)yses$", r"\1ysis"),
        (r"(h|d|r|o|n|b|cl|p)oses$", r"\1ose"),
        (r"(fruct|gluc|galact|lact|ket|malt|rib|sacchar|cellul)ose$", r"\1ose"),
        (r"(.)oses$", r"\1osis"),
        (r"([ti])a$", r"\1um"),
        (r"(n)ews$", r"\1ews"),
        (r"s$", ""),
    )
]
_PREPOSITIONS = frozenset(
    [
        "about",
        "above",
        "across",
        "after",
        "among",
        "around",
        "at",
        "athwart",
        "before",
        "behind",
        "below",
        "beneath",
        "beside",
        "besides",
        "between",
        "betwixt",
        "beyond",
        "but",
        "by",
        "during",
        "except",
        "for",
        "from",
        "in",
        "into",
        "near",
        "of",
        "off",
        "on",
        "onto",
        "out",
        "over",
        "since",
        "till",
        "to",
        "under",
        "until",
        "unto",
        "upon",
        "with",
    ]
)


@lru_cache(maxsize=65536)
def singular(word: str) -> str:
    """The singular of a lower-case word as Pattern 3.6 makes it (``"knives"`` -> ``"knife"``,
    ``"people"`` -> ``"person"``, ``"bagels"`` -> ``"bagel"``; also ``"bus"`` -> ``"bu"``)."""
    if "-" in word:  # mothers-in-law -> mother-in-law
        head, *rest = word.split("-")
        if rest and rest[0] in _PREPOSITIONS:
            return "-".join([singular(head), *rest])
    if word.endswith("'"):  # dogs' -> dog's
        return singular(word[:-1]) + "'s"
    if any(kept.endswith(word) for kept in _UNCHANGED):
        return word
    for ie_word in _IE_WORDS:  # Pattern returns such a plural unchanged: "doggies" names no dog
        if word.endswith(ie_word + "s"):
            return word
    for plural, single in _IRREGULAR.items():
        if word.endswith(plural):
            return word[: len(word) - len(plural)] + single
    for ending, replacement in _ENDINGS:
        if ending.search(word):
            return ending.sub(replacement, word)
    return word


# ---------------------------------------------------------------------------- the table
# Two-word names read as one word, and what each is read as (the released code's lists).
_DOUBLE_WORDS = (
    "motor bike",
    "motor cycle",
    "air plane",
    "traffic light",
    "street light",
    "traffic signal",
    "stop light",
    "fire hydrant",
    "stop sign",
    "parking meter",
    "suit case",
    "sports ball",
    "baseball bat",
    "baseball glove",
    "tennis racket",
    "wine glass",
    "hot dog",
    "cell phone",
    "mobile phone",
    "teddy bear",
    "hair drier",
    "potted plant",
    "bow tie",
    "laptop computer",
    "stove top oven",
    "home plate",
    "train track",  # "train tracks" names no train
)
_ANIMAL_WORDS = (
    "bird",
    "cat",
    "dog",
    "horse",
    "sheep",
    "cow",
    "elephant",
    "bear",
    "zebra",
    "giraffe",
    "animal",
    "cub",
)
_VEHICLE_WORDS = ("jet", "train")


def _double_words() -> dict[str, str]:
    pairs = {phrase: phrase for phrase in _DOUBLE_WORDS}
    for animal in _ANIMAL_WORDS:  # "baby bird" is a bird, not also a person
        pairs[f"baby {animal}"] = pairs[f"adult {animal}"] = animal
    for vehicle in _VEHICLE_WORDS:  # "passenger jet" is a jet, not also a person
        pairs[f"passenger {vehicle}"] = vehicle
    pairs.update({"bow tie": "tie", "toilet seat": "toilet", "wine glas": "wine glass"})
    return pairs


class ReleasedChairTable:
    """The released CHAIR word table and rules (see the module), matched in token lists.

    Args:
        lines: the table's lines, each ``category, word, word, ...`` (``#`` comments and blank
            lines are skipped).
        double_words: two-word name -> the word it is read as.
    """

    def __init__(self, lines: Iterable[str], double_words: dict[str, str] | None = None):
        self.node: dict[str, str] = {}  # word -> category; a later line wins, as in the released code
        self.synonyms: dict[str, list[str]] = {}
        for line in lines:
            if not line.strip() or line.startswith("#"):
                continue
            entries = line.strip().split(", ")  # exactly so: "cake,  cheesecake" keeps " cheesecake"
            self.synonyms[entries[0]] = entries
            for entry in entries:
                self.node[entry] = entries[0]
        self.double_words = dict(_double_words() if double_words is None else double_words)

    @classmethod
    def load(cls) -> ReleasedChairTable:
        """The table shipped with the package (the released ``data/synonyms.txt``)."""
        text = files("captioning.evaluation").joinpath("chair_synonyms.txt").read_text(encoding="utf-8")
        return cls(text.splitlines())

    @property
    def categories(self) -> list[str]:
        """The category names, in table order."""
        return list(self.synonyms)

    def with_categories(self, names: Iterable[str]) -> ReleasedChairTable:
        """This table plus each of ``names`` the table lacks, as a category naming itself (a
        two-word name also as a two-word name): a dataset's own categories (Shapes' ``circle``)."""
        extra = [name.lower() for name in names if name.lower() not in self.node]
        if not extra:
            return self
        table = ReleasedChairTable([], self.double_words)
        table.node, table.synonyms = dict(self.node), dict(self.synonyms)
        for name in extra:
            table.synonyms[name] = [name]
            table.node[name] = name
            if len(name.split()) == 2:
                table.double_words[name] = name
        return table

    def mentions(self, tokens: Sequence[str]) -> list[Mention]:
        """The categories that ``tokens`` (one caption, tokenised) name, in caption order."""
        words = [singular(token.lower()) for token in tokens]
        merged: list[tuple[str, int, int]] = []  # (word, start, end) over the tokens
        index = 0
        while index < len(words):
            pair = " ".join(words[index : index + 2])
            if pair in self.double_words:
                merged.append((self.double_words[pair], index, index + 2))
                index += 2
            else:
                merged.append((words[index], index, index + 1))
                index += 1
        if any(word == "toilet" for word, _, _ in merged):  # a toilet's seat is no chair
            merged = [item for item in merged if item[0] != "seat"]
        return [Mention((start, end), self.node[word]) for word, start, end in merged if word in self.node]


def chair_table(name: str) -> ReleasedChairTable | CategoryWords:
    """The CHAIR word table called ``name`` (one of :data:`CHAIR_TABLES`).

    Raises:
        ValueError: an unknown name.
    """
    if name == "released":
        return _released()
    if name == "extended":
        return COCO_WORDS
    raise ValueError(f"unknown CHAIR table {name!r}: one of {', '.join(CHAIR_TABLES)}")


@lru_cache(maxsize=1)
def _released() -> ReleasedChairTable:
    return ReleasedChairTable.load()


__all__ = ["CHAIR_TABLES", "ReleasedChairTable", "chair_table", "singular"]
