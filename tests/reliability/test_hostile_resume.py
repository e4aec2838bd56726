"""A hostile or careless user of train.py, continued: damaged training state given to ``--resume``,
``--cache-only`` beside a running run, ``--set`` values read as YAML reads them.

The tool runs in this process, as in test_hostile (tests/tool_runs.py), except the runs refused
while another process holds the folder's lock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import time
from pathlib import Path

import pytest
import torch
from test_faults import assert_one_line_error, shapes
from test_hostile import copy_run, short_run, start_in, trained_run, with_stored
from tool_runs import REPO, in_process, run_in_process, run_tool

from captioning.cli.common import add_config_arguments, config_from_args
from captioning.config import ConfigError, KarpathyDataConfig

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["shapes", "trained_run"]  # module-scoped fixtures of test_faults and test_hostile


def digests(folder: Path) -> dict[str, str]:
    """The md5 of every file under ``folder`` (hidden ones included), by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _first_moment(payload: dict) -> dict:
    return payload["training"]["optimizer"]["state"][0]


DAMAGE = {
    "state-not-a-mapping": (
        lambda p: p["training"]["optimizer"].update(state="x"),
        "training.optimizer.state: must be a mapping, got str",
    ),
    "moment-a-string": (
        lambda p: _first_moment(p).update(exp_avg="x"),
        "training.optimizer.state[0].exp_avg: must be a floating-point tensor, got str",
    ),
    "moment-nan": (
        lambda p: _first_moment(p)["exp_avg_sq"].fill_(float("nan")),
        "training.optimizer.state[0].exp_avg_sq: holds NaN or infinite values",
    ),
    "group-without-params": (
        lambda p: p["training"]["optimizer"].update(param_groups=[{"lr": "x"}]),
        "training.optimizer.param_groups[0].params: must be a list of parameter numbers",
    ),
    "lr-not-a-number": (
        lambda p: p["training"]["optimizer"]["param_groups"][0].update(lr="x"),
        "training.optimizer.param_groups[0].lr: must be a number, got str",
    ),
    "state-of-no-parameter": (
        lambda p: p["training"]["optimizer"]["state"].update({999: _first_moment(p)}),
        "training.optimizer.state[999]: belongs to no parameter",
    ),
    "rng-per-rank-a-string": (
        lambda p: p["training"].update(rng_per_rank="x"),
        "training.rng_per_rank: must be a non-empty list, got str",
    ),
    "rng-torch-a-string": (
        lambda p: p["training"]["rng"].update(torch="x"),
        "training.rng.torch: must be a byte tensor, got str",
    ),
    "unknown-stage": (
        lambda p: p["training"]["state"].update(stage="zz"),
        "training.state.stage: must be one of xe, scst, got 'zz'",
    ),
    "negative-step": (
        lambda p: p["training"]["state"].update(global_step=-3),
        "training.state.global_step: must be an integer >= 0, got -3",
    ),
}


def test_a_damaged_optimizer_moment_is_refused_naming_it_and_the_folder_stays_byte_identical(
    trained_run, shapes, tmp_path
):
    run = copy_run(trained_run, tmp_path)
    last = run / "checkpoints" / "last.pt"
    shape = tuple(_first_moment(torch.load(last, weights_only=True))["exp_avg"].shape)
    with_stored(last, last, lambda p: _first_moment(p).update(exp_avg=torch.zeros(3)))
    before = digests(run)
    result = in_process("train.py", "--no-test", *short_run(shapes, run), "--resume", cwd=REPO)
    assert_one_line_error(
        result.returncode,
        result.stderr,
        f"{last}: training.optimizer.state[0].exp_avg: shape (3,) does not match the parameter's {shape}",
    )
    assert digests(run) == before  # config.yaml, data_summary.json, the step log: all as they were


@pytest.mark.parametrize(("edit", "needle"), DAMAGE.values(), ids=DAMAGE.keys())
def test_damaged_training_state_is_refused_in_one_line_before_any_write(
    trained_run, shapes, tmp_path, edit, needle
):
    run = copy_run(trained_run, tmp_path)
    last = run / "checkpoints" / "last.pt"
    with_stored(last, last, edit)
    before = digests(run)
    code, stderr = run_in_process("train.py", ["--no-test", *short_run(shapes, run), "--resume"])
    assert_one_line_error(code, stderr, f"{last}: {needle}")
    assert digests(run) == before


def test_decoder_weights_of_another_shape_are_refused_before_any_write(trained_run, shapes, tmp_path):
    run = copy_run(trained_run, tmp_path)
    last = run / "checkpoints" / "last.pt"
    name = next(iter(torch.load(last, weights_only=True)["decoder"]))
    with_stored(last, last, lambda p: p["decoder"].update({name: torch.zeros(5, 5)}))
    before = digests(run)
    code, stderr = run_in_process("train.py", ["--no-test", *short_run(shapes, run), "--resume"])
    assert_one_line_error(code, stderr, f"{last}: decoder weights do not fit", f"{name} (5, 5)")
    assert digests(run) == before


# ------------------------------------------------------------------ one run per folder, before any work


@pytest.mark.slow
def test_cache_only_and_a_second_run_are_refused_while_a_run_uses_the_folder(shapes, tmp_path):
    run, cache = tmp_path / "run", tmp_path / "cache"
    # Random encoder weights key their own cache folder: --cache-only must draw the run's.
    random_encoder = {"model.encoder.weights": "none", "data.cache_dir": cache}
    first = start_in(
        REPO,
        "train.py",
        "--no-test",
        *short_run(shapes, run, **{"train.epochs": 50, "train.max_steps": 0, **random_encoder}),
    )
    try:
        for _ in range(3000):  # training (its step log): the lock is held and the feature cache is complete
            if (run / "steps.jsonl").exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        # Frozen while it holds the lock: a run left going may end (50 tiny epochs take seconds on a fast
        # machine) before the refused runs start, and then they would rightly go ahead. A stopped
        # process keeps its flock, and only the kill below ends it.
        first.send_signal(signal.SIGSTOP)
        assert first.poll() is None, first.communicate()[1]
        before = digests(run)
        caching = run_tool(
            "train.py", "--cache-only", *short_run(shapes, run, **{"data.max_caption_length": 5})
        )
        assert_one_line_error(
            caching.returncode,
            caching.stderr,
            str(run),
            "another train.py run is using this folder",
            f"pid {first.pid}",
        )
        second = run_tool("train.py", "--no-test", *short_run(shapes, run, **{"train.overwrite": True}))
        assert_one_line_error(second.returncode, second.stderr, "another train.py run is using this folder")
        assert "plan:" not in second.stdout  # refused before the data were read
        after = digests(run)
        for name in ("config.yaml", "data_summary.json"):  # what either refused run would have written
            assert after[name] == before[name], name
        assert first.poll() is None  # the first run held the folder throughout
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    summary = json.loads((run / "data_summary.json").read_text())
    assert summary["train_captions_cut"] == 0  # the refused cache-only run did not rewrite it

    caching = in_process(
        "train.py",
        "--cache-only",
        *short_run(shapes, run, **{"data.max_caption_length": 5, **random_encoder}),
        cwd=REPO,
    )
    assert caching.returncode == 0, caching.stderr
    listed = caching.stdout.split("files written:")[1]
    # the run cached no test split
    assert str(run / "data_summary.json") in listed and "test features" in listed
    assert json.loads((run / "data_summary.json").read_text())["train_captions_cut"] > 0
    assert len(list(cache.iterdir())) == 1, list(cache.iterdir())  # the run's cache folder, not a new one


# ------------------------------------------------------------------ --set values as YAML reads them


@pytest.mark.parametrize("value", ["null", "~", "NULL", ""])
def test_a_null_output_dir_from_set_is_refused_as_in_a_yaml_file(shapes, tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    flags = [
        *short_run(shapes, tmp_path),
        "--no-test",
        "--set",
        f"train.output_dir={value}",
    ]  # the last one wins
    code, stderr = run_in_process("train.py", flags)
    assert_one_line_error(code, stderr, "train.output_dir must be a string, got null")
    assert not list(tmp_path.iterdir())  # no folder named null, ~ or None


def test_set_null_through_the_tool_and_integer_keys_take_integers_only(shapes, tmp_path):
    tiny = [*short_run(shapes, tmp_path / "run"), "--no-test"]
    result = in_process("train.py", *tiny, "--set", "train.output_dir=~", cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, "train.output_dir must be a string, got null")
    assert not list(tmp_path.iterdir())
    for value in ("1e3", "2.0", "true"):
        code, stderr = run_in_process("train.py", [*tiny, "--set", f"train.seed={value}"])
        assert_one_line_error(code, stderr, f"train.seed must be an integer, got '{value}'")


def test_a_home_relative_path_is_expanded_as_a_shell_does(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    args = parser.parse_args(
        [
            *("--set", "train.output_dir=~/runs/a", "--set", "data.dataset=karpathy"),
            *("--set", "data.split_file=null", "--set", "data.cache_dir=~"),
        ]
    )
    config = config_from_args(args)
    assert config.train.output_dir == str(tmp_path / "home" / "runs" / "a")
    assert isinstance(config.data, KarpathyDataConfig) and config.data.split_file is None
    assert config.data.cache_dir is None
    args = parser.parse_args(
        ["--set", "data.dataset=karpathy", "--set", "data.split_file=~/dataset_coco.json"]
    )
    assert config_from_args(args).data.split_file == str(tmp_path / "home" / "dataset_coco.json")
    args = parser.parse_args(["--set", "data.root=~no_such_user_here/data"])
    with pytest.raises(ConfigError, match="data.root: cannot expand '~no_such_user_here/data'"):
        config_from_args(args)
