"""A model folder is written as one unit and never over what is not a model folder.

Real faults: SIGKILLs at random moments of alternating saves of two models into one folder, a real
full tmpfs, a real ``ulimit -f``, a real character device and a FIFO where the model's files go.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from messages import raises_naming
from test_hostile import small_disk  # a real small tmpfs (root only)
from tool_runs import ONE_THREAD, REPO

import captioning
from captioning.utils.files import NoSpaceError
from captioning.utils.run_folder import RunFolderError

__all__ = ["small_disk"]  # a fixture of another test module

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"
MODEL_FILES = ("model.safetensors", "config.json", "vocab.json", "README.md")


def other_model() -> captioning.CaptioningModel:
    """The fixture's model with other weights and another seed in its configuration."""
    model = captioning.load(FIXTURE)
    with torch.no_grad():
        for parameter in model.captioner.decoder.parameters():
            parameter.add_(1.0)
    model.config = dataclasses.replace(model.config, train=dataclasses.replace(model.config.train, seed=99))
    return model


def contents(folder: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in MODEL_FILES
        if name != "README.md"
    }


SAVER = """
import dataclasses, sys, torch, captioning
a = captioning.load(sys.argv[1])
b = captioning.load(sys.argv[1])
with torch.no_grad():
    for p in b.captioner.decoder.parameters():
        p.add_(1.0)
b.config = dataclasses.replace(b.config, train=dataclasses.replace(b.config.train, seed=99))
print("ready", flush=True)
while True:
    a.save_pretrained(sys.argv[2])
    b.save_pretrained(sys.argv[2])
"""


@pytest.mark.slow
def test_a_folder_killed_mid_save_holds_one_whole_model(tmp_path):
    a, b = captioning.load(FIXTURE), other_model()
    expected = [
        contents(a.save_pretrained(tmp_path / "a" / "model")),
        contents(b.save_pretrained(tmp_path / "b" / "model")),
    ]
    assert expected[0] != expected[1] and expected[0]["vocab.json"] == expected[1]["vocab.json"]
    folder = tmp_path / "model"
    rng = random.Random(0)
    seen = set()
    for _ in range(12):
        saver = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(FIXTURE), str(folder)],
            stdout=subprocess.PIPE,
            text=True,
            env=ONE_THREAD,
        )
        assert saver.stdout is not None and saver.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.15))
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        if not folder.exists():
            continue  # killed before its first save finished
        found = contents(folder)
        assert found in expected, "a mix of two saves"
        seen.add(expected.index(found))
        loaded = captioning.load(folder)  # and it loads, with its own configuration
        assert loaded.config.train.seed == (99 if found == expected[1] else a.config.train.seed)
    assert seen  # some kills landed after a first save (which model's depends on the moment)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.")]
    a.save_pretrained(folder)  # the next save removes what a killed one left beside the folder
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.")], leftovers
    assert contents(folder) == expected[0]


def test_a_resave_keeps_the_folders_permissions_and_a_links_target(tmp_path):
    model = captioning.load(FIXTURE)
    real = tmp_path / "real"
    model.save_pretrained(real)
    os.chmod(real, 0o750)
    (tmp_path / "link").symlink_to(real)
    other_model().save_pretrained(tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and stat.S_IMODE(real.stat().st_mode) == 0o750
    assert captioning.load(real).config.train.seed == 99


def test_a_device_or_fifo_where_a_model_file_goes_is_refused_before_writing(tmp_path):
    model = captioning.load(FIXTURE)
    folder = model.save_pretrained(tmp_path / "model")
    before = contents(folder)
    (folder / "model.safetensors").unlink()
    os.mknod(folder / "model.safetensors", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # like /dev/null
    with raises_naming(RunFolderError, folder / "model.safetensors", "character device"):
        model.save_pretrained(folder)
    assert stat.S_ISCHR((folder / "model.safetensors").lstat().st_mode)  # still the device
    assert hashlib.sha256((folder / "config.json").read_bytes()).hexdigest() == before["config.json"]

    fifo_folder = tmp_path / "fifo"
    fifo_folder.mkdir()
    os.mkfifo(fifo_folder / "config.json")
    signal.alarm(20)  # a blocking open of the FIFO would fail the test, not hang it
    try:
        with raises_naming(RunFolderError, fifo_folder / "config.json", "FIFO"):
            model.save_pretrained(fifo_folder)
    finally:
        signal.alarm(0)
    assert sorted(os.listdir(fifo_folder)) == ["config.json"]


def test_a_users_folder_is_not_replaced_unless_asked(tmp_path):
    model = captioning.load(FIXTURE)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes\n")
    (mine / "config.json").write_text('{"learning_rate": 3}\n')
    # the folder, the files it would replace, the way to replace them
    with raises_naming(RunFolderError, mine, "config.json, README.md", "overwrite=True") as refused:
        model.save_pretrained(mine)
    assert (mine / "README.md").read_text() == "my notes\n" and sorted(os.listdir(mine)) == [
        "README.md",
        "config.json",
    ]

    (mine / "data.csv").write_text("a,b\n")
    with raises_naming(RunFolderError, mine, "data.csv", "overwrite=True"):
        model.save_pretrained(mine)
    assert "data.csv" not in str(refused.value)  # named only when it is there
    model.save_pretrained(mine, overwrite=True)  # asked: the model's files replaced, the rest kept
    assert (mine / "data.csv").read_text() == "a,b\n"
    assert captioning.load(mine).vocab.to_dict() == model.vocab.to_dict()

    # an empty folder and a model folder take a save without being asked
    (tmp_path / "empty").mkdir()
    model.save_pretrained(tmp_path / "empty")
    model.save_pretrained(tmp_path / "empty")


def test_a_run_folder_and_its_checkpoints_are_refused_even_when_asked(tmp_path):
    model = captioning.load(FIXTURE)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.pt").write_bytes(FIXTURE.read_bytes())
    (run / "vocab.json").write_text('{"words": ["mine"]}')
    for target in (run, run / "checkpoints"):
        for overwrite in (False, True):
            with raises_naming(RunFolderError, target, "run", target / "model"):
                model.save_pretrained(target, overwrite=overwrite)
    assert (run / "vocab.json").read_text() == '{"words": ["mine"]}'
    assert sorted(os.listdir(run / "checkpoints")) == ["best.pt"]
    model.save_pretrained(run / "model")  # a new folder inside the run is the model's own


def test_a_real_full_disk_during_a_save_names_the_folder_and_keeps_the_old_model(small_disk):
    model = captioning.load(FIXTURE)
    folder = model.save_pretrained(small_disk / "model")
    before = contents(folder)
    free = shutil.disk_usage(small_disk).free
    with (small_disk / "filler").open("wb") as filler:
        filler.write(b"\0" * (free - 16 * 1024))  # the small files fit, the weights do not
    with pytest.raises(NoSpaceError) as raised:
        other_model().save_pretrained(folder)
    message = str(raised.value)
    assert message.startswith(f"{folder}: no space left on device") and "previous folder is intact" in message
    assert "\n" not in message and contents(folder) == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "model"]  # nothing left beside it


SIZE_LIMITED = """
import sys, captioning
from captioning.utils.files import FileSizeLimitError
model = captioning.load(sys.argv[1])
try:
    model.save_pretrained(sys.argv[2])
except FileSizeLimitError as error:
    print("refused:", error)
"""


@pytest.mark.slow
def test_a_file_size_limit_during_a_save_is_one_line_naming_the_folder(tmp_path):
    limit = 64 * 1024  # bytes: the weights (about 260 KB) do not fit

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run(
        [sys.executable, "-c", SIZE_LIMITED, str(FIXTURE), str(tmp_path / "model")],
        capture_output=True,
        text=True,
        env=ONE_THREAD,
        preexec_fn=cap,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(
        f"refused: {tmp_path / 'model'}: file too large for this process's file size limit"
    )
    assert not (tmp_path / "model").exists() and not list(tmp_path.glob(".model.*"))
