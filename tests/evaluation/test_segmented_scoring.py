"""Chinese and Japanese captions scored on words, as the published benchmarks score them:
``evaluate.py --tokenizer jieba`` equals pycocoevalcap's BLEU and CIDEr-D on jieba's words (AI
Challenger's call, also COCO-CN's), ``--tokenizer mecab`` the same on MeCab's words (STAIR
Captions); the words are computed here with the segmenters themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from tool_runs import in_process

jieba = pytest.importorskip("jieba")
fugashi = pytest.importorskip("fugashi")

CHINESE = {
    1: ("一只猫坐在红色的沙发上。", ["一只猫躺在沙发上。", "红色沙发上有一只小猫。"]),
    2: ("两个男人在公园里踢足球。", ["两个人在草地上踢足球。", "公园里的男人们在踢球。"]),
    3: ("一辆公共汽车停在街道旁边。", ["街道上停着一辆公交车。", "一辆大巴停在马路边。"]),
}
JAPANESE = {
    1: ("赤いソファの上に猫が座っている。", ["ソファの上で猫が寝ている。", "赤いソファに子猫がいる。"]),
    2: (
        "公園で二人の男性がサッカーをしている。",
        ["芝生の上でサッカーをする人たち。", "公園で男性たちがボールを蹴っている。"],
    ),
    3: ("道路の脇にバスが止まっている。", ["道にバスが停車している。", "大きなバスが道路脇に止まっている。"]),
}


def jieba_words(caption: str) -> str:
    return " ".join(w for w in jieba.cut(caption.strip().replace("。", ""), cut_all=False) if w.strip())


def mecab_words(caption: str) -> str:
    tagger = fugashi.Tagger()
    return " ".join(
        w.surface for w in tagger(caption) if w.surface.strip() and w.surface not in {"。", "、", "．"}
    )


def reference_scores(data: dict, words) -> tuple[float, float]:
    gts = {i: [words(r) for r in refs] for i, (_, refs) in data.items()}
    res = {i: [words(c)] for i, (c, _) in data.items()}
    bleu, _ = Bleu(4).compute_score(gts, res)
    cider, _ = Cider().compute_score(gts, res)
    return bleu[3], cider


def scored(tmp_path: Path, data: dict, tokenizer: str) -> dict:
    annotations = tmp_path / "captions.json"
    annotations.write_text(
        json.dumps(
            {
                "images": [{"id": i} for i in data],
                "annotations": [
                    {"id": 10 * i + k, "image_id": i, "caption": ref}
                    for i, (_, refs) in data.items()
                    for k, ref in enumerate(refs)
                ],
            },
            ensure_ascii=False,
        ),
        encoding="utf-8",
    )
    results = tmp_path / "results.json"
    results.write_text(
        json.dumps([{"image_id": i, "caption": c} for i, (c, _) in data.items()], ensure_ascii=False),
        encoding="utf-8",
    )
    out = tmp_path / "scores.json"
    run = in_process(
        "evaluate.py",
        "--annotations", annotations,
        "--results", results,
        "--tokenizer", tokenizer,
        "--no-java",
        "--out", out,
        "--no-progress",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    ("data", "tokenizer", "words"), [(CHINESE, "jieba", jieba_words), (JAPANESE, "mecab", mecab_words)]
)
def test_segmented_scores_equal_pycocoevalcap_on_the_segmenters_words(tmp_path, data, tokenizer, words):
    bleu4, cider = reference_scores(data, words)
    scores = scored(tmp_path, data, tokenizer)
    assert scores["BLEU-4"] == pytest.approx(bleu4, abs=1e-9)
    assert scores["CIDEr-D"] == pytest.approx(cider, abs=1e-9)
    assert f"tok:{tokenizer}.v2-" in scores["signature"]  # the rules' and the segmenter's versions
    characters = scored(tmp_path, data, "characters")
    assert characters["BLEU-4"] != pytest.approx(bleu4)  # characters are not the benchmark's words


def test_results_of_segmented_captions_join_words_as_the_benchmarks_write_them(tmp_path):
    from types import SimpleNamespace

    from captioning.evaluation.runner import write_results

    item = SimpleNamespace(record=SimpleNamespace(image_id=7), words=["一只", "猫", "在", "沙发", "上"])
    for tokenizer, caption in (
        ("jieba", "一只猫在沙发上"),
        ("mecab", "一只猫在沙发上"),
        ("characters", "一只 猫 在 沙发 上"),
    ):
        path = write_results(tmp_path / f"{tokenizer}.json", [item], tokenizer)
        assert json.loads(path.read_text(encoding="utf-8")) == [{"image_id": 7, "caption": caption}]
    # scored as the benchmark scores it: segmented again, to the same words here
    assert jieba_words("一只猫在沙发上") == "一只 猫 在 沙发 上"
