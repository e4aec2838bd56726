"""Writing an output never destroys what stood at its path: devices, FIFOs, links, a run's own files,
the command's own inputs, and the files ``train.overwrite`` may remove.

Each test runs the tool in this process (tests/tool_runs.py) against the real thing: /dev/null and
/dev/full, FIFOs made by ``os.mkfifo`` (read without blocking), symbolic links and the run folders of
test_hostile.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_evaluation_tools import files, write_run
from test_faults import assert_one_line_error, shapes
from test_hostile import copy_run, short_run, trained_run
from test_hostile_resume import digests
from tool_runs import REPO, in_process

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["files", "shapes", "trained_run"]  # fixtures of other test modules


def seed_runs(tmp_path: Path) -> list[Path]:
    """The test_scores.json of two runs that differ only in their seed."""
    return [
        write_run(tmp_path / f"seed{seed}", seed, {"CIDEr-D": cider, "images": 8})
        for seed, cider in ((1, 0.5), (2, 0.7))
    ]


@contextmanager
def drained(fifo: Path) -> Iterator[bytearray]:
    """Read ``fifo`` on a thread while the block runs, never blocking: the bytes a writer put there."""
    received, done = bytearray(), threading.Event()
    descriptor = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a writer's open then returns at once

    def read() -> None:
        while True:
            ready, _, _ = select.select([descriptor], [], [], 0.05)
            chunk = os.read(descriptor, 1 << 16) if ready else b""
            received.extend(chunk)
            if not chunk and done.is_set():
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield received
    finally:
        done.set()
        reader.join(timeout=10)
        os.close(descriptor)


# ------------------------------------------------------------------ devices, FIFOs, links


@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
def test_a_device_as_out_is_written_into_and_stays_a_device(tmp_path, device):
    before = os.stat(device)
    assert stat.S_ISCHR(before.st_mode)
    result = in_process("evaluate.py", "--aggregate", *seed_runs(tmp_path), "--out", device, cwd=tmp_path)
    after = os.stat(device)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    if device == "/dev/null":
        assert result.returncode == 0, result.stderr
        assert f"{device}  (written into a character device)" in result.stdout
    else:
        assert_one_line_error(result.returncode, result.stderr, f"{device}: no space left on device")


def test_a_fifo_as_out_is_written_into_and_stays_a_fifo(files, tmp_path):
    fifo = tmp_path / "scores.fifo"
    os.mkfifo(fifo)
    with drained(fifo) as received:
        result = in_process(
            "evaluate.py",
            "--no-java",
            "--annotations",
            files["refs"],
            "--results",
            files["a"],
            "--out",
            fifo,
            cwd=tmp_path,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(bytes(received))["images"] == 40
    assert not list(tmp_path.glob("scores*per_image*"))  # nothing beside the FIFO


def test_a_fifo_as_results_to_score_is_named_and_stays_a_fifo(files, tmp_path):
    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    result = in_process(
        "evaluate.py",
        "--no-java",
        "--annotations",
        files["refs"],
        "--results",
        fifo,
        "--out",
        tmp_path / "s.json",
        cwd=tmp_path,
        timeout=60,
    )
    assert_one_line_error(result.returncode, result.stderr, f"{fifo}: not a regular file (a FIFO)")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_fifo_as_visualize_html_is_written_into(shapes, tmp_path, make_image):
    image, fifo = make_image(tmp_path / "photo.png", size=(64, 64)), tmp_path / "page.html"
    os.mkfifo(fifo)
    with drained(fifo) as received:
        result = in_process(
            "visualize.py",
            image,
            "--checkpoint",
            shapes.checkpoint,
            "--out-dir",
            tmp_path / "v",
            "--html",
            fifo,
            "--no-progress",
            cwd=tmp_path,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert bytes(received).lstrip().lower().startswith(b"<!doctype html")


def test_a_link_as_out_keeps_pointing_at_the_replaced_file(tmp_path):
    target, link = tmp_path / "kept" / "aggregate.json", tmp_path / "link.json"
    target.parent.mkdir()
    target.write_text("earlier")
    link.symlink_to(target)
    result = in_process("evaluate.py", "--aggregate", *seed_runs(tmp_path), "--out", link, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "(replaced the earlier file)" in result.stdout
    assert link.is_symlink() and json.loads(target.read_text())["seeds"] == [1, 2]


def test_outputs_take_the_users_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        result = in_process(
            "evaluate.py", "--aggregate", *seed_runs(tmp_path), "--out", tmp_path / "a.json", cwd=tmp_path
        )
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == 0o640
    previous = os.umask(0o002)
    try:
        result = in_process(
            "evaluate.py",
            "--aggregate",
            *seed_runs(tmp_path / "again"),
            "--out",
            tmp_path / "a.json",
            cwd=tmp_path,
        )
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == 0o664


# ------------------------------------------------------------------ inputs and a run's own files


def test_compare_and_aggregate_never_write_onto_a_runs_files(files, tmp_path):
    runs = seed_runs(tmp_path)
    before = {path: path.read_bytes() for path in [*runs, runs[0].parent / "config.yaml"]}
    targets = [
        ("--aggregate", runs, runs[0].parent / "config.yaml", "is an input of this command"),
        ("--aggregate", runs, tmp_path / "seed2" / "test_scores.json", "is an input of this command"),
        ("--compare", [files["a"], files["b"]], runs[0], "is the main job's own file"),
        ("--compare", [files["a"], files["b"]], files["refs"], "is an input of this command"),
    ]
    for option, inputs, out, needle in targets:
        extra = ["--annotations", files["refs"], "--no-java"] if option == "--compare" else []
        result = in_process("evaluate.py", option, *inputs, *extra, "--out", out, cwd=tmp_path)
        assert_one_line_error(result.returncode, result.stderr, f"{out}: --out: {needle}")
    assert {path: path.read_bytes() for path in before} == before


def test_scoring_a_runs_test_results_never_replaces_its_scores(trained_run, files, tmp_path):
    run = copy_run(trained_run, tmp_path)
    (run / "test_results.json").write_bytes(files["a"].read_bytes())
    (run / "test_scores.json").write_text('{"from": "the main job"}')
    result = in_process(
        "evaluate.py",
        "--no-java",
        "--annotations",
        files["refs"],
        "--results",
        run / "test_results.json",
        cwd=tmp_path,
    )
    assert_one_line_error(
        result.returncode, result.stderr, f"{run / 'test_scores.json'}: --out: is the main job's"
    )
    assert (run / "test_scores.json").read_text() == '{"from": "the main job"}'
    mine = tmp_path / "mine.json"
    result = in_process(
        "evaluate.py",
        "--no-java",
        "--annotations",
        files["refs"],
        "--results",
        run / "test_results.json",
        "--out",
        mine,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(mine.read_text())["images"] == 40
    # the results being scored are an input, whatever --out calls them
    result = in_process(
        "evaluate.py",
        "--no-java",
        "--annotations",
        files["refs"],
        "--results",
        files["a"],
        "--out",
        files["a"],
        cwd=tmp_path,
    )
    assert_one_line_error(
        result.returncode, result.stderr, f"{files['a']}: --out: is an input of this command"
    )


@pytest.mark.parametrize("name", ["last.pt", "best.pt"])
def test_evaluate_never_writes_onto_the_checkpoint_it_evaluates(trained_run, tmp_path, name):
    run = copy_run(trained_run, tmp_path)
    checkpoint = run / "checkpoints" / name
    if not checkpoint.exists():  # a run of two steps keeps no best.pt
        shutil.copyfile(run / "checkpoints" / "last.pt", checkpoint)
    before = digests(run)
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        checkpoint,
        "--split",
        "test",
        "--results",
        checkpoint,
        "--no-java",
        "--no-progress",
        cwd=tmp_path,
    )
    assert_one_line_error(
        result.returncode, result.stderr, f"{checkpoint}: --results: is an input of this command"
    )
    assert digests(run) == before


def test_a_per_image_path_that_is_a_folder_is_refused_before_decoding(trained_run, tmp_path, monkeypatch):
    from captioning.cli import evaluate as commands

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the outputs were checked")

    monkeypatch.setattr(commands, "load_for_tool", never)
    run = copy_run(trained_run, tmp_path)
    folder = tmp_path / "mine_scores.per_image.json"
    folder.mkdir()
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        run / "checkpoints" / "last.pt",
        "--split",
        "test",
        "--out",
        tmp_path / "mine_scores.json",
        "--no-java",
        cwd=tmp_path,
    )
    assert_one_line_error(
        result.returncode, result.stderr, f"{folder}: --out (per-image scores): is a folder"
    )


def test_visualize_never_writes_a_figure_onto_its_own_image(shapes, tmp_path, make_image):
    image = make_image(tmp_path / "photo.png", size=(64, 64))
    before = image.read_bytes()
    result = in_process(
        "visualize.py",
        image,
        "--checkpoint",
        shapes.checkpoint,
        "--out-dir",
        tmp_path,
        "--no-progress",
        cwd=tmp_path,
    )
    assert_one_line_error(
        result.returncode, result.stderr, f"{image}: --out-dir: is an input of this command"
    )
    assert image.read_bytes() == before


# ------------------------------------------------------------- train.overwrite removes the run's names only


def test_overwrite_never_follows_a_link_out_of_the_run_folder_nor_removes_a_users_files(
    trained_run, shapes, tmp_path
):
    run = copy_run(trained_run, tmp_path)
    outside = tmp_path / "outside"
    (outside / "figures").mkdir(parents=True)
    (outside / "figures" / "7.png").write_text("a figure of another project")
    (outside / "old.pt").write_text("somebody's checkpoint")
    (run / "figures").symlink_to(outside / "figures", target_is_directory=True)
    (run / "checkpoints" / "mine.pt").write_text("the user's own")
    (run / "checkpoints" / "linked.pt").symlink_to(outside / "old.pt")
    (run / "plots").mkdir()
    (run / "plots" / "loss.png").write_text("the user's own")
    # A linked figures/ is refused before any work, by every run (a new one, --resume, overwrite):
    # the run's figures would replace the files behind the link.
    for extra in ([], ["--resume", "auto"]):
        refused = in_process(
            "train.py", *short_run(shapes, run, **{"train.overwrite": True}), *extra, cwd=REPO
        )
        link = f"{run / 'figures'}: a symbolic link (to {outside / 'figures'})"
        assert_one_line_error(refused.returncode, refused.stderr, link)
    assert sorted(os.listdir(outside / "figures")) == ["7.png"]
    (run / "figures").unlink()
    result = in_process(
        "train.py", "--no-test", *short_run(shapes, run, **{"train.overwrite": True}), cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert (outside / "figures" / "7.png").read_text() == "a figure of another project"
    assert (outside / "old.pt").read_text() == "somebody's checkpoint"
    assert (run / "checkpoints" / "mine.pt").read_text() == "the user's own"
    assert (run / "plots" / "loss.png").read_text() == "the user's own"
    assert (run / "checkpoints" / "last.pt").is_file()


@pytest.mark.parametrize("make", [lambda path: path.write_text("a file"), os.mkfifo], ids=["file", "fifo"])
def test_a_run_sub_folder_that_is_not_a_folder_is_refused_before_any_work(shapes, tmp_path, make):
    run = tmp_path / "run"
    run.mkdir()
    make(run / "figures")
    refused = in_process("train.py", *short_run(shapes, run), cwd=REPO)
    assert_one_line_error(refused.returncode, refused.stderr, str(run / "figures"), "not a folder")
    assert sorted(os.listdir(run)) == ["figures"]  # nothing written


def test_visualize_says_which_files_it_replaced(shapes, tmp_path, make_image):
    image = make_image(tmp_path / "photo.png", size=(64, 64))
    args = [
        image,
        "--checkpoint",
        shapes.checkpoint,
        "--out-dir",
        tmp_path / "v",
        "--html",
        tmp_path / "page.html",
        "--no-progress",
    ]
    first = in_process("visualize.py", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "replaced" not in first.stdout
    second = in_process("visualize.py", *args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"{tmp_path / 'v' / 'photo.png'}  (replaced the earlier file)" in second.stdout
    assert f"{tmp_path / 'page.html'}  (replaced the earlier file)" in second.stdout


def test_nothing_is_written_beside_a_device(shapes, files, tmp_path, make_image):
    before = sorted(os.listdir("/dev"))
    result = in_process(
        "evaluate.py",
        "--no-java",
        "--annotations",
        files["refs"],
        "--results",
        files["a"],
        "--out",
        "/dev/null",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "per-image" not in result.stdout.split("wrote:")[1]
    make_image(tmp_path / "photos" / "one.png", size=(64, 64))
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        shapes.checkpoint,
        "--images",
        tmp_path / "photos",
        "--results",
        "/dev/null",
        "--no-progress",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "image id -> file" not in result.stdout
    assert sorted(os.listdir("/dev")) == before  # no /dev/null.per_image.json, no /dev/null_files.json
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
