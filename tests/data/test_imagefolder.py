"""The image-folder reader (``data.dataset: imagefolder``): both layouts, both formats, and every bad row."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from messages import raises_naming

from captioning.config import DataConfig
from captioning.data import load_records, split_rule
from captioning.data.imagefolder import SPLIT_RULE, read_imagefolder
from captioning.data.records import DatasetError
from captioning.data.tokenizers import tokenize_characters


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture
def jsonl_folder(tmp_path, make_image) -> Path:
    """12 images at the root, no split: image k has one caption row, image 1 a second row and a list."""
    root = tmp_path / "mine"
    for k in range(1, 13):
        make_image(root / f"img{k:02d}.png")
    rows = [{"file_name": f"img{k:02d}.png", "caption": f"A red square number {k}."} for k in range(1, 13)]
    rows.insert(1, {"file_name": "img01.png", "text": ["Two words", "and three more"]})
    write_jsonl(root / "metadata.jsonl", rows)
    return root


def test_jsonl_rows_merge_per_image_and_the_rule_makes_val_and_test(jsonl_folder):
    records = read_imagefolder(jsonl_folder)
    assert [r.path.name for r in records] == [f"img{k:02d}.png" for k in range(1, 13)]
    assert [r.image_id for r in records] == list(range(1, 13))
    assert [r.split for r in records] == ["train"] * 8 + ["val", "test", "train", "train"]
    first = records[0]
    assert first.raw == ("A red square number 1.", "Two words", "and three more")
    assert first.captions == (
        ("a", "red", "square", "number", "1"),
        ("two", "words"),
        ("and", "three", "more"),
    )
    assert split_rule(DataConfig(dataset="imagefolder", root=str(jsonl_folder))) == SPLIT_RULE


def test_csv_in_split_folders_keeps_ids_and_takes_the_folders_splits(tmp_path, make_image):
    root = tmp_path / "mine"
    for split, ids in (("train", [10, 11]), ("validation", [20]), ("test", [30])):
        for image_id in ids:
            make_image(root / split / "photos" / f"{image_id}.jpg")
        write_csv(
            root / split / "metadata.csv",
            ["image_id", "file_name", "caption", "extra"],
            [[i, f"photos/{i}.jpg", f"caption of {i}", "ignored"] for i in ids]
            + [[ids[0], f"photos/{ids[0]}.jpg", "a second, with a comma", ""]],
        )
    records = read_imagefolder(root)
    assert [(r.image_id, r.split) for r in records] == [
        (10, "train"),
        (11, "train"),
        (20, "val"),
        (30, "test"),
    ]
    assert records[0].path == root / "train" / "photos" / "10.jpg"
    assert records[0].raw == ("caption of 10", "a second, with a comma")
    assert split_rule(DataConfig(dataset="imagefolder", root=str(root))) is None


def test_the_tokenizer_makes_the_training_tokens(tmp_path, make_image):
    make_image(tmp_path / "a.png")
    write_jsonl(
        tmp_path / "metadata.jsonl",
        [{"file_name": "a.png", "caption": "一只狗在草地上跑。", "split": "train"}],
    )
    (record,) = read_imagefolder(tmp_path, tokenize_characters)
    assert record.captions == (("一", "只", "狗", "在", "草", "地", "上", "跑"),)
    assert record.raw == ("一只狗在草地上跑。",)


def test_load_records_reads_it_and_states_the_rule_in_the_summary(jsonl_folder, tmp_path):
    config = DataConfig(dataset="imagefolder", root=str(jsonl_folder), tokenizer="whitespace")
    records = load_records(config, output_dir=tmp_path)
    assert records[0].captions[0] == ("a", "red", "square", "number", "1.")  # whitespace keeps "1." whole
    summary = json.loads((tmp_path / "data_summary.json").read_text())
    assert summary["split_rule"] == SPLIT_RULE
    assert summary["splits"]["train"]["images"] == 10 and summary["splits"]["test"]["captions"] == 1


ROW = {"file_name": "a.png", "caption": "a cat", "split": "train", "image_id": 1}


@pytest.mark.parametrize(
    ("second", "names"),
    [
        ({**ROW, "file_name": "missing.png", "image_id": 2}, ("'missing.png'",)),
        ({**ROW, "caption": "  "}, ("caption",)),
        ({**ROW, "caption": "..."}, ("'...'",)),
        ({**ROW, "caption": []}, ("'caption'", "[]")),
        ({**ROW, "caption": 3}, ("'caption'", "3")),
        ({**ROW, "split": "dev"}, ("'dev'", "train, val")),
        ({**ROW, "file_name": "b.png", "image_id": 1}, ("image_id 1", "'b.png'", "'a.png'", "line 1")),
        ({**ROW, "image_id": 7}, ("'a.png'", "image_id 7", "line 1")),
        ({**ROW, "split": "test"}, ("'a.png'", "'test'", "'train'", "line 1")),
        ({**ROW, "image_id": "x"}, ("'image_id'", "'x'")),
        ({**ROW, "image_id": "--5"}, ("'image_id'", "'--5'")),
        ({**ROW, "image_id": "4_2"}, ("'image_id'", "'4_2'")),
        ({**ROW, "file_name": "C:img00.png"}, ("'C:img00.png'", "(C:)")),
        ({**ROW, "file_name": "/etc/passwd"}, ("'/etc/passwd'",)),
        ({"file_name": "b.png", "caption": "a dog", "image_id": 2}, ("'split'",)),
        ({**ROW, "file_name": "../a.png"}, ("'../a.png'", "'..'")),
        ({"caption": "a cat"}, ("'file_name'",)),
        ({"file_name": "a.png"}, ("'caption'", "'text'")),
        ({**ROW, "text": "a cat"}, ("'caption'", "'text'")),
        ([1, 2], ("list",)),
    ],
)
def test_a_bad_jsonl_row_is_refused_naming_file_and_line(tmp_path, make_image, second, names):
    make_image(tmp_path / "a.png")
    make_image(tmp_path / "b.png")
    metadata = write_jsonl(tmp_path / "metadata.jsonl", [ROW, second])
    with raises_naming(DatasetError, f"{metadata}: line 2", *names):
        read_imagefolder(tmp_path)


def test_bad_json_and_bad_csv_lines_are_named(tmp_path, make_image):
    make_image(tmp_path / "a.png")
    metadata = tmp_path / "metadata.jsonl"
    metadata.write_text(json.dumps(ROW) + "\n\n{oops\n", encoding="utf-8")
    with raises_naming(DatasetError, f"{metadata}: line 3", "JSON"):
        read_imagefolder(tmp_path)
    metadata.unlink()
    metadata = tmp_path / "metadata.csv"
    metadata.write_text("file_name,caption\na.png,a cat\na.png,a cat,extra\n", encoding="utf-8")
    with raises_naming(DatasetError, f"{metadata}: line 3", "more", "2") as more:
        read_imagefolder(tmp_path)
    metadata.write_text("file_name,caption\na.png,a cat\na.png\n", encoding="utf-8")
    with raises_naming(DatasetError, f"{metadata}: line 3", "fewer", "2") as fewer:
        read_imagefolder(tmp_path)
    assert str(more.value) != str(fewer.value)  # too many and too few fields are told apart
    metadata.write_bytes(b"file_name,caption\na.png,\xff\xfe\n")
    with raises_naming(DatasetError, metadata, "UTF-8"):
        read_imagefolder(tmp_path)


def test_a_repeated_csv_column_is_refused_naming_the_file_and_the_column(tmp_path, make_image):
    """csv.DictReader keeps only the last of two columns of one name: refused, not trained on."""
    make_image(tmp_path / "a.png")
    metadata = tmp_path / "metadata.csv"
    metadata.write_text("file_name,caption,caption\na.png,a cat,a dog\n", encoding="utf-8")
    with raises_naming(DatasetError, f"{metadata}: line 1", "'caption'", "2"):
        read_imagefolder(tmp_path)


def test_a_bad_row_in_a_split_folder_names_that_folders_file(tmp_path, make_image):
    make_image(tmp_path / "train" / "a.png")
    write_csv(tmp_path / "train" / "metadata.csv", ["file_name", "caption"], [["a.png", "a cat"]])
    metadata = write_csv(
        tmp_path / "val" / "metadata.csv", ["file_name", "caption", "split"], [["a.png", "a cat", "train"]]
    )
    with raises_naming(DatasetError, f"{metadata}: line 2", "'train'", "val"):
        read_imagefolder(tmp_path)


def test_layout_errors(tmp_path, make_image):
    with raises_naming(DatasetError, tmp_path, "metadata.jsonl", "metadata.csv", "train/"):
        read_imagefolder(tmp_path)
    write_jsonl(tmp_path / "metadata.jsonl", [ROW])
    write_csv(tmp_path / "metadata.csv", ["file_name", "caption"], [["a.png", "a cat"]])
    with raises_naming(DatasetError, tmp_path, "metadata.jsonl", "metadata.csv"):
        read_imagefolder(tmp_path)
    (tmp_path / "metadata.csv").write_text("file_name,caption\n", encoding="utf-8")
    (tmp_path / "metadata.jsonl").unlink()
    with raises_naming(DatasetError, tmp_path / "metadata.csv", "rows"):
        read_imagefolder(tmp_path)
    write_jsonl(tmp_path / "train" / "metadata.jsonl", [ROW])
    with raises_naming(DatasetError, tmp_path / "metadata.csv", tmp_path / "train" / "metadata.jsonl"):
        read_imagefolder(tmp_path)


def test_a_folder_named_as_an_image_is_refused(tmp_path):
    (tmp_path / "a.png").mkdir()
    metadata = write_jsonl(tmp_path / "metadata.jsonl", [ROW])
    with raises_naming(DatasetError, f"{metadata}: line 1", "'a.png'", "folder"):
        read_imagefolder(tmp_path)


def test_fifos_are_refused_without_waiting_for_a_writer(tmp_path, make_image):
    os.mkfifo(tmp_path / "metadata.jsonl")
    with raises_naming(DatasetError, tmp_path / "metadata.jsonl", "FIFO"):
        read_imagefolder(tmp_path)
    (tmp_path / "metadata.jsonl").unlink()
    os.mkfifo(tmp_path / "a.png")
    metadata = write_jsonl(tmp_path / "metadata.jsonl", [ROW])
    with raises_naming(DatasetError, f"{metadata}: line 1", "'a.png'", "FIFO"):
        read_imagefolder(tmp_path)
