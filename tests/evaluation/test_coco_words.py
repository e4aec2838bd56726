"""The MS-COCO category words: names, plurals, phrases before head nouns, ambiguous words, real captions."""

from __future__ import annotations

import pytest

from captioning.data.tokenizers import tokenize
from captioning.evaluation.coco_words import (
    COCO_SYNONYMS,
    COCO_WORDS,
    NOT_OBJECTS,
    CategoryWords,
    Mention,
    mentioned_categories,
    plural,
)

# The 80 categories of the COCO 2014/2017 instances files, each with its plural, written out here
# so that the table is checked against the official names rather than against itself.
COCO_NAMES_AND_PLURALS = {
    "person": "people",
    "bicycle": "bicycles",
    "car": "cars",
    "motorcycle": "motorcycles",
    "airplane": "airplanes",
    "bus": "buses",
    "train": "trains",
    "truck": "trucks",
    "boat": "boats",
    "traffic light": "traffic lights",
    "fire hydrant": "fire hydrants",
    "stop sign": "stop signs",
    "parking meter": "parking meters",
    "bench": "benches",
    "bird": "birds",
    "cat": "cats",
    "dog": "dogs",
    "horse": "horses",
    "sheep": "sheep",
    "cow": "cows",
    "elephant": "elephants",
    "bear": "bears",
    "zebra": "zebras",
    "giraffe": "giraffes",
    "backpack": "backpacks",
    "umbrella": "umbrellas",
    "handbag": "handbags",
    "tie": "ties",
    "suitcase": "suitcases",
    "frisbee": "frisbees",
    "skis": "skis",
    "snowboard": "snowboards",
    "sports ball": "sports balls",
    "kite": "kites",
    "baseball bat": "baseball bats",
    "baseball glove": "baseball gloves",
    "skateboard": "skateboards",
    "surfboard": "surfboards",
    "tennis racket": "tennis rackets",
    "bottle": "bottles",
    "wine glass": "wine glasses",
    "cup": "cups",
    "fork": "forks",
    "knife": "knives",
    "spoon": "spoons",
    "bowl": "bowls",
    "banana": "bananas",
    "apple": "apples",
    "sandwich": "sandwiches",
    "orange": "oranges",
    "broccoli": "broccoli",
    "carrot": "carrots",
    "hot dog": "hot dogs",
    "pizza": "pizzas",
    "donut": "donuts",
    "cake": "cakes",
    "chair": "chairs",
    "couch": "couches",
    "potted plant": "potted plants",
    "bed": "beds",
    "dining table": "dining tables",
    "toilet": "toilets",
    "tv": "tvs",
    "laptop": "laptops",
    "mouse": "mice",
    "remote": "remotes",
    "keyboard": "keyboards",
    "cell phone": "cell phones",
    "microwave": "microwaves",
    "oven": "ovens",
    "toaster": "toasters",
    "sink": "sinks",
    "refrigerator": "refrigerators",
    "book": "books",
    "clock": "clocks",
    "vase": "vases",
    "scissors": "scissors",
    "teddy bear": "teddy bears",
    "hair drier": "hair driers",
    "toothbrush": "toothbrushes",
}


def named(caption: str) -> list[tuple[str, str]]:
    """(words of the mention, category) for each mention in a caption, in order."""
    tokens = tokenize(caption)
    return [
        (" ".join(tokens[start:end]), category) for (start, end), category in mentioned_categories(tokens)
    ]


def test_the_table_holds_exactly_the_80_coco_categories():
    assert len(COCO_NAMES_AND_PLURALS) == 80
    assert sorted(COCO_WORDS.categories) == sorted(COCO_NAMES_AND_PLURALS)


def test_no_word_or_phrase_names_two_categories():
    readings: dict[str, set] = {}
    for category, words in [(None, NOT_OBJECTS), *COCO_SYNONYMS.items()]:
        for phrase in ([category] if category else []) + list(words):
            for form in (phrase, plural(phrase)):
                readings.setdefault(form, set()).add(category)
    assert {form: found for form, found in readings.items() if len(found) > 1} == {}


@pytest.mark.parametrize(("name", "plural_form"), sorted(COCO_NAMES_AND_PLURALS.items()))
def test_every_category_is_named_by_its_name_and_its_plural(name: str, plural_form: str):
    for words in (["one", *name.split()], ["two", *plural_form.split()]):
        assert mentioned_categories(words) == [Mention((1, len(words)), name)]


@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        ("a teddy bear on a bed", [("teddy bear", "teddy bear"), ("bed", "bed")]),
        ("two hot dogs and a dog", [("hot dogs", "hot dog"), ("dog", "dog")]),
        (
            "a stop sign under traffic lights",
            [("stop sign", "stop sign"), ("traffic lights", "traffic light")],
        ),
        (
            "wine glasses and a glass of wine",
            [("wine glasses", "wine glass"), ("glass of wine", "wine glass")],
        ),
        ("a toilet bowl", [("toilet bowl", "toilet")]),
        ("a microwave oven", [("microwave oven", "microwave")]),
        ("a dirt bike", [("dirt bike", "motorcycle")]),
        ("a catcher's mitt", [("catcher 's mitt", "baseball glove")]),
        ("a train car", [("train car", "train")]),
    ],
)
def test_phrases_are_matched_before_their_head_nouns(caption: str, expected: list):
    assert named(caption) == expected


def test_the_tokens_of_a_phrase_are_consumed():
    tokens = ["teddy", "bear", "bear", "hot", "dog"]
    mentions = mentioned_categories(tokens)
    assert mentions == [((0, 2), "teddy bear"), ((2, 3), "bear"), ((3, 5), "hot dog")]
    covered = [index for (start, end), _ in mentions for index in range(start, end)]
    assert sorted(covered) == sorted(set(covered))  # no token counted twice


@pytest.mark.parametrize(
    "caption",
    [
        "wearing glasses",
        "a glass window",
        "a sign on the wall",
        "the light is on",
        "a street light",
        "wearing gloves",
        "an oven mitt",
        "a clothes dryer",
        "a plant in the garden",
        "an empty seat",
        "the skies are blue",
    ],
)
def test_ambiguous_head_nouns_name_nothing_alone(caption: str):
    assert named(caption) == []


@pytest.mark.parametrize(
    ("word", "category"),
    [
        ("man", "person"),
        ("men", "person"),
        ("women", "person"),
        ("boy", "person"),
        ("girls", "person"),
        ("child", "person"),
        ("children", "person"),
        ("kids", "person"),
        ("people", "person"),
        ("player", "person"),
        ("guys", "person"),
        ("ladies", "person"),
        ("skiers", "person"),
        ("surfer", "person"),
        ("bike", "bicycle"),
        ("motorbikes", "motorcycle"),
        ("plane", "airplane"),
        ("jets", "airplane"),
        ("tv", "tv"),
        ("television", "tv"),
        ("laptops", "laptop"),
        ("computer", "laptop"),
        ("cellphone", "cell phone"),
        ("phones", "cell phone"),
        ("sofa", "couch"),
        ("table", "dining table"),
        ("doughnuts", "donut"),
        ("puppies", "dog"),
        ("ponies", "horse"),
        ("mice", "mouse"),
        ("knives", "knife"),
        ("ski", "skis"),
        ("buses", "bus"),
        ("benches", "bench"),
        ("sheep", "sheep"),
        ("calves", "cow"),
        ("geese", "bird"),
        ("bat", "baseball bat"),
        ("meters", "parking meter"),
        ("hydrant", "fire hydrant"),
        ("racquet", "tennis racket"),
        ("teddy", "teddy bear"),
        ("fridge", "refrigerator"),
    ],
)
def test_synonyms_and_plurals(word: str, category: str):
    assert mentioned_categories([word]) == [Mention((0, 1), category)]


@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        ("a baby elephant", [("elephant", "elephant")]),
        ("a baby in a crib", [("baby", "person")]),
        ("a baby pool", []),
        ("a female tennis player", [("player", "person")]),
        ("a ski lift", []),
        ("standing on one ski .", [("ski", "skis")]),
        ("a computer monitor and a computer mouse", [("monitor", "tv"), ("mouse", "mouse")]),
        ("a bus stop", []),
        ("a bus driver", [("driver", "person")]),
        ("an orange cat", [("cat", "cat")]),
        ("an orange and white cat", [("cat", "cat")]),
        ("a girl in orange", [("girl", "person")]),
        ("an orange on a plate", [("orange", "orange")]),
        ("a jet ski", []),
        ("toilet paper", []),
    ],
)
def test_modifiers_and_phrases_that_name_nothing(caption: str, expected: list):
    assert named(caption) == expected


# Flickr8k / Flickr30k test captions (from the Show, Attend and Tell reference files), read by hand.
@pytest.mark.parametrize(
    ("caption", "categories"),
    [
        (
            "Three people sit at a picnic table outside of a building painted like a union jack .",
            ["person", "dining table"],
        ),
        (
            "Three people are sitting at an outside picnic bench with an umbrella .",
            ["person", "bench", "umbrella"],
        ),
        ("A crowd watching a dirt bike race", ["person", "motorcycle"]),
        ("A man stands at a traffic light , waiting to cross the street .", ["person", "traffic light"]),
        ("A man dressed in black stands at a street corner near a crossing light .", ["person"]),
        ("A young girl wearing red sunglasses sits near a sink and holds the faucet .", ["person", "sink"]),
        ("A homeless man stands with a sign next to orange construction cones .", ["person"]),
        ("A dark-skinned man walks by a woman talking on a cellphone .", ["person", "person", "cell phone"]),
        ("A dog comes out of a blue baby pool with a ball in his mouth .", ["dog", "sports ball"]),
        ("A small child swings back a red baseball bat .", ["person", "baseball bat"]),
        ("A blond woman pours a glass of wine in a dim restaurant .", ["person", "wine glass"]),
        ("A snowboarder is jumping in the air next to the ski lift .", ["person"]),
        ("A man jumps train cars with his bike .", ["person", "train", "bicycle"]),
        ("A dog chases a stuffed animal attached to a string .", ["dog", "teddy bear"]),
    ],
)
def test_real_captions(caption: str, categories: list[str]):
    assert [category for _, category in named(caption)] == categories


def test_plural_of_words_and_phrases():
    assert [
        plural(w) for w in ("knife", "bus", "bench", "puppy", "boy", "woman", "sheep", "mouse", "ski")
    ] == ["knives", "buses", "benches", "puppies", "boys", "women", "sheep", "mice", "skis"]
    assert plural("teddy bear") == "teddy bears" and plural("glass of wine") == "glasses of wine"


def test_with_categories_adds_a_datasets_own_names():
    table = COCO_WORDS.with_categories(["circle", "sign", "dog"])
    assert table.mentions(["red", "circles", "and", "a", "sign", "and", "dogs"]) == [
        ((1, 2), "circle"),
        ((4, 5), "sign"),
        ((6, 7), "dog"),
    ]
    assert COCO_WORDS.with_categories(["dog", "teddy bear"]) is COCO_WORDS  # nothing new
    assert COCO_WORDS.mentions(["sign"]) == []  # the shared table is unchanged


def test_a_table_of_its_own():
    table = CategoryWords({"shape": ("circle", "square")}, not_objects=("square dance",))
    assert table.mentions(["a", "square", "and", "a", "square", "dance"]) == [((1, 2), "shape")]
