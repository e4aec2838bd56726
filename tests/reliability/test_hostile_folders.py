"""Run folders in odd states: ``--resume auto`` never wipes a finished or foreign run, and an output
folder that is a file or sits on a read-only mount is refused before the data are read.

The tool runs in this process (tests/tool_runs.py) on copies of test_hostile's finished run.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_faults import assert_one_line_error, shapes
from test_hostile import copy_run, short_run, trained_run
from test_hostile_resume import digests
from tool_runs import REPO, in_process

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["shapes", "trained_run"]  # fixtures of other test modules


@pytest.fixture
def read_only_mount(tmp_path) -> Iterator[Path]:
    """A real read-only tmpfs at tmp_path/ro (root only: chmod does not stop root's writes)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'})")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def finished_run(trained_run: Path, tmp_path: Path) -> Path:
    """A finished run that kept best.pt only, with its test scores, figures and report."""
    run = copy_run(trained_run, tmp_path)
    (run / "checkpoints" / "last.pt").rename(run / "checkpoints" / "best.pt")
    for name in ("test_results.json", "test_scores.json", "test_scores.per_image.json", "report.html"):
        (run / name).write_text("of the finished run")
    (run / "figures").mkdir()
    (run / "figures" / "1.png").write_text("of the finished run")
    return run


def test_resume_auto_refuses_a_finished_run_that_kept_only_best_pt(trained_run, shapes, tmp_path):
    run = finished_run(trained_run, tmp_path)
    before = digests(run)
    result = in_process("train.py", "--no-test", *short_run(shapes, run), "--resume", "auto", cwd=REPO)
    assert_one_line_error(
        result.returncode,
        result.stderr,
        f"{run}: --resume auto: no checkpoints/last.pt",
        "checkpoints/best.pt",
        "report.html",
        "train.overwrite=true",
    )
    assert "plan:" not in result.stdout
    assert digests(run) == before
    plain = in_process("train.py", "--no-test", *short_run(shapes, run), cwd=REPO)  # refused the same way
    assert_one_line_error(plain.returncode, plain.stderr, "holds an earlier run's checkpoints (best.pt)")
    assert {name: digest for name, digest in digests(run).items() if name != ".train.lock"} == before
    replaced = in_process(
        "train.py",
        "--no-test",
        *short_run(shapes, run, **{"train.overwrite": True}),
        "--resume",
        "auto",
        cwd=REPO,
    )
    assert replaced.returncode == 0, replaced.stderr  # asked for by name: the run is replaced
    assert not (run / "test_scores.json").exists() and (run / "checkpoints" / "last.pt").is_file()


@pytest.mark.parametrize("kind", ["a FIFO", "a folder"])
def test_resume_auto_refuses_a_last_pt_that_is_not_a_file(trained_run, shapes, tmp_path, kind):
    run = finished_run(trained_run, tmp_path)
    last = run / "checkpoints" / "last.pt"
    os.mkfifo(last) if kind == "a FIFO" else last.mkdir()
    before = digests(run)
    result = in_process(
        "train.py", "--no-test", *short_run(shapes, run), "--resume", "auto", cwd=REPO, timeout=120
    )
    assert_one_line_error(result.returncode, result.stderr, f"{last}: is {kind}, not a checkpoint")
    assert digests(run) == before
    assert (stat.S_ISFIFO if kind == "a FIFO" else stat.S_ISDIR)(os.stat(last).st_mode)


def test_an_output_dir_that_is_a_file_is_refused_before_the_data_are_read(shapes, tmp_path):
    output_dir = tmp_path / "a-file"
    output_dir.write_text("not a folder")
    result = in_process("train.py", "--no-test", *short_run(shapes, output_dir), "--resume", "auto", cwd=REPO)
    assert_one_line_error(
        result.returncode, result.stderr, f"{output_dir}: train.output_dir: exists and is not a folder"
    )
    assert "plan:" not in result.stdout
    assert output_dir.read_text() == "not a folder"


def test_an_output_dir_on_a_read_only_mount_is_refused_before_the_data_are_read(shapes, read_only_mount):
    for output_dir in (read_only_mount, read_only_mount / "run"):
        for extra in ([], ["--cache-only"]):
            result = in_process("train.py", "--no-test", *short_run(shapes, output_dir), *extra, cwd=REPO)
            assert_one_line_error(
                result.returncode,
                result.stderr,
                f"{output_dir}: train.output_dir: cannot write in",
                "(read-only file system)",
            )
            assert "plan:" not in result.stdout
