"""data.tokenizer: the whitespace and characters tokenizers, and the metrics computed on their tokens."""

from __future__ import annotations

import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider

from captioning.config import TOKENIZERS as CONFIG_TOKENIZERS
from captioning.config import Config, ConfigError, DataConfig
from captioning.config.loading import CHECKPOINT_SECTIONS, check_overrides, with_data_section
from captioning.data.karpathy import read_karpathy
from captioning.data.tokenizers import (
    TOKENIZERS,
    detokenize,
    tokenize_characters,
    tokenize_whitespace,
    tokenizer_for,
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
]


def test_the_configuration_names_every_built_in_tokenizer_and_the_registry_checks_names():
    assert TOKENIZERS.names() == CONFIG_TOKENIZERS
    assert DataConfig(tokenizer="jieba").tokenizer == "jieba"
    with pytest.raises(UnknownNameError, match="data.tokenizer names an unknown tokenizer 'klingon'"):
        TOKENIZERS.check("klingon")
    with pytest.raises(ConfigError, match="data.tokenizer must name a tokenizer"):
        DataConfig(tokenizer=" ")


def test_a_user_module_registers_a_tokenizer_train_py_accepts(monkeypatch):
    """A tokenizer registered by a user module is one train.py's name check accepts."""
    from captioning.cli.common import check_registered_names
    from captioning.config import Config

    monkeypatch.setattr(TOKENIZERS, "_entries", dict(TOKENIZERS._entries))
    TOKENIZERS.register("upper")(lambda caption: caption.upper().split())
    check_registered_names(Config(data=DataConfig(tokenizer="upper")))
    with pytest.raises(UnknownNameError):
        check_registered_names(Config(data=DataConfig(tokenizer="lower")))


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
    assert parse_signature(make_signature(references, scores.tokenizer))["tok"] == "characters"


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
    with pytest.raises(ConfigError, match="data.tokenizer: fixed by the checkpoint"):
        check_overrides({"data.tokenizer": "whitespace"}, CHECKPOINT_SECTIONS)
    check_overrides({"data.tokenizer": "whitespace"})  # a new run may choose it
    trained = Config(data=DataConfig(tokenizer="characters"))
    other = with_data_section(trained, DataConfig(dataset="imagefolder", root="elsewhere"))
    assert other.data.root == "elsewhere" and other.data.tokenizer == "characters"
