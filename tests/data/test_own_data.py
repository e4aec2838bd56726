"""Your own images end to end: image folders in both formats and layouts, captions in Chinese and in
pre-tokenised Vietnamese, and the example of docs/own-data.md, through train.py, evaluate.py and
visualize.py (in this process, tests/tool_runs.py) on tiny models.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from tool_runs import REPO, in_process

from captioning.data.imagefolder import SPLIT_RULE
from captioning.data.tokenizers import tokenizer_for, tokenizer_version
from captioning.evaluation.signature import parse_signature
from captioning.hub.checkpoint import checkpoint_config, load_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]
CONFIG = REPO / "configs" / "imagefolder.yaml"
TINY = {
    "model.encoder.weights": "none",
    "model.encoder.image_size": 64,
    "model.decoder.embed_dim": 16,
    "model.decoder.hidden_dim": 32,
    "model.decoder.attention_dim": 16,
    "train.epochs": 1,
    "train.batch_size": 4,
    "decode.beam_size": 2,
    "decode.batch_size": 8,
    "decode.max_length": 12,
}
COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (30, 200, 200), (200, 30, 200)]


def flags(values: dict) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def tool(cwd: Path, script: str, *args) -> subprocess.CompletedProcess:
    return in_process(script, "--no-progress", *args, cwd=cwd)


def train(cwd: Path, root: str, run: str, *args, **values) -> subprocess.CompletedProcess:
    return tool(
        cwd,
        "train.py",
        "--config",
        CONFIG,
        *flags({**TINY, "data.root": root, "train.output_dir": run, **values}),
        *args,
    )


def make_images(folder: Path, names: list[str]) -> None:
    for number, name in enumerate(names):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (48, 40), COLOURS[number % len(COLOURS)]).save(folder / name)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def assert_run_outputs(run: Path, test_images: int) -> dict:
    for name in (
        "checkpoints/best.pt",
        "config.yaml",
        "vocab.json",
        "data_summary.json",
        "test_results.json",
        "test_scores.json",
        "report.html",
    ):
        assert (run / name).is_file(), name
    assert len(json.loads((run / "test_results.json").read_text())) == test_images
    assert list((run / "figures").glob("*.png"))
    return json.loads((run / "test_scores.json").read_text())


def test_a_jsonl_folder_without_splits_trains_evaluates_and_visualises(tmp_path):
    names = [f"photo{k:02d}.jpg" for k in range(20)]
    make_images(tmp_path / "mine", names)
    colours = ["red", "green", "blue", "yellow", "cyan", "purple"]
    write_jsonl(
        tmp_path / "mine" / "metadata.jsonl",
        [
            {"file_name": name, "caption": [f"A {colours[k % 6]} picture.", f"The {colours[k % 6]} one"]}
            for k, name in enumerate(names)
        ],
    )
    result = train(tmp_path, "mine", "run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"images: train 16, val 2 (validating on 2), test 2 (scored at the end); {SPLIT_RULE};"
        in result.stdout
    )
    assert json.loads((tmp_path / "run" / "data_summary.json").read_text())["split_rule"] == SPLIT_RULE
    scores = assert_run_outputs(tmp_path / "run", test_images=2)
    assert scores["tokenizer"] in ("ptb", "python")  # English: the Java tokenizer when there is Java
    tested = sorted(r["image_id"] for r in json.loads((tmp_path / "run" / "test_results.json").read_text()))
    assert tested == [10, 20]  # the 10th of every 10, numbered from 1 in file order

    checkpoint = tmp_path / "run" / "checkpoints" / "best.pt"
    result = tool(tmp_path, "evaluate.py", "--checkpoint", checkpoint, "--split", "val", "--no-java")
    assert result.returncode == 0, result.stderr[-2000:]
    val = json.loads((tmp_path / "run" / "eval_best_val_scores.json").read_text())
    assert val["images"] == 2 and val["CIDEr-D"] is not None
    result = tool(
        tmp_path,
        "visualize.py",
        "--checkpoint",
        checkpoint,
        "--split",
        "test",
        "--num",
        "2",
        "--out-dir",
        tmp_path / "figures",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list((tmp_path / "figures").glob("*.png"))) == 2


def test_csv_files_in_split_folders_train_and_evaluate(tmp_path):
    for split, count in (("train", 8), ("validation", 2), ("test", 3)):
        names = [f"{split}_{k}.png" for k in range(count)]
        make_images(tmp_path / "mine" / split, names)
        with open(tmp_path / "mine" / split / "metadata.csv", "w", encoding="utf-8", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["file_name", "text", "image_id"])
            for k, name in enumerate(names):
                image_id = 1000 * len(split) + k
                writer.writerows(
                    [[name, f"a small picture, number {k % 3}", image_id], [name, "a picture", image_id]]
                )
    result = train(tmp_path, "mine", "run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "images: train 8, val 2 (validating on 2), test 3 (scored at the end);" in result.stdout
    assert "split_rule" not in json.loads((tmp_path / "run" / "data_summary.json").read_text())
    assert_run_outputs(tmp_path / "run", test_images=3)
    tested = {r["image_id"] for r in json.loads((tmp_path / "run" / "test_results.json").read_text())}
    assert tested == {4000, 4001, 4002}
    result = tool(
        tmp_path,
        "evaluate.py",
        "--checkpoint",
        tmp_path / "run" / "checkpoints" / "best.pt",
        "--split",
        "test",
        "--no-java",
    )
    assert result.returncode == 0, result.stderr[-2000:]


CHINESE = [
    "一只红色的狗在草地上跑。",
    "两只绿色的猫坐在沙发上。",
    "一个蓝色的球在桌子上。",
    "黄色的花开在花园里。",
    "一辆红色的车停在路边。",
    "绿色的树下有一个人。",
]
VIETNAMESE = [
    "một con_chó màu đỏ đang chạy .",
    "hai con_mèo màu xanh ngồi trên ghế .",
    "một quả_bóng màu xanh_dương",
    "những bông_hoa màu vàng",
    "một chiếc xe_hơi màu đỏ",
    "một người dưới cây xanh",
]


@pytest.mark.parametrize(("tokenizer", "captions"), [("characters", CHINESE), ("whitespace", VIETNAMESE)])
def test_captions_in_other_languages_train_and_score_on_their_tokens(tmp_path, tokenizer, captions):
    names = [f"{k:02d}.png" for k in range(20)]
    make_images(tmp_path / "mine", names)
    write_jsonl(
        tmp_path / "mine" / "metadata.jsonl",
        [
            {
                "file_name": name,
                "caption": captions[k % 6],
                "split": "test" if k >= 17 else "val" if k >= 15 else "train",
            }
            for k, name in enumerate(names)
        ],
    )
    result = train(
        tmp_path,
        "mine",
        "run",
        **{"data.tokenizer": tokenizer, "train.epochs": 2, "train.scst_epochs": 1, "train.scst_samples": 2},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    scores = assert_run_outputs(run, test_images=3)
    history = json.loads((run / "history.json").read_text())["epochs"]
    assert [epoch["stage"] for epoch in history] == ["xe", "xe", "scst"]  # CIDEr-D rewards on the same tokens

    tokenize = tokenizer_for(tokenizer)
    words = json.loads((run / "vocab.json").read_text(encoding="utf-8"))["words"][4:]
    assert set(words) == {token for caption in captions for token in tokenize(caption)}
    if tokenizer == "characters":
        assert all(len(word) == 1 for word in words)
    else:
        assert {"con_chó", "xanh_dương"} <= set(words)
    config, _ = checkpoint_config(
        load_checkpoint(run / "checkpoints" / "best.pt"), run / "checkpoints" / "best.pt"
    )
    assert config.data.tokenizer == tokenizer

    # BLEU and CIDEr-D are the toolkit's, computed on the tokenizer's tokens of results and references.
    results = {r["image_id"]: r["caption"] for r in json.loads((run / "test_results.json").read_text())}
    references = {image_id: [captions[(image_id - 1) % 6]] for image_id in results}
    gts = {i: [" ".join(tokenize(ref)) for ref in refs] for i, refs in references.items()}
    res = {i: [" ".join(tokenize(caption))] for i, caption in results.items()}
    assert all(set(res[i][0].split()) <= set(words) for i in res)
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, _ = Cider().compute_score(gts, res)
    assert scores["BLEU-1"] == pytest.approx(bleu[0]) and scores["BLEU-4"] == pytest.approx(bleu[3])
    assert scores["CIDEr-D"] == pytest.approx(cider)
    assert scores["tokenizer"] == tokenizer
    assert parse_signature(scores["signature"])["tok"] == tokenizer_version(tokenizer) == f"{tokenizer}.v2"
    assert scores["METEOR"] is None and "English only" in scores["unavailable"]["METEOR"]
    assert scores["SPICE"] is None and "English only" in scores["unavailable"]["SPICE"]


def test_a_bad_row_is_refused_before_any_work(tmp_path):
    make_images(tmp_path / "mine", ["a.png"])
    write_jsonl(
        tmp_path / "mine" / "metadata.jsonl",
        [{"file_name": "a.png", "caption": "a cat"}, {"file_name": "b.png", "caption": "a dog"}],
    )
    result = train(tmp_path, "mine", "run")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"error: {Path('mine') / 'metadata.jsonl'}: line 2: image file 'b.png' not found "
        f"({Path('mine') / 'b.png'})"
    )
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "mine" / "features").exists()


def _page_blocks(language: str) -> list[str]:
    page = (REPO / "docs" / "own-data.md").read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", page, flags=re.DOTALL)


def test_the_docs_example_trains_and_captions_with_the_pages_two_commands(tmp_path):
    metadata = _page_blocks("jsonl")[0]
    assert len(metadata.splitlines()) == 10
    folder = tmp_path / "my_photos"
    folder.mkdir()
    (folder / "metadata.jsonl").write_text(metadata, encoding="utf-8")
    make_images(folder, [json.loads(line)["file_name"] for line in metadata.splitlines()])
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / CONFIG.name).write_bytes(CONFIG.read_bytes())  # run as from the repository
    commands = [command.split() for command in _page_blocks("bash")[0].splitlines()]
    assert [command[:2] for command in commands] == [["python", "train.py"], ["python", "evaluate.py"]]
    result = tool(tmp_path, *commands[0][1:], *flags(TINY))  # the page's command, on a tiny model
    assert result.returncode == 0, result.stderr[-3000:]
    result = tool(tmp_path, *commands[1][1:])
    assert result.returncode == 0, result.stderr[-3000:]
    captions = json.loads((tmp_path / "runs" / "my_photos" / "eval_best_images_results.json").read_text())
    assert len(captions) == 10 and all(isinstance(c["caption"], str) for c in captions)
    assert list((folder / "features").iterdir())  # where the page says the features are cached


def test_segmented_chinese_captions_read_without_spaces_in_every_output(tmp_path):
    """jieba's words are joined as Chinese is written in the results, the report, the figures'
    captions, visualize.py's summary, evaluate.py --images and the Python API."""
    import captioning

    names = [f"{k:02d}.png" for k in range(20)]
    make_images(tmp_path / "mine", names)
    write_jsonl(
        tmp_path / "mine" / "metadata.jsonl",
        [
            {
                "file_name": name,
                "caption": CHINESE[k % 6],
                "split": "test" if k >= 17 else "val" if k >= 15 else "train",
            }
            for k, name in enumerate(names)
        ],
    )
    result = train(tmp_path, "mine", "run", **{"data.tokenizer": "jieba", "train.epochs": 4})
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    assert_run_outputs(run, test_images=3)
    vocabulary = set(json.loads((run / "vocab.json").read_text(encoding="utf-8"))["words"][4:])
    assert {"红色", "草地"} <= vocabulary  # jieba's words, not characters

    model = captioning.load(run / "checkpoints" / "best.pt")
    pictures = [tmp_path / "mine" / name for name in names[17:]]
    captions = model.caption(pictures)
    assert any(len(caption.words) >= 2 for caption in captions)  # something to join
    for caption in captions:
        assert caption.text == "".join(caption.words) and " " not in caption.text
    figure = captioning.show(captions[0], pictures[0])
    assert figure.axes[0].get_title().replace("\n", "").startswith("".join(captions[0].words) or "(empty")

    results = json.loads((run / "test_results.json").read_text(encoding="utf-8"))
    assert all(" " not in entry["caption"] for entry in results)
    report = (run / "report.html").read_text(encoding="utf-8")
    assert all(entry["caption"] in report for entry in results if entry["caption"])

    shown = tool(
        tmp_path,
        "visualize.py",
        "--checkpoint",
        run / "checkpoints" / "best.pt",
        "--out-dir",
        tmp_path / "shown",
        pictures[0],
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    (words,) = [c.words for c in model.caption([pictures[0]])]
    assert f"{pictures[0].name}: {''.join(words) or '(empty caption)'}" in shown.stdout
    (tmp_path / "few").mkdir()
    for picture in pictures:
        (tmp_path / "few" / picture.name).write_bytes(picture.read_bytes())
    listed = tool(
        tmp_path, "evaluate.py", "--checkpoint", run / "checkpoints" / "best.pt", "--images", tmp_path / "few"
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    for picture, caption in zip(pictures, captions, strict=True):
        assert f"{picture.name}: {caption.text}" in listed.stdout
