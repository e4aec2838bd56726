"""Inputs that are not what they claim to be, given to the command-line tools: special files where a
file is expected, control characters in paths read from data files, and a damaged feature cache.

The tools run in this process, as in test_hostile (tests/tool_runs.py). Every input that could hang
runs with a time limit (a tool that opened a FIFO would wait for a writer forever): a SIGALRM then
interrupts it and the test fails.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from test_faults import assert_one_line_error, edited_split, karpathy_flags, shapes
from tool_runs import REPO, in_process, run_in_process

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["shapes"]  # the module-scoped fixture of test_faults


def _references(tmp_path):
    annotations, results = tmp_path / "refs.json", tmp_path / "run_results.json"
    annotations.write_text(
        json.dumps({"images": [{"id": 1}], "annotations": [{"image_id": 1, "caption": "a circle"}]})
    )
    results.write_text(json.dumps([{"image_id": 1, "caption": "a circle"}]))
    return annotations, results


def test_evaluate_names_a_fifo_given_as_annotations_or_instances_instead_of_waiting(shapes, tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    _, results = _references(tmp_path)
    result = in_process(
        "evaluate.py", "--no-java", "--annotations", fifo, "--results", results, cwd=tmp_path, timeout=120
    )
    assert_one_line_error(result.returncode, result.stderr, f"{fifo}: not a regular file (a FIFO)")
    result = in_process(
        "evaluate.py",
        "--no-progress",
        "--no-java",
        "--checkpoint",
        shapes.checkpoint,
        "--split",
        "test",
        "--instances",
        fifo,
        "--results",
        tmp_path / "r.json",
        cwd=tmp_path,
        timeout=120,
    )
    assert_one_line_error(result.returncode, result.stderr, f"{fifo}: not a regular file (a FIFO)")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("special", ["fifo", "folder"])
def test_a_special_file_given_as_a_checkpoint_or_results_is_named_for_what_it_is(shapes, tmp_path, special):
    path = tmp_path / "special.pt"
    if special == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    what = f"{path}: not a regular file ({'a FIFO' if special == 'fifo' else 'a folder'})"
    # A folder given as a checkpoint is read as a model folder (save_pretrained), and this one is none.
    as_checkpoint = what if special == "fifo" else f"{path}: a folder but not a model folder: no config.json"
    image = min((shapes.root / "test").iterdir())
    code, stderr = run_in_process(
        "evaluate.py", ["--checkpoint", path, "--split", "test", "--results", tmp_path / "r.json"]
    )
    assert_one_line_error(code, stderr, as_checkpoint)
    code, stderr = run_in_process("visualize.py", [image, "--checkpoint", path, "--out-dir", tmp_path / "v"])
    assert_one_line_error(code, stderr, as_checkpoint)
    annotations, _ = _references(tmp_path)
    code, stderr = run_in_process(
        "evaluate.py", ["--no-java", "--annotations", annotations, "--results", path]
    )
    assert_one_line_error(code, stderr, what)


def test_a_fifo_as_a_dataset_image_is_named_as_a_fifo(shapes, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(shapes.root, root, ignore=shutil.ignore_patterns("features"))
    fifo = root / "train" / "000002.png"
    fifo.unlink()
    os.mkfifo(fifo)
    flags = karpathy_flags(
        root / "dataset_shapes.json", root, tmp_path / "run", **{"train.epochs": 1, "train.max_steps": 1}
    )
    result = in_process("train.py", "--no-test", "--no-progress", *flags, cwd=REPO, timeout=240)
    assert_one_line_error(result.returncode, result.stderr, f"{fifo} (image 2): not a regular file (a FIFO)")
    assert not (tmp_path / "run").exists()


def test_evaluate_images_names_a_fifo_in_the_folder_or_skips_and_counts_it(shapes, tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for image in sorted((shapes.root / "test").iterdir())[:3]:
        shutil.copy(image, folder / image.name)
    fifo = folder / "pipe.png"
    os.mkfifo(fifo)
    (folder / "notes.txt").write_text("not an image name: not read, as in any folder dataset")
    flags = [
        "--no-progress",
        "--checkpoint",
        shapes.checkpoint,
        "--images",
        folder,
        "--results",
        tmp_path / "r.json",
    ]
    result = in_process("evaluate.py", *flags, cwd=tmp_path, timeout=120)
    assert_one_line_error(result.returncode, result.stderr, str(fifo), "not a regular file (a FIFO)")
    result = in_process("evaluate.py", *flags, "--skip-bad-images", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "skipped 1 of 4 images that could not be read" in result.stdout
    assert f"{fifo}" in result.stderr and "UserWarning" not in result.stderr
    assert len(json.loads((tmp_path / "r.json").read_text())) == 3


def test_control_characters_in_a_data_files_paths_are_escaped_in_messages(shapes, tmp_path):
    split_file = edited_split(
        shapes.split_file, tmp_path / "nul.json", lambda d: d["images"][4].update(filename="000005\x00.png")
    )
    result = in_process(
        "train.py", "--no-progress", *karpathy_flags(split_file, shapes.root, tmp_path / "run"), cwd=REPO
    )
    line = assert_one_line_error(result.returncode, result.stderr, "contains a NUL character")
    assert "\x00" not in result.stderr and "000005\\x00.png" in line
    split_file = edited_split(
        shapes.split_file,
        tmp_path / "escape.json",
        lambda d: d["images"][4].update(filename="000005\x1b[2J.png"),
    )
    code, stderr = run_in_process(
        "train.py", ["--no-progress", *karpathy_flags(split_file, shapes.root, tmp_path / "run")]
    )
    line = assert_one_line_error(code, stderr, "image file not found")
    assert "\x1b" not in stderr and "000005\\x1b[2J.png (image" in line


def test_a_feature_cache_index_with_an_absurd_capacity_is_refused_naming_the_folder(shapes, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(shapes.root, root)
    (index_path,) = (root / "features").glob("*/index.json")
    index = json.loads(index_path.read_text())
    features = index_path.with_name("features.npy").read_bytes()
    index["capacity"] = 10**13
    index_path.write_text(json.dumps(index))
    flags = karpathy_flags(root / "dataset_shapes.json", root, tmp_path / "run", **{"train.max_steps": 1})
    result = in_process("train.py", "--no-test", "--no-progress", *flags, cwd=REPO, timeout=240)
    assert_one_line_error(
        result.returncode,
        result.stderr,
        f"{index_path}: damaged feature cache index: capacity {10**13} does not match its rows",
        f"delete the folder {index_path.parent}",
    )
    assert index_path.with_name("features.npy").read_bytes() == features


def test_control_characters_in_warnings_are_escaped_too(shapes, tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for image in sorted((shapes.root / "test").iterdir())[:2]:
        shutil.copy(image, folder / image.name)
    (folder / "bad\x1b[2J.png").write_bytes(b"")  # an empty file: unreadable, skipped with a warning
    result = in_process(
        "evaluate.py",
        "--no-progress",
        "--checkpoint",
        shapes.checkpoint,
        "--images",
        folder,
        "--results",
        tmp_path / "r.json",
        "--skip-bad-images",
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "skipped 1 of 3 images that could not be read" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if "bad" in line]
    assert len(warnings) == 1 and "bad\\x1b[2J.png" in warnings[0], result.stderr
    assert "\x1b" not in result.stderr
