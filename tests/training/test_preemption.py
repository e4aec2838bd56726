"""Preemption: identical launches, SIGKILL under torchrun restarts, SIGTERM, ``--resume auto``.

Real ``torchrun`` launches of 2 gloo processes on CPU and real signals; every interrupted run must
end with the weights of the uninterrupted one, compared with ``torch.equal``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_faults import assert_one_line_error
from test_training import as_flags, data_root, read_steps, tiny_overrides
from tool_runs import in_process

from captioning.config.loading import load_config
from captioning.hub.checkpoint import load_checkpoint
from captioning.training.run import train

REPO = Path(__file__).resolve().parents[2]
DEMO_LR = load_config(REPO / "configs" / "shapes.yaml").train.lr  # what a run without --lr trains at
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
__all__ = ["data_root"]  # the module-scoped Shapes fixture of test_training
pytestmark = pytest.mark.usefixtures("single_thread")


def torchrun(*args: str, restarts: int = 0) -> list[str]:
    """``torchrun`` with 2 CPU processes on this machine."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        str(restarts),
        "--monitor-interval",
        "0.1",
        *args,
    ]


def train_command(output_dir: Path, data_root: Path, cache_dir: Path, **extra) -> list[str]:
    """train.py's arguments for the tiny 2-epoch run with dropout, checkpointing every 3 steps."""
    overrides = tiny_overrides(
        data_root,
        output_dir,
        **{"data.cache_dir": cache_dir, "model.decoder.dropout": 0.3, "train.checkpoint_every": 3, **extra},
    )
    return [str(REPO / "train.py"), "--no-test", "--no-progress", "--device", "cpu", *as_flags(overrides)]


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=REPO, env=ONE_THREAD, check=False
    )


def run_here(command: list[str]) -> subprocess.CompletedProcess:
    """``run(command)`` for a one-process ``[python, train.py, *args]``, in this process (tests/tool_runs.py):
    for runs whose exit status, messages and files are checked."""
    assert command[:2] == [sys.executable, str(REPO / "train.py")], command
    return in_process("train.py", *command[2:], cwd=REPO)


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


def start(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as stream:
        return subprocess.Popen(command, cwd=REPO, stdout=stream, stderr=subprocess.STDOUT, env=ONE_THREAD)


def wait_for_steps(process: subprocess.Popen, output_dir: Path, count: int) -> None:
    """Return once ``count`` steps are logged (rank 0 logs after each step)."""
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if (output_dir / "steps.jsonl").exists() and len(read_steps(output_dir)) >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"the run ended or stalled before step {count} (exit status {process.poll()})")


def worker_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of ``torchrun``'s worker process of ``rank`` (from its environment)."""
    children = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True, check=False)
    for pid in map(int, children.stdout.split()):
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environment:
            return pid
    raise AssertionError(f"no worker of rank {rank} under torchrun ({children.stdout.split()})")


def stopped_step(log: str) -> int:
    """The step named by the SIGTERM message (printed by rank 0)."""
    match = re.search(
        r"stopped by SIGTERM after step (\d+) \(xe epoch \d\): (\S+) holds the run; run the same "
        r"command with --resume auto to continue it \(exit status 75\)",
        log,
    )
    assert match, log[-3000:]
    return int(match.group(1))


@pytest.mark.slow
def test_a_worker_killed_under_torchrun_restarts_and_ends_with_the_same_weights(two_process, tmp_path):
    command, straight = two_process
    killed = tmp_path / "killed"
    launcher = start(torchrun(*command(killed), "--resume", "auto", restarts=1), tmp_path / "log")
    wait_for_steps(launcher, killed, 5)  # mid-epoch 1 of 2, after the checkpoint of step 3
    os.kill(worker_pid(launcher, 1), signal.SIGKILL)
    assert launcher.wait(timeout=600) == 0, (tmp_path / "log").read_text()[-3000:]
    log = (tmp_path / "log").read_text()
    resumed = re.search(
        rf"resumed from {killed / 'checkpoints' / 'last.pt'}: stage xe, epoch \d, step (\d+)", log
    )
    assert resumed and 3 <= int(resumed.group(1)) < 16, log[-3000:]
    assert read_steps(killed) == read_steps(straight)  # every step once, with the same losses
    assert_same_weights(killed, straight)


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_then_resume_auto_ends_with_the_same_weights(
    two_process, tmp_path
):
    command, straight = two_process
    stopped = tmp_path / "stopped"
    launcher = start(torchrun(*command(stopped), "--resume", "auto"), tmp_path / "log")
    wait_for_steps(launcher, stopped, 4)
    launcher.send_signal(signal.SIGTERM)  # torchrun passes it on to both workers
    launcher.wait(timeout=600)
    step = stopped_step((tmp_path / "log").read_text())
    assert 4 <= step < 16
    # Both ranks finished the same step (last.pt gathers their random streams) and no later one.
    training = load_checkpoint(stopped / "checkpoints" / "last.pt")["training"]
    assert training["state"]["global_step"] == step and len(training["rng_per_rank"]) == 2
    assert read_steps(stopped)[-1]["step"] == step

    result = run(torchrun(*command(stopped), "--resume", "auto"))  # the same command again
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"step {step}" in result.stdout
    assert read_steps(stopped) == read_steps(straight)
    assert_same_weights(stopped, straight)


@pytest.mark.slow
def test_sigterm_to_one_process_stops_with_exit_status_75_then_resume_auto_ends_with_the_same_weights(
    data_root, tmp_path
):
    straight = run(single(tmp_path / "straight", data_root))
    assert straight.returncode == 0, straight.stderr
    stopped = tmp_path / "stopped"
    command = single(stopped, data_root, "--resume", "auto")
    process = start(command, tmp_path / "log")
    wait_for_steps(process, stopped, 3)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=600) == 75, (tmp_path / "log").read_text()[-3000:]
    step = stopped_step((tmp_path / "log").read_text())
    assert 3 <= step < 8 and read_steps(stopped)[-1]["step"] == step
    assert load_checkpoint(stopped / "checkpoints" / "last.pt")["training"]["state"]["global_step"] == step
    result = run(command)
    assert result.returncode == 0, result.stderr
    assert read_steps(stopped) == read_steps(tmp_path / "straight")
    assert_same_weights(stopped, tmp_path / "straight")


def test_best_checkpoints_hold_weights_without_optimizer_state(data_root, tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(
        data_root, run_dir, **{"train.epochs": 1, "train.scst_epochs": 1, "train.scst_samples": 2}
    )
    outputs = train(load_config(REPO / "configs" / "shapes.yaml", overrides), progress=False)
    # The run is over; a run holds its folder until its process ends, and this one is pytest.
    outputs.lock.release()
    assert [h["stage"] for h in outputs.state.history] == [
        "xe",
        "scst",
    ]  # self-critical from best.pt's weights
    checkpoints = run_dir / "checkpoints"
    last = load_checkpoint(checkpoints / "last.pt")["training"]
    assert last["optimizer"]["state"] and last["rng_per_rank"]  # resume needs them
    for name in ("best", "best_scst"):
        payload = load_checkpoint(checkpoints / f"{name}.pt")
        assert set(payload["training"]) == {"state"}, name
        assert payload["decoder"].keys() == weights(run_dir).keys()
        assert (checkpoints / f"{name}.pt").stat().st_size < (checkpoints / "last.pt").stat().st_size / 2
    result = run_here(
        [
            sys.executable,
            str(REPO / "train.py"),
            "--no-test",
            "--no-progress",
            *as_flags(overrides),
            "--resume",
            str(checkpoints / "best.pt"),
        ]
    )
    # the file, what it lacks, the file to resume from instead
    assert_one_line_error(
        result.returncode, result.stderr, str(checkpoints / "best.pt"), "optimizer", "checkpoints/last.pt"
    )


# ----------------------------------------------------------------------------- --resume auto
def single(output_dir: Path, data_root: Path, *args: str, **extra) -> list[str]:
    """train.py in one process: the tiny run, 1 epoch of 8 steps."""
    overrides = tiny_overrides(data_root, output_dir, **{"train.epochs": 1, **extra})
    return [sys.executable, str(REPO / "train.py"), "--no-test", "--no-progress", *as_flags(overrides), *args]


def test_resume_auto_starts_a_new_run_then_continues_it(data_root, tmp_path):
    run_dir = tmp_path / "run"
    first = run_here(single(run_dir, data_root, "--resume", "auto", **{"train.max_steps": 2}))
    assert first.returncode == 0, first.stderr
    assert f"resume auto: no checkpoint in {run_dir}; starting a new run" in first.stdout
    again = run_here(single(run_dir, data_root, "--resume", "auto", **{"train.max_steps": 3}))
    assert again.returncode == 0, again.stderr
    assert f"resumed from {run_dir / 'checkpoints' / 'last.pt'}: stage xe, epoch 1, step 2" in again.stdout
    assert [s["step"] for s in read_steps(run_dir)] == [1, 2, 3]
    changed = run_here(
        single(run_dir, data_root, "--resume", "auto", "--lr", "0.5", **{"train.max_steps": 4})
    )
    # the checkpoint, the key, both values, the fix
    assert_one_line_error(
        changed.returncode,
        changed.stderr,
        str(run_dir / "checkpoints" / "last.pt"),
        "train.lr",
        str(DEMO_LR),
        "0.5",
        "--config",
    )


@pytest.mark.slow
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

    changed = run_here([*command, "--lr", "0.5"])
    first = changed.stderr.strip().splitlines()[0]
    assert changed.returncode == 2 and first.startswith(f"error: {run_dir / 'config.yaml'}"), changed.stderr
    assert all(name in first for name in ("train.lr", str(DEMO_LR), "0.5")), first
    result = run_here(command)
    assert result.returncode == 0, result.stderr
    assert f"resume auto: no checkpoint in {run_dir} yet; starting the run over" in result.stdout
    assert [s["step"] for s in read_steps(run_dir)] == list(range(1, 9))  # the killed launch's steps are gone
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
