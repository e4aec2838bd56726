"""What a first run says about itself: captions that say nothing, an epoch's mean loss across a
resume, the feature-cache plan of ``--cache-only``, and a machine too busy for torch's threads.

The runs are train.py in this process (tests/tool_runs.py) on tiny Shapes data; only their exit
status, what they print and the files they write are checked.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from test_training import as_flags, data_root, read_steps, tiny_overrides, train_in_process  # noqa: F401

from captioning.config.loading import load_config
from captioning.evaluation.degenerate import MOSTLY, degenerate_captions
from captioning.inference import batches as inference
from captioning.training.cpu_threads import busy_machine_warning, usable_cores
from captioning.training.plan import resumed_length

pytestmark = pytest.mark.usefixtures("single_thread")


def test_mostly_empty_or_identical_captions_are_named_with_their_usual_cause():
    total = 10
    mostly = int(MOSTLY * total)
    empty = degenerate_captions([""] * mostly + ["a red circle"] * (total - mostly), "test")
    assert empty.startswith(f"warning: {mostly} of {total} test captions are empty; ") and "train.lr" in empty
    same = degenerate_captions(["a red circle"] * mostly + ["a blue square", ""], "validation")
    assert same.startswith(f"warning: {mostly} of {total} validation captions are the same, 'a red circle'; ")
    assert "\n" not in empty + same
    varied = ["a red circle"] * (mostly - 1) + ["a blue square", "a green star", ""]
    assert degenerate_captions(varied, "test") is None
    assert degenerate_captions(["a red circle"], "test") is None  # one image cannot repeat itself
    assert degenerate_captions([], "test") is None


def test_mostly_empty_or_one_word_or_the_same_few_captions_are_named():
    short = degenerate_captions([""] * 13 + ["a"] * 12, "test")  # CIDEr-D 0, yet neither rule above
    assert short.startswith("warning: 25 of 25 test captions are empty or one word (13 empty); ")
    few = ["a red circle", "a blue square", "a green star"]
    same_few = degenerate_captions([few[k % 3] for k in range(40)] + ["a big yellow ring"] * 5, "validation")
    assert same_few.startswith("warning: 40 of 45 validation captions are empty or one of 3 captions (")
    assert "'a red circle'" in same_few and "\n" not in short + same_few
    varied = [
        f"a {colour} {shape}" for colour in ("red", "blue", "green", "pink") for shape in ("circle", "star")
    ]
    assert degenerate_captions(varied * 3, "test") is None  # 8 strings over 24 images: no warning


def decoding_only(monkeypatch, change) -> None:
    """Every decoded batch of captions passes through ``change`` (validation and the test split)."""
    decode = inference.decode
    monkeypatch.setattr(inference, "decode", lambda *args: change(decode(*args)))


def test_a_run_whose_captions_are_empty_says_so_in_the_epoch_line_and_in_its_summary(
    data_root,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    # As an under-trained decoder does: <end> first, for every image.
    decoding_only(
        monkeypatch,
        lambda captions: [
            dataclasses.replace(
                c, tokens=[], attention=c.attention[:0], betas=None if c.betas is None else c.betas[:0]
            )
            for c in captions
        ],
    )
    result = train_in_process(as_flags(tiny_overrides(data_root, tmp_path / "run", **{"train.epochs": 1})))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    epochs = [line for line in lines if line.startswith("[xe] epoch ")]
    assert len(epochs) == 1 and "  warning: 8 of 8 validation captions are empty; " in epochs[0], epochs
    assert lines[-1].startswith("warning: 8 of 8 validation captions are empty; "), lines[
        -3:
    ]  # the summary's last


@pytest.mark.slow  # scores the test split and draws its figures
def test_a_run_whose_test_captions_are_all_the_same_says_so_in_its_summary(data_root, tmp_path, monkeypatch):  # noqa: F811
    decoding_only(monkeypatch, lambda captions: [captions[0]] * len(captions))
    run = tmp_path / "run"
    result = in_process_with_test(as_flags(tiny_overrides(data_root, run, **{"train.epochs": 1})))
    assert result.returncode == 0, result.stderr[-2000:]
    first = json.loads((run / "test_results.json").read_text())[0]["caption"]
    assert result.stdout.splitlines()[-1].startswith(
        f"warning: 8 of 8 test captions are the same, {first!r}; "
    )


def in_process_with_test(args: list[str]):
    from tool_runs import REPO, in_process

    return in_process("train.py", "--no-progress", *args, cwd=REPO)


def test_an_epochs_mean_loss_after_a_mid_epoch_resume_covers_the_whole_epoch(data_root, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    flags = as_flags(tiny_overrides(data_root, run))  # 2 epochs of 8 steps
    assert train_in_process([*flags, "--set", "train.max_steps=3"]).returncode == 0  # stopped in epoch 1
    result = train_in_process([*flags, "--resume"])
    assert result.returncode == 0, result.stderr[-2000:]
    steps = read_steps(run)
    assert [step["step"] for step in steps] == list(range(1, 17))
    history = json.loads((run / "history.json").read_text())["epochs"]
    for epoch in history:
        losses = [step["loss"] for step in steps if step["epoch"] == epoch["epoch"]]
        assert len(losses) == 8
        assert epoch["train_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-9)


def test_cache_only_says_its_plan_and_lists_only_what_it_wrote(data_root, tmp_path):  # noqa: F811
    cache = tmp_path / "cache"
    args = [
        "--cache-only",
        *as_flags(tiny_overrides(data_root, tmp_path / "run", **{"data.cache_dir": cache})),
    ]
    first = in_process_with_test(args)
    assert first.returncode == 0, first.stderr[-2000:]
    (plan,) = [line for line in first.stdout.splitlines() if line.startswith("plan: ")]
    assert plan.startswith(
        "plan: cache the efficientnet_lite0 features (2x2 grid, 1280 channels) of every split "
        f"(train 32, val 8, test 8 images) in the feature cache in {cache}; "
    )
    (folder,) = cache.iterdir()
    written = first.stdout.split("files written:")[1]
    assert all(f"{split} features" in written for split in ("train", "val", "test"))
    again = in_process_with_test(args)  # everything is cached: nothing of it is listed as written
    assert again.returncode == 0, again.stderr[-2000:]
    lines = again.stdout.splitlines()
    assert all(
        f"{split} features: already cached in {folder}, nothing computed" in lines
        for split in ("train", "val", "test")
    )
    assert "features" not in again.stdout.split("files written:")[1]


def test_a_symlinked_data_root_has_its_feature_cache_location_in_the_plan(data_root, tmp_path):  # noqa: F811
    linked = tmp_path / "data"
    linked.symlink_to(data_root)
    result = train_in_process(as_flags(tiny_overrides(linked, tmp_path / "run", **{"train.max_steps": 1})))
    assert result.returncode == 0, result.stderr[-2000:]
    (plan,) = [line for line in result.stdout.splitlines() if line.startswith("plan: ")]
    assert (
        f"; feature cache in {linked / 'features'} (which resolves to {data_root.resolve() / 'features'}); "
        in plan
    )
    # in config.yaml only
    assert not any(line.startswith("configuration: ") for line in result.stdout.splitlines())
    assert (tmp_path / "run" / "config.yaml").is_file()


def test_the_busy_machine_warning_compares_threads_with_the_idle_cores():
    assert busy_machine_warning(threads=2, cores=2, load=0.2) is None  # an idle machine: a thread per core
    assert busy_machine_warning(threads=1, cores=2, load=6.0) is None  # one thread cannot oversubscribe
    warning = busy_machine_warning(threads=2, cores=2, load=1.3)
    assert warning.startswith(
        "warning: the machine is busy (load average 1.3 on 2 cores) and torch runs 2 threads"
    )
    assert warning.endswith("start it with OMP_NUM_THREADS=1 (docs/first-run-notes.md)")
    assert "OMP_NUM_THREADS=4 " in busy_machine_warning(threads=16, cores=16, load=12.0)


def test_a_cpu_run_on_a_busy_machine_says_so_before_it_starts(data_root, tmp_path, monkeypatch):  # noqa: F811
    torch.set_num_threads(2)  # torch's default on 2 cores; the test's process state is put back after it
    cores = usable_cores()
    monkeypatch.setattr(os, "getloadavg", lambda: (cores + 4.0, cores + 4.0, cores + 4.0))
    result = train_in_process(as_flags(tiny_overrides(data_root, tmp_path / "run", **{"train.max_steps": 1})))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    warning = (
        f"warning: the machine is busy (load average {cores + 4.0:.1f} on {cores} cores) "
        "and torch runs 2 threads"
    )
    assert lines[0].startswith(warning), lines[:2]
    assert lines[1].startswith("plan: ")
    # The plan, the line a user reads to know what the run will do, says it too.
    assert lines[1].endswith(
        f"; busy machine (load average {cores + 4.0:.1f} on {cores} cores, 2 torch threads): "
        "expect it to run several times slower than idle unless started with OMP_NUM_THREADS=1"
    ), lines[1]
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    torch.set_num_threads(1)
    quiet = train_in_process(
        as_flags(tiny_overrides(data_root, tmp_path / "quiet", **{"train.max_steps": 1}))
    )
    assert (
        quiet.returncode == 0 and "machine is busy" not in quiet.stdout and "busy machine" not in quiet.stdout
    )


def test_a_resumes_length_note_names_what_it_keeps_adds_or_cannot_change():
    stored = load_config(None, {"train.epochs": 3, "train.scst_epochs": 2})
    repeated = load_config(None, {"train.epochs": 20, "train.scst_epochs": 2})  # the configuration file's 20
    kept, note = resumed_length(repeated, stored, given=set())
    assert kept.train.epochs == 3 and note is not None and note.startswith("resume: ")
    assert all(needle in note for needle in ("train.epochs=3", "20", "--epochs 20")), note  # kept, said, fix
    longer, note = resumed_length(repeated, stored, given={"train.epochs"})
    assert longer.train.epochs == 20 and note is not None
    assert all(needle in note for needle in ("17", "train.epochs 3 -> 20")), note
    _, note = resumed_length(repeated, stored, given={"train.epochs"}, stage="scst")
    assert note is not None
    assert all(needle in note for needle in ("train.epochs 3 -> 20", "nothing", "self-critical")), note
    shorter, note = resumed_length(
        load_config(None, {"train.epochs": 3, "train.scst_epochs": 1}), stored, given={"train.scst_epochs"}
    )
    assert shorter.train.scst_epochs == 1 and note is not None and "train.scst_epochs 2 -> 1" in note
    assert resumed_length(stored, stored, given=set()) == (stored, None)
