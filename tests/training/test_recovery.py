"""Faults lose nothing: SIGKILL during feature caching and inside a checkpoint write, and a full disk
while writing checkpoints, results and the feature cache, through the real command-line tools."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_faults import SHAPES_YAML, assert_one_line_error, shapes, write_odd_images
from test_training import as_flags, tiny_overrides
from tool_runs import ONE_THREAD, REPO, run_in_process, run_tool

from captioning.config.loading import load_config
from captioning.data.feature_cache import FeatureCache, cache_batch_size
from captioning.data.records import records_of_split
from captioning.data.shapes import generate_shapes, read_shapes
from captioning.hub import checkpoint as checkpoint_module
from captioning.hub.checkpoint import load_checkpoint
from captioning.models.encoders import build_encoder

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["shapes"]  # the module-scoped fixture, shared with test_faults


# ------------------------------------------------------------------ 5. faults lose nothing

CACHE_IMAGES = 224  # 28 batches of 8 at 64 px on a CPU: a few seconds of caching
CACHE_BATCH = cache_batch_size(torch.device("cpu"))  # rows the cache computes and writes at a time


@pytest.fixture(scope="module")
def cache_shapes(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("cache_shapes")
    generate_shapes(root, seed=0, num_train=CACHE_IMAGES, num_val=4, num_test=4, image_size=64)
    overrides = {
        "data.root": root,
        "data.shapes_train": CACHE_IMAGES,
        "data.shapes_val": 4,
        "data.shapes_test": 4,
        "data.shapes_image_size": 64,
        "model.encoder.image_size": 64,
        "model.encoder.grid_size": 0,
    }
    return SimpleNamespace(root=root, overrides=overrides)


def _computed_rows(cache_dir: Path) -> tuple[Path, int] | None:
    """The cache's folder and how many of its rows are computed (state byte 1), once it has rows."""
    for path in cache_dir.glob("*/state.bin"):
        return path.parent, int((np.fromfile(path, dtype=np.uint8) == 1).sum())
    return None


@pytest.mark.slow
def test_sigkill_during_feature_caching_resumes_to_the_same_cache(cache_shapes, tmp_path):
    cache_dir = tmp_path / "cache"
    flags = as_flags(
        {**cache_shapes.overrides, "data.cache_dir": cache_dir, "train.output_dir": tmp_path / "run"}
    )
    command = [sys.executable, str(REPO / "train.py"), "--cache-only", *flags]
    with open(tmp_path / "killed.log", "w") as log:
        process = subprocess.Popen(
            [*command, "--no-progress"], cwd=REPO, stdout=log, stderr=log, env=ONE_THREAD
        )
    deadline, completed = time.time() + 240, 0
    while time.time() < deadline and process.poll() is None:
        found = _computed_rows(cache_dir)
        if found and 0 < found[1] < CACHE_IMAGES:
            os.kill(process.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    process.wait()
    assert process.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()
    folder, completed = _computed_rows(cache_dir)
    assert 0 < completed < CACHE_IMAGES and completed % CACHE_BATCH == 0

    result = subprocess.run(
        command, check=False, cwd=REPO, capture_output=True, text=True, timeout=300, env=ONE_THREAD
    )  # with progress bars
    assert result.returncode == 0, result.stderr
    bars = result.stderr.replace("\r", "\n")
    # the bar starts where the kill left off
    assert re.search(rf"\| {completed}/{CACHE_IMAGES} \[", bars), bars
    # ... and not at 0: done rows are not recomputed
    assert not re.search(rf"\| 0/{CACHE_IMAGES} \[", bars), bars
    assert _computed_rows(cache_dir)[1] == CACHE_IMAGES + 8  # train, then val and test appended

    config = load_config(SHAPES_YAML, cache_shapes.overrides)
    records = records_of_split(read_shapes(cache_shapes.root), "train")
    encoder = build_encoder(config.model.encoder)
    straight = FeatureCache.build_or_open(tmp_path / "straight", encoder, records, progress=False)
    resumed = FeatureCache.build_or_open(cache_dir, encoder, records, progress=False)
    assert straight.path.name == folder.name and resumed.computed == 0  # the same key, nothing left to do
    assert np.array_equal(
        np.stack([resumed[i] for i in range(CACHE_IMAGES)]),
        np.stack([straight[i] for i in range(CACHE_IMAGES)]),
    )


_SAVE_HANGS = """
import io, runpy, sys, time
from pathlib import Path
import torch

real_save = torch.save

def save(obj, destination, *args, **kwargs):
    target = Path(getattr(destination, "name", destination))  # a path, or the open temporary file
    if target.name.startswith(".last.pt.") and (target.parent / "last.pt").exists():
        buffer = io.BytesIO()
        real_save(obj, buffer)
        with open(target, "wb") as handle:  # half the new checkpoint reaches the disk, then the kill
            handle.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        print("inside save_checkpoint", flush=True)
        time.sleep(600)
    return real_save(obj, destination, *args, **kwargs)

torch.save = save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_sigkill_inside_a_checkpoint_write_keeps_the_previous_one(shapes, tmp_path):
    run = tmp_path / "run"
    flags = [
        "--no-test",
        "--no-progress",
        *as_flags(tiny_overrides(shapes.root, run, **{"train.epochs": 2, "train.checkpoint_every": 4})),
    ]
    script = tmp_path / "save_hangs.py"
    script.write_text(_SAVE_HANGS)
    process = subprocess.Popen(
        [sys.executable, str(script), str(REPO / "train.py"), *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=ONE_THREAD,
    )
    previous = None
    for line in process.stdout:
        if line.startswith("inside save_checkpoint"):
            previous = (run / "checkpoints" / "last.pt").read_bytes()
            os.kill(process.pid, signal.SIGKILL)
            break
    process.wait(timeout=60)
    process.stdout.close()
    assert previous is not None and process.returncode == -signal.SIGKILL
    last = run / "checkpoints" / "last.pt"
    assert last.read_bytes() == previous  # the half-written file never replaced it
    assert load_checkpoint(last)["training"]["state"]["global_step"] == 4
    assert list(last.parent.glob(".last.pt.*.tmp"))  # the killed writer's temporary file

    result = run_tool("train.py", *flags, "--resume")
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout and "step 4" in result.stdout
    state = load_checkpoint(last)["training"]["state"]
    assert (state["global_step"], state["epoch"]) == (16, 2)
    steps = [json.loads(line)["step"] for line in (run / "steps.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 17))
    assert not list(last.parent.glob(".*.tmp"))  # removed by the next write


def _full_disk_after(calls: int, before_failing=lambda: None):
    """``fail(destination)``: passes ``calls`` times, then writes a few bytes (if given a file) and
    raises ENOSPC, as a write to a full disk does."""
    count = {"n": 0}

    def fail(destination: Path | None = None) -> None:
        count["n"] += 1
        if count["n"] > calls:
            before_failing()
            if destination is not None:
                Path(destination).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")

    return fail


def test_full_disk_while_checkpointing_keeps_the_previous_checkpoint(shapes, tmp_path, monkeypatch):
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.pt"
    previous = {}
    real_save = torch.save
    fail = _full_disk_after(1, lambda: previous.setdefault("bytes", last.read_bytes()))

    def save(obj, destination, *args, **kwargs):
        fail(getattr(destination, "name", destination))  # torch.save is given the open temporary file
        real_save(obj, destination, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "save", save)
    args = [
        "--no-test",
        "--no-progress",
        *as_flags(
            tiny_overrides(
                shapes.root,
                run,
                **{
                    "train.epochs": 1,
                    "train.checkpoint_every": 2,
                    "train.max_steps": 4,
                    "train.deterministic": False,
                },
            )
        ),
    ]
    code, stderr = run_in_process("train.py", args)
    monkeypatch.undo()
    assert_one_line_error(code, stderr, str(last), "space")
    assert last.read_bytes() == previous["bytes"]
    assert load_checkpoint(last)["training"]["state"]["global_step"] == 2
    assert [p.name for p in last.parent.iterdir()] == ["last.pt"]  # no temporary file left behind


def test_full_disk_while_writing_results_keeps_the_previous_file(shapes, tmp_path, monkeypatch):
    folder = tmp_path / "images"
    write_odd_images(folder)
    results = tmp_path / "results.json"
    results.write_text('[{"image_id": 1, "caption": "the previous results"}]')
    previous = results.read_bytes()
    real_write_text = Path.write_text
    fail = _full_disk_after(0)

    def write_text(self, *args, **kwargs):
        if self.name.startswith(".results.json."):
            fail(self)
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    code, stderr = run_in_process(
        "evaluate.py",
        ["--checkpoint", shapes.checkpoint, "--images", folder, "--results", results, "--no-progress"],
    )
    monkeypatch.undo()
    assert_one_line_error(code, stderr, str(results), "space")
    assert results.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "results.json"]


def test_full_disk_while_caching_features_keeps_the_index(cache_shapes, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    previous = {}

    def remember_index() -> None:
        (path,) = cache_dir.glob("*/index.json")
        previous["path"], previous["bytes"] = path, path.read_bytes()

    # the first batch's rows and states, then the second's rows fail
    fail = _full_disk_after(2, remember_index)
    monkeypatch.setattr(np.memmap, "flush", lambda self: fail())  # the features.npy and state.bin writers
    args = [
        "--cache-only",
        "--no-progress",
        *as_flags(
            {**cache_shapes.overrides, "data.cache_dir": cache_dir, "train.output_dir": tmp_path / "run"}
        ),
    ]
    code, stderr = run_in_process("train.py", args)
    monkeypatch.undo()
    assert_one_line_error(
        code, stderr, "space", str(previous["path"].parent / "features.npy"), "data.cache_dir"
    )
    assert previous["path"].read_bytes() == previous["bytes"]
    assert (
        len(json.loads(previous["bytes"])["rows"]) == CACHE_IMAGES
        and _computed_rows(cache_dir)[1] == CACHE_BATCH
    )
    assert not list(cache_dir.glob("*/*.tmp"))
