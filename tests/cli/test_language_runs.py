"""A run in each caption language, as a user starts it: the shipped configuration of the language
(``imagefolder_zh.yaml``, ``imagefolder_ja.yaml``; ``imagefolder.yaml`` with its tokenizer for the
others), through train.py, on a tiny folder of well-formed data.

Checked: every registered tokenizer's run ends without a warning about its captions (words joined
without spaces, as jieba's and MeCab's are written, are still several words), and a run whose
captions have no font (Chinese and Japanese, with the machine's fonts hidden) says so in one line,
with the fix, and nothing of matplotlib's.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path

import matplotlib
import pytest
from matplotlib import font_manager
from PIL import Image
from tool_runs import REPO, in_process

from captioning.data.tokenizers import TOKENIZERS, tokenizer_for
from captioning.visualization import fonts

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

# Six colours, one caption each: a tiny model learns them in a few epochs, so its captions are
# well-formed and differ from image to image.
COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (140, 30, 200), (240, 240, 240)]
CHINESE = [
    "一个红色的圆形",
    "一个绿色的正方形",
    "一个蓝色的三角形",
    "一个黄色的圆形",
    "一个紫色的正方形",
    "一个白色的三角形",
]
CAPTIONS = {
    "ptb": ["a red circle", "a green square", "a blue triangle", "a yellow circle", "a purple square",
            "a white triangle"],
    "whitespace": ["một hình_tròn đỏ", "một hình_vuông xanh_lá", "một tam_giác xanh_dương",
                   "một hình_tròn vàng", "một hình_vuông tím", "một tam_giác trắng"],
    "characters": CHINESE,
    "jieba": CHINESE,
    "mecab": ["赤い丸があります", "緑の四角があります", "青い三角があります", "黄色い丸があります",
              "紫の四角があります", "白い三角があります"],
}  # fmt: skip
CONFIGS = {"jieba": "imagefolder_zh.yaml", "mecab": "imagefolder_ja.yaml"}
TINY = {
    "model.encoder.image_size": 64,
    "model.decoder.embed_dim": 16,
    "model.decoder.hidden_dim": 32,
    "model.decoder.attention_dim": 16,
    "model.decoder.dropout": 0.0,
    "train.epochs": 5,
    "train.batch_size": 4,
    "train.lr": 0.01,
    "decode.beam_size": 2,
    "decode.batch_size": 8,
    "decode.max_length": 12,
}
DEGENERATE = ("captions are empty", "captions are the same")


def write_folder(root: Path, captions: list[str]) -> None:
    """36 images: 24 to train on, 6 to validate, 6 to test, each colour in every split."""
    root.mkdir(parents=True)
    rows = []
    for k in range(36):
        name = f"{k:02d}.png"
        Image.new("RGB", (48, 40), COLOURS[k % 6]).save(root / name)
        split = "test" if k >= 30 else "val" if k >= 24 else "train"
        rows.append({"file_name": name, "caption": captions[k % 6], "split": split})
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (root / "metadata.jsonl").write_text(text, encoding="utf-8")


def train(cwd: Path, tokenizer: str):
    values = {**TINY, "data.root": "mine", "train.output_dir": "run"}
    if tokenizer not in CONFIGS:
        values["data.tokenizer"] = tokenizer
    config = REPO / "configs" / CONFIGS.get(tokenizer, "imagefolder.yaml")
    flags = [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
    return in_process("train.py", "--no-progress", "--config", config, *flags, cwd=cwd)


@pytest.fixture
def no_cjk_font(monkeypatch):
    """Figures see only matplotlib's own fonts (no CJK glyphs), whatever this machine has installed."""
    bundled = str(Path(matplotlib.get_data_path()) / "fonts")
    own = [font for font in font_manager.fontManager.ttflist if font.fname.startswith(bundled)]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", own)

    def forget() -> None:
        fonts.font_families.cache_clear()
        fonts._drawn_characters.cache_clear()
        font_manager.fontManager._findfont_cached.cache_clear()

    forget()
    yield
    monkeypatch.undo()
    forget()


def test_every_tokenizer_is_tried():
    assert set(CAPTIONS) == set(TOKENIZERS.names())


@pytest.mark.parametrize("tokenizer", sorted(CAPTIONS))
def test_a_run_in_each_language_ends_without_a_warning_about_its_captions(
    tmp_path, tokenizer, request, monkeypatch, caplog
):
    cjk = tokenizer in ("characters", "jieba", "mecab")
    if cjk:  # and no font for them: the run says so once, matplotlib says nothing
        request.getfixturevalue("no_cjk_font")
    which = shutil.which  # the pure-Python scorers: no Java, a shorter run
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "java" else which(name, *a, **k)
    )
    write_folder(tmp_path / "mine", CAPTIONS[tokenizer])
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        result = train(tmp_path, tokenizer)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    assert f"tokenizer: {tokenizer}" in (run / "config.yaml").read_text(encoding="utf-8")

    # The last validation's captions and the test captions are well-formed, and nothing says otherwise.
    last_epoch = [line for line in result.stdout.splitlines() if line.startswith("[xe] epoch")][-1]
    after_training = result.stdout.split("test split (")[1] + result.stderr
    assert not any(words in last_epoch or words in after_training for words in DEGENERATE), result.stdout
    captions = [item["caption"] for item in json.loads((run / "test_results.json").read_text())]
    assert len(set(captions)) >= 3 and all(len(tokenizer_for(tokenizer)(text)) >= 3 for text in captions)
    if tokenizer in ("jieba", "mecab"):
        assert not any(" " in text for text in captions)  # one "word" to str.split(): the old false warning
    scores = json.loads((run / "test_scores.json").read_text())
    assert scores["tokenizer"] == ("python" if tokenizer == "ptb" else tokenizer)  # ptb without Java
    if tokenizer != "ptb":
        assert scores["unavailable"]["METEOR"].endswith(f"scored with the {tokenizer} tokenizer, not ptb")

    # Figures were drawn; only captions without a font are named, in one line with the fix.
    assert list((run / "figures").glob("*.png"))
    lines = result.stderr.splitlines()
    if cjk:
        assert len(lines) == 1, result.stderr
        assert (
            lines[0].startswith("warning: ") and ") are in no installed font, so the figures draw" in lines[0]
        )
        assert "apt install fonts-noto-cjk" in lines[0] and "~/.cache/matplotlib" in lines[0]
        assert CAPTIONS[tokenizer][0][1] in lines[0]  # a character it lacks
    else:
        assert lines == [], result.stderr
    assert not [w for w in caught if "Glyph" in str(w.message)]
    assert not [r for r in caplog.records if r.name.startswith("matplotlib")]
    assert "Glyph" not in result.stdout + result.stderr and "findfont" not in result.stdout + result.stderr
