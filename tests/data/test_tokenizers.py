"""data.tokenizer: the whitespace and characters tokenizers, and the metrics computed on their tokens."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from messages import raises_naming
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider

from captioning.config import Config, ConfigError, DataConfig, ShapesDataConfig
from captioning.config.loading import CHECKPOINT_SECTIONS, check_overrides, with_data_section
from captioning.data.karpathy import read_karpathy
from captioning.data.tokenizers import (
    TOKENIZERS,
    detokenize,
    tokenize,
    tokenize_characters,
    tokenize_jieba,
    tokenize_whitespace,
    tokenizer_for,
    tokenizer_version,
)
from captioning.evaluation.metrics import score_captions
from captioning.evaluation.signature import make_signature, parse_signature
from captioning.registry import UnknownNameError

CAPTIONS = [
    "一只狗在草地上跑。",
    "两只猫在ＴＶ前，3个人",
    "Một con_chó đang chạy .",
    "A dog's ball (red), isn't it?",
    "  tabs\tand\nnewlines  ",
    "Ünïcödé ÉTÉ café",
    "!!! ... ,",
    "Một con chó 👍🏽 và 👩‍👩‍👧 ❤️",
]
# The tokenizers that drop every token made only of punctuation; ptb drops the COCO toolkit's list,
# and jieba what AI Challenger's evaluator drops (。 and that list).
OWN_RULES = [name for name in TOKENIZERS.names() if name not in ("ptb", "jieba")]
PUNCTUATION_ONLY = ["...!!!", "?!", "。。。", "——", "…", "！？", "‼️", "「」《》", "¿¡", "、，：；", "!\u0301"]


def test_the_configuration_takes_any_name_and_the_registry_checks_names():
    assert ShapesDataConfig(tokenizer="jieba").tokenizer == "jieba"
    with pytest.raises(UnknownNameError) as unknown:
        TOKENIZERS.check("klingon")
    assert "data.tokenizer" in str(unknown.value) and "'klingon'" in str(unknown.value)
    assert all(name in str(unknown.value) for name in TOKENIZERS.names())
    with raises_naming(ConfigError, "data.tokenizer", "' '"):
        ShapesDataConfig(tokenizer=" ")


def test_a_user_module_registers_a_tokenizer_train_py_accepts(monkeypatch):
    """A tokenizer registered by a user module is one train.py's name check accepts."""
    from captioning.cli.common import check_registered_names
    from captioning.config import Config

    with TOKENIZERS.registered("upper", lambda caption: caption.upper().split()):
        check_registered_names(Config(data=ShapesDataConfig(tokenizer="upper")))
        with pytest.raises(UnknownNameError):
            check_registered_names(Config(data=ShapesDataConfig(tokenizer="lower")))


def test_whitespace_keeps_pre_tokenised_words_whole_and_drops_punctuation_tokens():
    assert tokenize_whitespace("Một con_chó đang chạy .") == ["một", "con_chó", "đang", "chạy"]
    assert tokenize_whitespace("狗 在 草地 上 跑 。") == ["狗", "在", "草地", "上", "跑"]
    assert tokenize_whitespace("a dog's\u00a0ball,\tred") == [
        "a",
        "dog's",
        "ball,",
        "red",
    ]  # only whole tokens go
    assert tokenize_whitespace(" .. ") == []


def test_characters_splits_every_character_but_latin_words_and_numbers():
    assert tokenize_characters("一只狗在草地上跑。") == ["一", "只", "狗", "在", "草", "地", "上", "跑"]
    assert tokenize_characters("两只猫在ＴＶ前，32个人") == [
        "两",
        "只",
        "猫",
        "在",
        "tv",
        "前",
        "32",
        "个",
        "人",
    ]
    assert tokenize_characters("犬が走っている") == ["犬", "が", "走", "っ", "て", "い", "る"]
    assert tokenize_characters("「」、。") == []


@pytest.mark.parametrize("name", TOKENIZERS.names())
@pytest.mark.parametrize("caption", CAPTIONS)
def test_a_results_caption_gives_back_its_tokens(name, caption):
    """Results files hold ``detokenize(words)``; scoring tokenizes them again and must get the same words."""
    tokenize = tokenizer_for(name)
    tokens = tokenize(caption)
    assert tokenize(detokenize(tokens)) == tokens


def test_bleu_and_cider_d_are_the_toolkits_on_the_characters():
    references = {
        1: ["一只狗在草地上跑。", "草地上有一只狗"],
        2: ["两只猫坐在沙发上", "沙发上的两只猫"],
        3: ["一个人在骑自行车", "男人骑着自行车"],
    }
    candidates = {1: "一 只 狗 在 跑", 2: "两只猫在沙发上", 3: "一个人骑车"}
    scores = score_captions(references, candidates, use_java=False, tokenizer="characters")

    def spaced(text: str) -> str:
        return " ".join(ch for ch in text if ch not in " 。")

    gts = {i: [spaced(r) for r in refs] for i, refs in references.items()}
    res = {i: [spaced(c)] for i, c in candidates.items()}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    assert scores.overall["BLEU-1"] == pytest.approx(bleu[0]) and scores.overall["BLEU-4"] == pytest.approx(
        bleu[3]
    )
    assert scores.overall["CIDEr-D"] == pytest.approx(cider) and cider > 0
    assert scores.tokenizer == "characters"
    for metric in ("METEOR", "SPICE"):
        assert scores.overall[metric] is None and "English only" in scores.unavailable[metric]
    assert parse_signature(make_signature(references, scores.tokenizer))["tok"] == "characters.v2"


def test_whitespace_scores_count_a_pre_tokenised_word_once():
    references = {1: ["một con_chó đang chạy", "con_chó chạy trên cỏ"]}
    whole = score_captions(references, {1: "một con_chó đang chạy"}, use_java=False, tokenizer="whitespace")
    assert whole.overall["BLEU-1"] == pytest.approx(1.0) and whole.overall["BLEU-4"] == pytest.approx(1.0)
    # The final "." is a punctuation token, dropped as PTB drops it; the rest are scored as given.
    bleu, _ = Bleu(4).compute_score({1: references[1]}, {1: ["một con_chó chạy"]}, verbose=0)
    part = score_captions(references, {1: "một con_chó chạy ."}, use_java=False, tokenizer="whitespace")
    assert part.overall["BLEU-2"] == pytest.approx(bleu[1])


def test_karpathy_files_are_retokenized_from_raw_with_another_tokenizer(tmp_path, write_json, make_image):
    make_image(tmp_path / "a.jpg")
    split_file = write_json(
        tmp_path / "dataset.json",
        {
            "images": [
                {
                    "filename": "a.jpg",
                    "imgid": 0,
                    "split": "train",
                    "sentences": [{"tokens": ["一只狗"], "raw": "一只狗。"}],
                }
            ]
        },
    )
    (ptb,) = read_karpathy(split_file, tmp_path)
    (characters,) = read_karpathy(split_file, tmp_path, tokenizer=tokenize_characters)
    assert ptb.captions == (("一只狗",),) and characters.captions == (("一", "只", "狗"),)


def test_a_checkpoints_tokenizer_cannot_be_changed_when_evaluating():
    with raises_naming(ConfigError, "data.tokenizer", "checkpoint"):
        check_overrides({"data.tokenizer": "whitespace"}, CHECKPOINT_SECTIONS)
    check_overrides({"data.tokenizer": "whitespace"})  # a new run may choose it
    trained = Config(data=ShapesDataConfig(tokenizer="characters"))
    other = with_data_section(trained, DataConfig(dataset="imagefolder", root="elsewhere"))
    assert other.data.root == "elsewhere" and other.data.tokenizer == "characters"


@pytest.mark.parametrize("name", OWN_RULES)
@pytest.mark.parametrize("caption", PUNCTUATION_ONLY)
def test_punctuation_alone_gives_no_tokens(name, caption):
    assert tokenizer_for(name)(caption) == []
    assert tokenizer_for(name)(f"A dog {caption} runs") == ["a", "dog", "runs"]


def test_ptb_drops_the_toolkits_punctuation_list_and_keeps_what_the_toolkit_keeps():
    """The COCO toolkit keeps runs like ``!!!`` and ``?!`` (test_text_ptb checks them against Java)."""
    assert tokenize("...!!!") == ["!!!"] and tokenize("?!") == ["?!"]
    assert tokenize("——") == [] and tokenize("…") == []
    assert tokenize("a dog ... runs , ;") == ["a", "dog", "runs"]


def test_jieba_drops_what_ai_challengers_evaluator_drops():
    """jieba's words, then the COCO toolkit's PTB step the evaluator runs: its list and 。 go, full-width
    punctuation stays (the evaluator's scores count it)."""
    assert tokenize_jieba("一只狗在草地上跑。") == ["一只", "狗", "在", "草地", "上", "跑"]
    assert tokenize_jieba("一只狗, 在跑... !") == ["一只", "狗", "在", "跑"]
    assert "，" in tokenize_jieba("一只狗，在跑！") and "！" in tokenize_jieba("一只狗，在跑！")


def test_symbols_are_words_and_keep_a_token_that_holds_one():
    assert tokenize_whitespace("?!$ 5° © + 🙂 ?!") == ["?!$", "5°", "©", "+", "🙂"]
    assert tokenize_characters("?!$ 5°，🙂") == ["$", "5", "°", "🙂"]


@pytest.mark.parametrize("name", TOKENIZERS.names())
@pytest.mark.parametrize("caption", ["Một con chó đang chạy trên cỏ", "Ünïcödé ÉTÉ café", "一只狗在跑"])
def test_text_typed_with_combining_marks_gives_the_tokens_of_precomposed_text(name, caption):
    tokenize = tokenizer_for(name)
    assert tokenize(unicodedata.normalize("NFD", caption)) == tokenize(unicodedata.normalize("NFC", caption))


@pytest.mark.parametrize("name", TOKENIZERS.names())
def test_every_tokenizer_lower_cases(name):
    tokens = tokenizer_for(name)("一只狗在TV前, A Dog ÉTÉ")
    assert tokens == [token.lower() for token in tokens] and "dog" in tokens


def test_characters_are_grapheme_clusters():
    nfd = unicodedata.normalize("NFD", "một")
    assert len(nfd) == 5 and tokenize_characters(nfd) == tokenize_characters("một") == ["một"]  # like "café"
    assert tokenize_characters("ẹ́ café") == ["ẹ́", "café"]  # a letter with two marks, no precomposed form
    assert tokenize_characters("หิมะ हिंदी") == ["หิ", "ม", "ะ", "हिं", "दी"]  # vowel signs stay on
    assert tokenize_characters("一只狗在草地上跑。") == ["一", "只", "狗", "在", "草", "地", "上", "跑"]


@pytest.mark.parametrize(
    "emoji",
    [
        "👩\u200d👩\u200d👧",
        "👍🏽",
        "❤️",
        "🇯🇵",
        "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    ],
)
def test_an_emoji_sequence_stays_one_token(emoji):
    assert tokenize_characters(f"一只狗{emoji}跑") == ["一", "只", "狗", emoji, "跑"]
    assert tokenize_whitespace(f"con chó {emoji} chạy") == ["con", "chó", emoji, "chạy"]


def test_a_joiner_stays_only_inside_a_word():
    assert tokenize_whitespace("می\u200cخواهم") == ["می\u200cخواهم"]  # Persian spells the word with a ZWNJ
    assert tokenize_whitespace("a\u200d b \u200dc \u0301d") == ["a", "b", "c", "d"]
    assert tokenize_characters("狗\u200d猫 \u0301") == ["狗", "猫"]


def test_tokenizer_versions_are_named_in_signatures():
    assert tokenizer_version("whitespace") == "whitespace.v2"
    assert tokenizer_version("characters") == "characters.v2"
    assert tokenizer_version("jieba").startswith("jieba.v2-")
    assert tokenizer_version("mecab").startswith("mecab.v2-fugashi-")
    assert tokenizer_version("ptb") == "ptb" and tokenizer_version("python") == "python"
    assert tokenizer_version("upper") == "upper"  # a tokenizer of your own


@settings(max_examples=300, deadline=None)
@given(st.text())
@pytest.mark.parametrize("name", ["whitespace", "characters"])
def test_any_unicode_gives_clean_tokens_that_read_back_the_same(name, text):
    tokenize = tokenizer_for(name)
    tokens = tokenize(text)
    for token in tokens:
        assert token and not any(ch.isspace() for ch in token) and token == token.lower()
        assert unicodedata.is_normalized("NFC", token)
        assert any(unicodedata.category(ch)[0] in "LNS" for ch in token)  # never punctuation alone
    assert tokenize(detokenize(tokens, name)) == tokens
