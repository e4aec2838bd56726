"""The dataset readers on tiny files in each real format: Karpathy split JSON, COCO captions, a folder."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from messages import raises_naming
from PIL import Image

from captioning.config import CocoDataConfig, KarpathyDataConfig
from captioning.data import coco, divide_official_val, load_records
from captioning.data.coco import read_coco
from captioning.data.folder import read_folder
from captioning.data.images import load_image
from captioning.data.karpathy import read_karpathy
from captioning.data.records import DatasetError, records_of_split


def _edit_karpathy(split_file: Path, edit) -> Path:
    """Apply ``edit`` to the split file's parsed JSON and write it back."""
    data = json.loads(split_file.read_text(encoding="utf-8"))
    edit(data)
    split_file.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return split_file


# Karpathy split files -------------------------------------------------------------------------------


def test_karpathy_reads_ids_paths_splits_and_captions(karpathy_dataset):
    split_file, root = karpathy_dataset
    records = read_karpathy(split_file, root)
    assert [r.image_id for r in records] == [9, 25, 30, 42, 73]  # cocoid, not imgid
    assert [r.split for r in records] == ["train", "train", "train", "val", "test"]  # restval joined train
    first = records[0]
    assert first.path == root / "train2014" / "COCO_train2014_000000000009.jpg"
    assert first.path.is_file()
    assert first.captions[0] == ("a", "dog", "runs", "on", "the", "grass")
    assert first.raw[0] == "A dog runs on the grass."
    assert len(first.captions) == len(first.raw) == 5


def test_karpathy_keeps_restval_when_asked(karpathy_dataset):
    split_file, root = karpathy_dataset
    records = read_karpathy(split_file, root, restval_to_train=False)
    assert [r.image_id for r in records_of_split(records, "restval")] == [30]


def test_karpathy_flickr_schema_uses_imgid_and_no_filepath(tmp_path, write_json):
    data = {
        "dataset": "flickr8k",
        "images": [
            {
                "filename": "1000268201_693b08cb0e.jpg",
                "imgid": 0,
                "split": "test",
                "sentids": [0],
                "sentences": [
                    {
                        "tokens": ["A", "child", "in", "pink"],
                        "raw": "A child in pink .",
                        "imgid": 0,
                        "sentid": 0,
                    }
                ],
            },
        ],
    }
    split_file = write_json(tmp_path / "dataset_flickr8k.json", data)
    records = read_karpathy(split_file, tmp_path / "Flicker8k_Dataset")
    assert records[0].image_id == 0
    assert records[0].path == tmp_path / "Flicker8k_Dataset" / "1000268201_693b08cb0e.jpg"
    assert records[0].captions == (("a", "child", "in", "pink"),)  # given tokens, lower-cased


def test_karpathy_keeps_non_ascii_text(karpathy_dataset):
    split_file, root = karpathy_dataset

    def add_accents(data):
        sentence = data["images"][0]["sentences"][0]
        sentence.update(tokens=["Un", "café", "à", "Zürich"], raw="Un café à Zürich.")

    records = read_karpathy(_edit_karpathy(split_file, add_accents), root)
    assert records[0].captions[0] == ("un", "café", "à", "zürich")
    assert records[0].raw[0] == "Un café à Zürich."


def test_karpathy_skips_empty_captions_and_drops_uncaptioned_images(karpathy_dataset, caplog):
    split_file, root = karpathy_dataset

    def blank(data):
        data["images"][0]["sentences"][1].update(tokens=[], raw="   ")
        data["images"][0]["sentences"][2].update(tokens=[" "], raw="")
        for sentence in data["images"][1]["sentences"]:
            sentence.update(tokens=[], raw="")

    with caplog.at_level(logging.WARNING, logger="captioning.data.karpathy"):
        records = read_karpathy(_edit_karpathy(split_file, blank), root)
    assert [r.image_id for r in records] == [9, 30, 42, 73]
    assert len(records[0].captions) == 3
    # Scoring keeps every reference as the official toolkit does, empty ones too.
    assert len(records[0].raw) == 5 and records[0].raw[1:3] == ("   ", "")
    assert "skipped 4 empty captions" in caplog.text
    assert "skipped 1 images with no caption" in caplog.text and "cocoid 25" in caplog.text


def test_karpathy_not_json(tmp_path):
    bad = tmp_path / "dataset_coco.json"
    bad.write_text('{"images": [', encoding="utf-8")
    with raises_naming(DatasetError, "dataset_coco.json", "JSON"):
        read_karpathy(bad, tmp_path)


def test_karpathy_missing_file(tmp_path):
    with raises_naming(DatasetError, tmp_path / "dataset_coco.json", "not found"):
        read_karpathy(tmp_path / "dataset_coco.json", tmp_path)


@pytest.mark.parametrize("data", [[], {"dataset": "coco"}, {"images": {}}])
def test_karpathy_wrong_top_level(tmp_path, write_json, data):
    with pytest.raises(DatasetError, match=r"^dataset_coco\.json: "):
        read_karpathy(write_json(tmp_path / "dataset_coco.json", data), tmp_path)


def test_karpathy_missing_field_names_file_and_entry(karpathy_dataset):
    split_file, root = karpathy_dataset
    _edit_karpathy(split_file, lambda data: data["images"][3].pop("sentences"))
    with raises_naming(DatasetError, "dataset_coco.json", "image 3", "cocoid 42", "'sentences'"):
        read_karpathy(split_file, root)


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        (lambda d: d["images"][1].update(cocoid=9), ("image 1 (cocoid 9)", "image id 9", "image 0")),
        (lambda d: d["images"][1].update(split="holdout"), ("image 1 (cocoid 25)", "'holdout'")),
        (lambda d: d["images"][2].update(cocoid="30"), ("image 2", "'cocoid'", "'30'")),
        (
            lambda d: d["images"][0]["sentences"][1].pop("tokens"),
            ("image 0 (cocoid 9) sentence 1", "'tokens'"),
        ),
        (
            lambda d: d["images"][0]["sentences"][1].update(tokens="a dog"),
            ("sentence 1", "'tokens'", "'a dog'"),
        ),
        (
            lambda d: d["images"][0].update(filename="../../etc/passwd"),
            ("image 0", "../../etc/passwd", "'..'"),
        ),
        (lambda d: d["images"][0].update(filepath="/abs/train2014"), ("image 0", "'/abs/train2014/")),
    ],
)
def test_karpathy_bad_entries(karpathy_dataset, edit, names):
    split_file, root = karpathy_dataset
    with raises_naming(DatasetError, "dataset_coco.json", *names):
        read_karpathy(_edit_karpathy(split_file, edit), root)


# COCO caption annotations ---------------------------------------------------------------------------


def test_coco_reads_standard_layout(coco_dataset, capsys):
    annotation_files, root = coco_dataset
    records = read_coco(annotation_files, root)
    assert capsys.readouterr().out == ""  # pycocotools' progress prints are silenced
    assert [(r.image_id, r.split) for r in records] == [
        (9, "train"),
        (25, "train"),
        (30, "val"),
        (42, "val"),
        (73, "val"),
    ]
    assert records[0].path == root / "train2014" / "COCO_train2014_000000000009.jpg"
    assert records[0].captions == (
        ("a", "dog", "runs", "on", "the", "grass"),
        ("a", "brown", "dog", "running"),
    )
    assert records[0].raw[1] == "A brown dog, running!"
    assert all(r.path.is_file() for r in records)


def test_coco_2017_layout_takes_folder_from_file_name(tmp_path, write_json):
    data = {
        "images": [{"id": 397133, "file_name": "000000397133.jpg"}],
        "annotations": [{"id": 1, "image_id": 397133, "caption": "A man in a kitchen."}],
    }
    records = read_coco([write_json(tmp_path / "captions_val2017.json", data)], tmp_path / "coco")
    assert records[0].path == tmp_path / "coco" / "val2017" / "000000397133.jpg"
    assert records[0].split == "val"


def test_coco_karpathy_resplit(coco_dataset, karpathy_dataset, caplog):
    annotation_files, root = coco_dataset
    split_file, _ = karpathy_dataset
    _edit_karpathy(split_file, lambda data: data["images"].pop(1))  # cocoid 25 is not in the split file
    with caplog.at_level(logging.WARNING):
        records = read_coco(annotation_files, root, karpathy_split_file=split_file)
    assert [(r.image_id, r.split) for r in records] == [
        (9, "train"),
        (30, "train"),
        (42, "val"),
        (73, "test"),
    ]
    assert "skipped 1 images not in the Karpathy split file" in caplog.text


def test_coco_skips_empty_captions(coco_dataset, write_json, caplog):
    annotation_files, root = coco_dataset
    data = json.loads(annotation_files[1].read_text())
    data["annotations"][0]["caption"] = " . "
    write_json(annotation_files[1], data)
    with caplog.at_level(logging.WARNING):
        records = read_coco(annotation_files, root)
    assert 30 not in [r.image_id for r in records]
    assert "skipped 1 empty captions" in caplog.text
    assert {r.name for r in caplog.records if "skipped" in r.getMessage()} == {"captioning.data.coco"}
    train = json.loads(annotation_files[0].read_text())
    train["annotations"][1]["caption"] = "..."  # image 9's second caption
    write_json(annotation_files[0], train)
    nine = next(r for r in read_coco(annotation_files, root) if r.image_id == 9)
    assert len(nine.captions) == 1 and nine.raw == ("A dog runs on the grass.", "...")  # kept for scoring


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        (lambda d: d.pop("annotations"), ("'annotations'",)),
        (
            lambda d: d["annotations"][0].update(image_id=5),
            ("annotation 0 (id 3000)", "image_id 5", "'images'"),
        ),
        (lambda d: d["annotations"][1].pop("caption"), ("annotation 1 (id 4200)", "'caption'")),
        (lambda d: d["images"][0].pop("file_name"), ("image 30", "'file_name'")),
        (lambda d: d["images"][1].update(id=30), ("image 1", "image id 30")),
        (
            lambda d: d["images"][0].update(file_name="../../secret.jpg"),
            ("image 30", "../../secret.jpg", "'..'"),
        ),
    ],
)
def test_coco_bad_entries(coco_dataset, write_json, edit, names):
    annotation_files, root = coco_dataset
    data = json.loads(annotation_files[1].read_text())
    edit(data)
    write_json(annotation_files[1], data)
    with raises_naming(DatasetError, "captions_val2014.json", *names):
        read_coco(annotation_files, root)


def test_coco_bad_files(coco_dataset, tmp_path, write_json):
    annotation_files, root = coco_dataset
    not_json = tmp_path / "captions_train2014.json"
    not_json.write_text("{oops", encoding="utf-8")
    with raises_naming(DatasetError, "captions_train2014.json", "JSON"):
        read_coco([not_json], root)
    with raises_naming(DatasetError, "captions_val2014.json", "'images'", "'annotations'", "list"):
        read_coco([write_json(tmp_path / "captions_val2014.json", [1, 2])], root)
    with raises_naming(DatasetError, "my_captions.json", "split", "train, val or test", "Karpathy"):
        read_coco([write_json(tmp_path / "my_captions.json", {"images": [], "annotations": []})], root)
    with raises_naming(DatasetError, "captions_train2014.json", "image id 9"):
        read_coco([annotation_files[0], annotation_files[0]], root)


# Image folders --------------------------------------------------------------------------------------


def test_folder_lists_images_sorted_with_ids(tmp_path, make_image):
    for name in ("b.PNG", "a.jpg", "c.JpEg", "d.webp"):
        make_image(tmp_path / name)
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / ".hidden.jpg").write_bytes(b"")
    make_image(tmp_path / "sub" / "e.jpg")
    records = read_folder(tmp_path)
    assert [(r.image_id, r.path.name, r.split, r.captions) for r in records] == [
        (1, "a.jpg", "", ()),
        (2, "b.PNG", "", ()),
        (3, "c.JpEg", "", ()),
        (4, "d.webp", "", ()),
    ]


def test_folder_errors(tmp_path):
    with raises_naming(DatasetError, tmp_path / "missing", "not found"):
        read_folder(tmp_path / "missing")
    (tmp_path / "readme.txt").write_text("hi")
    with raises_naming(DatasetError, tmp_path, ".jpg", ".png"):
        read_folder(tmp_path)


# Image loading: 16-bit grayscale --------------------------------------------------------------------


def _load_gray16(tmp_path: Path, values) -> np.ndarray:
    """Write ``values`` as a 16-bit grayscale PNG, load it with ``load_image``: its (one) RGB channel."""
    path = tmp_path / "gray16.png"
    Image.fromarray(np.asarray(values, dtype=np.uint16)).save(path)
    with Image.open(path) as written:
        assert written.mode in ("I;16", "I;16B", "I;16L", "I")  # really a 16-bit PNG
    image = load_image(path)
    assert image.mode == "RGB"
    rgb = np.asarray(image)
    assert (rgb == rgb[..., :1]).all()  # gray
    return rgb[..., 0]


@pytest.mark.parametrize(("value", "expected"), [(65535, 255), (0, 0)])
def test_load_image_uniform_16bit_gray_keeps_its_level(tmp_path, value, expected):
    assert (_load_gray16(tmp_path, np.full((6, 8), value)) == expected).all()


def test_load_image_16bit_gray_scales_by_the_full_range(tmp_path):
    values = [0, 128, 129, 257, 514, 1000, 32767, 32768, 65278, 65535]
    loaded = _load_gray16(tmp_path, [values])[0]
    assert loaded.tolist() == [0, 0, 1, 1, 2, 4, 127, 128, 254, 255]  # round(v * 255 / 65535)
    gradient = np.arange(0, 65536, 37)[None, :]
    scaled = _load_gray16(tmp_path, gradient)[0].astype(int)
    assert (np.diff(scaled) >= 0).all() and scaled[0] == 0
    assert np.abs(scaled - gradient[0] / 257).max() <= 0.5


def test_load_image_nearly_black_16bit_gray_stays_nearly_black(tmp_path):
    values = np.linspace(200, 300, 48).reshape(6, 8)
    assert _load_gray16(tmp_path, values).max() <= 1


def test_load_image_32bit_gray_is_read_as_16bit_and_clipped(tmp_path):
    path = tmp_path / "gray32.tif"
    Image.fromarray(np.array([[-5, 0, 257, 32768, 65535, 70000]], dtype=np.int32)).save(path)
    with Image.open(path) as written:
        assert written.mode == "I"
    assert np.asarray(load_image(path))[0, :, 0].tolist() == [0, 0, 1, 128, 255, 255]


# Per-split dataset index ------------------------------------------------------------------------------


def _index_folders(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "records").glob("*-*"))


def test_karpathy_index_is_written_by_a_run_then_read_split_by_split_without_parsing(
    karpathy_dataset, tmp_path, monkeypatch
):
    split_file, root = karpathy_dataset
    config = KarpathyDataConfig(split_file=str(split_file), root=str(root), cache_dir=str(tmp_path / "c"))
    assert load_records(config) == read_karpathy(split_file, root)
    assert _index_folders(tmp_path / "c") == []  # tools without a run folder (evaluate.py) only read an index
    first = load_records(config, output_dir=tmp_path / "run")
    (folder,) = _index_folders(tmp_path / "c")
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "test.npz", "train.npz", "val.npz"]

    def no_parsing(path):
        raise AssertionError(f"{path} parsed again")

    monkeypatch.setattr("captioning.data.karpathy.read_json", no_parsing)
    assert load_records(config) == first
    assert load_records(config, splits=("test",)) == records_of_split(first, "test")
    moved = KarpathyDataConfig(
        split_file=str(split_file),
        root=str(tmp_path / "moved"),
        cache_dir=str(tmp_path / "c"),
    )
    (tmp_path / "moved").mkdir()  # the images' new home (data paths are checked before the index answers)
    assert [r.path for r in load_records(moved)] == [
        tmp_path / "moved" / r.path.relative_to(root) for r in first
    ]
    monkeypatch.undo()

    _edit_karpathy(
        split_file, lambda data: data["images"][4]["sentences"][0].update(tokens=["A", "new", "bus"])
    )
    changed = load_records(config, output_dir=tmp_path / "run")
    assert changed[4].captions[0] == ("a", "new", "bus") and changed[:4] == first[:4]
    assert len(_index_folders(tmp_path / "c")) == 2  # a new index for the changed file


def test_karpathy_index_repeats_the_readers_warnings(karpathy_dataset, tmp_path, caplog):
    split_file, root = karpathy_dataset
    _edit_karpathy(split_file, lambda data: data["images"][0]["sentences"][0].update(tokens=[" "]))
    config = KarpathyDataConfig(split_file=str(split_file), root=str(root), cache_dir=str(tmp_path / "c"))
    for _ in range(2):  # the first read parses, the second reads the index
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="captioning.data"):
            load_records(config, output_dir=tmp_path / "run")
        assert "dataset_coco.json: skipped 1 empty captions" in caplog.text
    assert len(_index_folders(tmp_path / "c")) == 1


def test_coco_index_keeps_the_tokenization(coco_dataset, tmp_path, write_json, monkeypatch):
    annotation_files, root = coco_dataset
    config = CocoDataConfig(
        annotations=tuple(map(str, annotation_files)),
        root=str(root),
        cache_dir=str(tmp_path / "c"),
    )
    calls = {"n": 0}
    real_tokenize = coco.tokenize

    def counting(text):
        calls["n"] += 1
        return real_tokenize(text)

    monkeypatch.setattr(coco, "tokenize", counting)
    first = load_records(config, output_dir=tmp_path / "run")
    assert calls["n"] == 6 and first == divide_official_val(read_coco(annotation_files, root))
    calls["n"] = 0
    assert load_records(config, output_dir=tmp_path / "run") == first and calls["n"] == 0  # not re-tokenized
    assert load_records(config, splits=("val",)) == records_of_split(first, "val")

    data = json.loads(annotation_files[1].read_text())
    data["annotations"][0]["caption"] = "A woman rides a horse."
    write_json(annotation_files[1], data)
    changed = load_records(config, output_dir=tmp_path / "run")
    assert calls["n"] == 6 and changed[2].captions == (("a", "woman", "rides", "a", "horse"),)
