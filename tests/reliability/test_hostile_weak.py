"""Small promises, one line each: a YAML key given twice, an empty configuration, a filesystem root as
an output folder and ``save_pretrained("~/...")`` (the cache's full-disk message for a small file:
``tests/data/test_feature_cache.py::test_full_disk_at_allocation_says_how_much_is_needed``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_faults import assert_one_line_error
from tool_runs import REPO, in_process

import captioning
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
