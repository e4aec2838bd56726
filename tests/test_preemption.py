"""Preemption: identical launches, SIGKILL under torchrun restarts, SIGTERM, ``--resume auto``.

Real ``torchrun`` launches of 2 gloo processes on CPU and real signals; every interrupted run must
end with the weights of the uninterrupted one, compared with ``torch.equal``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_training import as_flags, data_root, read_steps, tiny_overrides

from captioning.config import load_config
from captioning.training.checkpoint import load_checkpoint
from captioning.training.run import train

REPO = Path(__file__).resolve().parents[1]
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
__all__ = ["data_root"]  # the module-scoped Shapes fixture of test_training
pytestmark = pytest.mark.usefixtures("single_thread")


def torchrun(*args: str, restarts: int = 0) -> list[str]:
    """``torchrun`` with 2 CPU processes on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", str(restarts), "--monitor-interval", "0.1", *args]


def train_command(output_dir: Path, data_root: Path, cache_dir: Path, **extra) -> list[str]:
    """train.py's arguments for the tiny 2-epoch run with dropout, checkpointing every 3 steps."""
    overrides = tiny_overrides(data_root, output_dir, **{
        "data.cache_dir": cache_dir, "model.decoder.dropout": 0.3, "train.checkpoint_every": 3, **extra})
    return [str(REPO / "train.py"), "--no-test", "--no-progress", "--device", "cpu", *as_flags(overrides)]


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO, env=ONE_THREAD,
                          check=False)


def weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(output_dir / "checkpoints" / "last.pt")["decoder"]


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = weights(a), weights(b)
    assert first.keys() == second.keys()
    different = [key for key in first if not torch.equal(first[key], second[key])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


@pytest.fixture(scope="module")
def two_process(data_root, tmp_path_factory):
    """An uninterrupted 2-process run; its launch fills a new feature cache, as a first launch does."""
    base = tmp_path_factory.mktemp("two_process")
    cache_dir = base / "cache"

    def command(output_dir: Path, **extra) -> list[str]:
        return train_command(output_dir, data_root, cache_dir, **extra)

    result = run(torchrun(*command(base / "straight")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert [s["step"] for s in read_steps(base / "straight")] == list(range(1, 17))
    return command, base / "straight"


@pytest.mark.slow
def test_two_identical_two_process_launches_end_with_identical_weights(two_process, tmp_path):
    # The first launch filled the feature cache on rank 0; this one finds it full. Before the
    # training streams were seeded after set-up, that alone changed rank 0's dropout masks.
    command, straight = two_process
    result = run(torchrun(*command(tmp_path / "again")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_steps(tmp_path / "again") == read_steps(straight)
    assert_same_weights(tmp_path / "again", straight)


def test_best_checkpoints_hold_weights_without_optimizer_state(data_root, tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(data_root, run_dir, **{"train.epochs": 1, "train.scst_epochs": 1,
                                                      "train.scst_samples": 2})
    outputs = train(load_config(REPO / "configs" / "shapes.yaml", overrides), progress=False)
    assert [h["stage"] for h in outputs.state.history] == ["xe", "scst"]  # self-critical from best.pt's weights
    checkpoints = run_dir / "checkpoints"
    last = load_checkpoint(checkpoints / "last.pt")["training"]
    assert last["optimizer"]["state"] and last["rng_per_rank"]  # resume needs them
    for name in ("best", "best_scst"):
        payload = load_checkpoint(checkpoints / f"{name}.pt")
        assert set(payload["training"]) == {"state"}, name
        assert payload["decoder"].keys() == weights(run_dir).keys()
        assert (checkpoints / f"{name}.pt").stat().st_size < (checkpoints / "last.pt").stat().st_size / 2
    result = run([sys.executable, str(REPO / "train.py"), "--no-test", "--no-progress",
                  *as_flags(overrides), "--resume", str(checkpoints / "best.pt")])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        (f"error: {checkpoints / 'best.pt'}: holds weights only, without the optimizer state a resumed run needs; "
        "resume from checkpoints/last.pt")]


# ----------------------------------------------------------------------------- --resume auto
def single(output_dir: Path, data_root: Path, *args: str, **extra) -> list[str]:
    """train.py in one process: the tiny run, 1 epoch of 8 steps."""
    overrides = tiny_overrides(data_root, output_dir, **{"train.epochs": 1, **extra})
    return [sys.executable, str(REPO / "train.py"), "--no-test", "--no-progress", *as_flags(overrides), *args]


def test_resume_auto_starts_a_new_run_then_continues_it(data_root, tmp_path):
    run_dir = tmp_path / "run"
    first = run(single(run_dir, data_root, "--resume", "auto", **{"train.max_steps": 2}))
    assert first.returncode == 0, first.stderr
    assert f"resume auto: no checkpoint in {run_dir}; starting a new run" in first.stdout
    again = run(single(run_dir, data_root, "--resume", "auto", **{"train.max_steps": 3}))
    assert again.returncode == 0, again.stderr
    assert f"resumed from {run_dir / 'checkpoints' / 'last.pt'}: stage xe, epoch 1, step 2" in again.stdout
    assert [s["step"] for s in read_steps(run_dir)] == [1, 2, 3]
    changed = run(single(run_dir, data_root, "--resume", "auto", "--lr", "0.5", **{"train.max_steps": 4}))
    assert changed.returncode == 2
    assert changed.stderr.strip().splitlines() == [
        (f"error: {run_dir / 'checkpoints' / 'last.pt'}: train.lr is 0.001 in the checkpoint but 0.5 now; a resumed "
        "run keeps its configuration (pass the same --config and flags), apart from its length, logging, paths "
        "and decoding")]


def test_resume_auto_starts_over_in_a_folder_left_without_a_checkpoint(data_root, tmp_path):
    run_dir = tmp_path / "run"
    command = single(run_dir, data_root, **{"train.resume": "auto"})  # the configuration's way to ask
    with open(tmp_path / "killed.log", "w") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log, env=ONE_THREAD)
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if (run_dir / "steps.jsonl").exists() and read_steps(run_dir):
            os.kill(process.pid, signal.SIGKILL)  # a step logged, the first checkpoint (end of epoch) not yet
            break
        time.sleep(0.01)
    process.wait()
    assert process.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()
    assert (run_dir / "config.yaml").is_file() and not (run_dir / "checkpoints" / "last.pt").exists()

    changed = run([*command, "--lr", "0.5"])
    assert changed.returncode == 2
    assert changed.stderr.strip().splitlines()[0].startswith(
        f"error: {run_dir / 'config.yaml'}: train.lr is 0.001 in the checkpoint but 0.5 now")
    result = run(command)
    assert result.returncode == 0, result.stderr
    assert f"resume auto: no checkpoint in {run_dir} yet; starting the run over" in result.stdout
    assert [s["step"] for s in read_steps(run_dir)] == list(range(1, 9))  # the killed launch's steps are gone
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
