"""Small promises, one line each: a YAML key given twice, an empty configuration, a filesystem root as
an output folder and ``save_pretrained("~/...")`` (the cache's full-disk message for a small file:
``tests/data/test_feature_cache.py::test_full_disk_at_allocation_says_how_much_is_needed``)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_faults import assert_one_line_error
from tool_runs import REPO, in_process

import captioning
from captioning.data import MAX_CAPTIONS_PER_IMAGE
from captioning.data.tokenizers import TOKENIZERS
from captioning.hub.checkpoint import CheckpointError
from captioning.utils.errors import InputError
from captioning.utils.output_paths import RunFolderError, check_output_folder

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("train:\n  epochs: 1\n  epochs: 99999999\n", "key 'epochs' given twice in one section"),
        ("# nothing but a comment\n", "an empty configuration (no section)"),
        ("", "an empty configuration (no section)"),
    ],
)
def test_a_configuration_that_says_nothing_or_a_key_twice_is_refused_before_any_work(tmp_path, text, needle):
    config = tmp_path / "run.yaml"
    config.write_text(text, encoding="utf-8")
    result = in_process("train.py", "--config", config, "--no-progress", cwd=tmp_path, timeout=60)
    assert_one_line_error(result.returncode, result.stderr, f"{config}: ", needle)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run.yaml"]  # no demo data, no run


def test_the_root_of_the_file_system_is_no_output_folder():
    with pytest.raises(RunFolderError, match=r"^/: train.output_dir: the root of the file system"):
        check_output_folder(Path("/"), "train.output_dir")


def test_save_pretrained_expands_a_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    folder = captioning.load(FIXTURE).save_pretrained("~/models/tiny")
    assert Path(folder) == tmp_path / "home" / "models" / "tiny"
    assert (tmp_path / "home" / "models" / "tiny" / "config.json").is_file()
    assert not (tmp_path / "~").exists()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda data: data["images"].append({"file_name": "x.jpg"}), "images[1] has no 'id'"),
        (lambda data: data.update(images=5), "'images' must be a list, got int"),
        (lambda data: data.update(categories=["person"]), "categories[0] is not an object"),
        (lambda data: data.update(categories=[{"name": "person"}]), "categories[0] has no 'id'"),
        (
            lambda data: data.update(categories=[{"id": 1, "name": "a"}]),
            "annotations[0] has no 'category_id'",
        ),
    ],
)
def test_an_annotations_file_pycocotools_cannot_index_is_one_line(tmp_path, edit, needle):
    data = {
        "images": [{"id": 1, "file_name": "a.jpg"}],
        "annotations": [{"id": 1, "image_id": 1, "caption": "a red square"}],
    }
    edit(data)
    annotations = tmp_path / "captions.json"
    annotations.write_text(json.dumps(data), encoding="utf-8")
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 1, "caption": "a red square"}]), encoding="utf-8")
    result = in_process(
        "evaluate.py",
        "--annotations",
        annotations,
        "--results",
        results,
        "--no-java",
        cwd=tmp_path,
        timeout=60,
    )
    assert_one_line_error(result.returncode, result.stderr, f"{annotations}: {needle}")


@pytest.mark.parametrize("name", ["", " "])
def test_an_empty_import_name_is_one_line(tmp_path, name):
    result = in_process("train.py", "--import", name, "--no-progress", cwd=tmp_path, timeout=60)
    assert_one_line_error(result.returncode, result.stderr, "--import", "give a module name or a .py file")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["two\nlines", "", "x" * 61])
def test_a_compare_column_name_that_would_break_the_table_is_one_line(tmp_path, name):
    annotations = tmp_path / "captions.json"
    annotations.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "a.jpg"}],
                "annotations": [{"id": 1, "image_id": 1, "caption": "a red square"}],
            }
        ),
        encoding="utf-8",
    )
    for side in ("a", "b"):
        (tmp_path / f"{side}.json").write_text(json.dumps([{"image_id": 1, "caption": "a square"}]))
    flags = ["--compare", tmp_path / "a.json", tmp_path / "b.json", "--names", name, "B"]
    result = in_process(
        "evaluate.py", *flags, "--annotations", annotations, "--no-java", cwd=tmp_path, timeout=60
    )
    assert_one_line_error(result.returncode, result.stderr, "--names", "one line of at most 60 printable")


def test_a_readers_option_given_to_webdataset_names_its_readers(tmp_path):
    result = in_process(
        "train.py",
        *("--set", "data.dataset=webdataset", "--set", "data.split_file=x.json", "--no-progress"),
        cwd=tmp_path,
        timeout=60,
    )
    line = assert_one_line_error(
        result.returncode,
        result.stderr,
        "data.split_file is an option of the karpathy and coco dataset readers",
        "not of data.dataset 'webdataset'",
    )
    assert "registered" not in line  # the webdataset reader is built in
    assert list(tmp_path.iterdir()) == []


def tiny_split(folder: Path, captions_per_image: int = 1) -> list[str]:
    """Four 32 px images in a Karpathy split file; train.py flags for a tiny random-weights run on it."""
    images = []
    for k, split in enumerate(["train", "train", "val", "test"]):
        Image.new("RGB", (32, 32), (60 * k, 0, 0)).save(folder / f"img{k}.png")
        sentences = [{"tokens": ["a", "red", "square"], "raw": "a red square"}] * captions_per_image
        images.append({"filename": f"img{k}.png", "split": split, "cocoid": k + 1, "sentences": sentences})
    (folder / "split.json").write_text(json.dumps({"images": images}), encoding="utf-8")
    values = {
        "data.dataset": "karpathy",
        "data.split_file": folder / "split.json",
        "data.root": folder,
        "data.min_word_count": 1,
        "model.encoder.weights": "none",
        "model.encoder.image_size": 64,
        "train.output_dir": folder / "run",
        "train.epochs": 1,
    }
    return ["--no-progress", *(f for key, value in values.items() for f in ("--set", f"{key}={value}"))]


def test_a_cache_folder_that_cannot_be_made_names_its_key(tmp_path):
    result = in_process("train.py", *tiny_split(tmp_path), "--set", "data.cache_dir=/proc", cwd=tmp_path)
    line = assert_one_line_error(
        result.returncode,
        result.stderr,
        "data.cache_dir: cannot create the feature cache's folder here",
        alone=False,  # after the warning that the dataset's index cannot be kept there either
    )
    assert line.startswith("error: /proc/") and "Errno" not in line


def test_an_image_with_more_captions_than_the_bound_is_refused_naming_it(tmp_path):
    flags = tiny_split(tmp_path, captions_per_image=MAX_CAPTIONS_PER_IMAGE + 1)
    result = in_process("train.py", *flags, cwd=tmp_path, timeout=60)
    assert_one_line_error(
        result.returncode,
        result.stderr,
        f"{tmp_path / 'split.json'}: image id 1 ({tmp_path / 'img0.png'}): 1001 captions; at most 1,000",
    )
    assert not (tmp_path / "features").exists()  # neither the dataset's index nor a cache written


@pytest.mark.parametrize(
    ("name", "returns", "needle"),
    [
        ("test_ints", lambda caption: [1, 2, 3], "returned a list holding int"),
        (
            "test_bytes",
            lambda caption: [w.encode() for w in caption.split()],
            "returned a list holding bytes",
        ),
        ("test_text", lambda caption: caption, "returned str"),
        ("test_exit", lambda caption: sys.exit(0), "called sys.exit(0)"),
    ],
)
def test_a_user_tokenizer_that_breaks_its_contract_is_one_line_naming_it(
    tmp_path, monkeypatch, name, returns, needle
):
    with TOKENIZERS.registered(name, returns):
        flags = tiny_split(tmp_path)
        result = in_process("train.py", *flags, "--set", f"data.tokenizer={name}", cwd=tmp_path, timeout=60)
        assert_one_line_error(
            result.returncode, result.stderr, f"data.tokenizer {name!r}: {needle}", "'a red square'"
        )  # a SystemExit(0) inside is no successful run
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("file", "edit", "needle"),
    [
        (
            "config.json",
            lambda d: d["config"]["data"].update(tokenizer="evil"),
            "data.tokenizer 'evil' names no",
        ),
        ("vocab.json", lambda d: d["words"].insert(5, ""), "words[5] '' is not a word"),
        ("vocab.json", lambda d: d["words"].insert(5, "a b"), "words[5] 'a b' is not a word"),
    ],
)
def test_a_model_folder_with_an_unknown_tokenizer_or_odd_words_is_refused_when_loaded(
    tmp_path, file, edit, needle
):
    folder = Path(captioning.load(FIXTURE).save_pretrained(tmp_path / "model"))
    data = json.loads((folder / file).read_text(encoding="utf-8"))
    edit(data)
    (folder / file).write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CheckpointError, match=re.escape(f"{folder / file}: {needle}")):
        captioning.load(folder)


def test_a_layer_named_for_an_lstm_is_refused():
    model = captioning.load(FIXTURE)
    picture = np.zeros((16, 16, 3), dtype=np.uint8)
    for layer in (1, "mean"):
        with pytest.raises(
            InputError, match=rf"^layer {layer!r}: model.decoder.kind 'lstm' has one attention"
        ):
            model.caption([picture], layer=layer)
    assert model.caption([picture], head=1)[0].attention_label == ""  # its one head may be named


@pytest.mark.parametrize(
    ("edit", "extra", "needle"),
    [
        (
            lambda image: image.update(split="train"),
            [],
            "split.json: the karpathy dataset has no images in split 'val'",
        ),
        (
            lambda image: None,
            ["--set", "train.epochs=0"],
            "train.epochs: this loop trains at least 1 epoch, got 0",
        ),
        (lambda image: image.update(filename="gone.png"), [], "gone.png"),
    ],
)
def test_plain_train_refuses_what_it_cannot_train_on_in_one_line_before_any_work(
    tmp_path, edit, extra, needle
):
    flags = tiny_split(tmp_path)
    split = json.loads((tmp_path / "split.json").read_text(encoding="utf-8"))
    edit(split["images"][2])  # the val image
    (tmp_path / "split.json").write_text(json.dumps(split), encoding="utf-8")
    result = in_process(
        "examples/plain_train.py", *flags, *extra, "--output-dir", tmp_path / "run", cwd=tmp_path, timeout=60
    )
    assert_one_line_error(result.returncode, result.stderr, needle)
    assert not (tmp_path / "run").exists() and not (tmp_path / "features").exists()
