"""A new user's COCO runs, through the command-line tools, on a tiny tree in the published formats.

The tree (``coco_fixture.write_coco_tree``) holds train2014/ and val2014/ JPEGs, Karpathy's
``dataset_coco.json`` and the official ``captions_*2014.json`` / ``instances_*2014.json``. The tools
run from the folder above it with relative paths, as the commands of docs/coco.md do, under
``configs/coco_resnet101.yaml`` shrunk to a random-weights encoder at 64 px. They run in this process
(tests/tool_runs.py), on one intra-op thread as the subprocesses did.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
from collections import Counter
from pathlib import Path

import pytest
from coco_fixture import VAL_IDS, write_coco_tree
from test_faults import assert_one_line_error
from tool_runs import REPO, in_process

from captioning.config.loading import from_dict, load_config
from captioning.training.plan import describe_plan

pytestmark = pytest.mark.usefixtures("single_thread")
COCO_YAML = REPO / "configs" / "coco_resnet101.yaml"
TINY = {
    "model.encoder.name": "efficientnet_lite0",
    "model.encoder.weights": "none",
    "model.encoder.image_size": 64,
    "model.encoder.grid_size": 0,
    "model.decoder.embed_dim": 16,
    "model.decoder.hidden_dim": 32,
    "model.decoder.attention_dim": 16,
    "data.min_word_count": 1,
    "data.num_workers": 0,
    "train.batch_size": 4,
    "train.val_images": 0,
    "train.checkpoint_every": 0,
    "decode.beam_size": 2,
    "decode.batch_size": 8,
    "train.epochs": 1,
}
OFFICIAL = {
    "data.dataset": "coco",
    "data.split_file": "null",
    "data.annotations": (
        "data/coco/annotations/captions_train2014.json,data/coco/annotations/captions_val2014.json"
    ),
}
INSTANCES_VAL = {"data.instances": "data/coco/annotations/instances_val2014.json"}


def flags(values: dict) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def tool(cwd: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    """A command-line tool run from ``cwd``, as a user types it (in this process: tests/tool_runs.py)."""
    return in_process(script, "--no-progress", *args, cwd=cwd)


def train(cwd: Path, run: str, *args: str, **values) -> subprocess.CompletedProcess:
    return tool(
        cwd, "train.py", "--config", COCO_YAML, "--output-dir", run, *flags({**TINY, **values}), *args
    )


def plan_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("plan: ")]
    assert len(lines) == 1, stdout
    return lines[0]


def assert_refused_before_any_work(result: subprocess.CompletedProcess, work: Path, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(needle in lines[0] for needle in needles), lines[0]
    assert not list((work / "data" / "coco" / "features").glob("*/features.npy")), (
        "features were cached before the error"
    )
    assert not list(work.glob("*/checkpoints/*.pt")), "a step was taken before the error"


@pytest.fixture(scope="module")
def official_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A whole ``python train.py`` on the official caption files, test scoring included."""
    work = tmp_path_factory.mktemp("official")
    write_coco_tree(work / "data" / "coco")
    return work, train(work, "official", **OFFICIAL, **INSTANCES_VAL)


@pytest.mark.slow
def test_the_official_caption_files_train_and_score_a_held_out_test_split(official_run):
    work, result = official_run
    assert result.returncode == 0, result.stderr
    # val2014 is divided by image id: the even ones validate, the odd ones are the test split.
    odd = sorted(i for i in VAL_IDS if i % 2)
    rule = "val and test both from captions_val2014.json: even image ids -> val, odd -> test"
    assert f"images: train 12, val 7 (validating on 7), test 5 (scored at the end); {rule};" in plan_line(
        result.stdout
    )
    assert json.loads((work / "official" / "data_summary.json").read_text())["split_rule"] == rule
    tested = sorted(r["image_id"] for r in json.loads((work / "official" / "test_results.json").read_text()))
    assert tested == odd
    scores = json.loads((work / "official" / "test_scores.json").read_text())
    assert scores["grounding-images"] == 5
    figures = tool(
        work,
        "visualize.py",
        "--checkpoint",
        "official/checkpoints/best.pt",
        "--split",
        "test",
        "--num",
        "2",
        "--out-dir",
        "official/visualizations",
    )
    assert figures.returncode == 0, figures.stderr
    assert len(list((work / "official" / "visualizations").glob("*.png"))) == 2


def test_a_run_whose_data_has_no_test_split_is_refused_before_training(tmp_path):
    tree = write_coco_tree(tmp_path / "data" / "coco")
    data = json.loads(tree.split_file.read_text())
    data["images"] = [image for image in data["images"] if image["split"] != "test"]
    (tmp_path / "no_test.json").write_text(json.dumps(data))
    result = train(tmp_path, "run", **{"data.split_file": "no_test.json"})
    assert_refused_before_any_work(
        result,
        tmp_path,
        "the karpathy dataset has no images in split 'test'",
        "(it has train 16, val 4)",
        "--no-test",
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("data.instances", "data/coco/annotations/instances_val2014.jsn"),
        ("data.split_file", "data/coco/dataset_coco.jsn"),
        ("data.root", "data/cocoa"),
    ],
    ids=["instances", "split-file", "root"],
)
def test_a_mistyped_data_path_is_refused_before_any_work_naming_its_key(tmp_path, key, value):
    write_coco_tree(tmp_path / "data" / "coco")
    result = train(tmp_path, "run", **{**INSTANCES_VAL, key: value})
    assert_refused_before_any_work(
        result,
        tmp_path,
        f"error: {value}: {key}: no such",
        f"relative paths start from {tmp_path}",
        f"set {key}=",
    )


def test_a_missing_image_is_refused_before_any_image_is_cached(tmp_path):
    tree = write_coco_tree(tmp_path / "data" / "coco")
    missing = tree.root / "val2014" / "COCO_val2014_000000000208.jpg"
    missing.unlink()
    result = train(tmp_path, "run")
    assert_refused_before_any_work(
        result,
        tmp_path,
        f"{Path('data/coco') / missing.relative_to(tree.root)} (image 208): "
        "image file not found (1 of 24 images are missing",
        "set data.root=",
    )


@pytest.mark.slow
def test_evaluate_grounds_the_images_its_instances_files_cover_and_keeps_the_captions(official_run):
    work, _ = official_run
    only_val = tool(
        work,
        "evaluate.py",
        "--checkpoint",
        "official/checkpoints/best.pt",
        "--split",
        "train",
        "--no-java",
        "--results",
        "official/train_only_val.json",
    )
    assert only_val.returncode == 0, only_val.stderr
    assert "grounding: none of the 12 images has boxes in the instances files" in only_val.stdout
    assert len(json.loads((work / "official" / "train_only_val.json").read_text())) == 12
    both = tool(
        work,
        "evaluate.py",
        "--checkpoint",
        "official/checkpoints/best.pt",
        "--split",
        "train",
        "--no-java",
        "--results",
        "official/train_both.json",
        "--set",
        "data.instances=data/coco/annotations/instances_train2014.json,data/coco/annotations/instances_val2014.json",
    )
    assert both.returncode == 0, both.stderr
    scores = json.loads((work / "official" / "train_both_scores.json").read_text())
    assert scores["grounding-images"] == 12
    line = [line for line in both.stdout.splitlines() if line.startswith("grounding")]
    assert line and ("12 of 12 images with boxes" in line[0]), both.stdout
    assert all(
        len(number.split(".")[1]) == 3
        for number in line[0].split()
        if number.count(".") == 1 and number.replace(".", "").replace(",", "").isdigit()
    )


@pytest.mark.slow
def test_a_checkpoint_used_from_another_folder_names_the_key_to_set(official_run, tmp_path):
    work, _ = official_run
    result = tool(
        tmp_path,
        "evaluate.py",
        "--checkpoint",
        work / "official" / "checkpoints" / "best.pt",
        "--split",
        "test",
        "--no-java",
    )
    # the path as given, where relative paths start, the key to set
    assert_one_line_error(result.returncode, result.stderr, "error: data/coco", str(tmp_path), "data.root=")
    moved = tool(
        tmp_path,
        "evaluate.py",
        "--checkpoint",
        work / "official" / "checkpoints" / "best.pt",
        "--split",
        "test",
        "--no-java",
        "--results",
        tmp_path / "test.json",
        *flags(
            {
                "data.root": work / "data" / "coco",
                "data.instances": "",
                "data.annotations": f"{work}/data/coco/annotations/captions_train2014.json,"
                f"{work}/data/coco/annotations/captions_val2014.json",
            }
        ),
    )
    assert moved.returncode == 0, moved.stderr


def test_instances_take_one_file_or_several_and_old_configurations_load():
    assert load_config(None, {"data.instances": "a.json"}).data.instances == ("a.json",)
    assert load_config(None, {"data.instances": "a.json,b.json"}).data.instances == ("a.json", "b.json")
    assert from_dict({"data": {"instances": None}}).data.instances == ()  # as checkpoints stored it before
    assert from_dict({"data": {"instances": "instances_val2014.json"}}).data.instances == (
        "instances_val2014.json",
    )


@pytest.mark.slow
def test_every_run_says_its_plan_and_a_resumed_one_where_it_continues(tmp_path):
    write_coco_tree(tmp_path / "data" / "coco")
    fresh = train(tmp_path, "run", "--no-test", "--epochs", "2")
    assert fresh.returncode == 0, fresh.stderr
    assert plan_line(fresh.stdout) == (
        "plan: cross-entropy epochs 1-2, then self-critical none; "
        "4 steps per epoch (16 training images, batch 4); "
        "images: train 16, val 4 (validating on 4); feature cache in data/coco/features; a new run"
    )


@pytest.mark.slow
def test_a_resume_keeps_the_checkpoints_length_unless_told_and_says_what_it_adds(tmp_path):
    write_coco_tree(tmp_path / "data" / "coco")
    assert train(tmp_path, "run", "--no-test", "--epochs", "2").returncode == 0
    values = {key: value for key, value in TINY.items() if key != "train.epochs"}  # the configuration says 20

    def resume(*args: str) -> subprocess.CompletedProcess:
        result = tool(
            tmp_path,
            "train.py",
            "--config",
            COCO_YAML,
            "--output-dir",
            "run",
            *flags(values),
            "--no-test",
            "--resume",
            *args,
        )
        assert result.returncode == 0, result.stderr
        return result

    def before_the_plan(result: subprocess.CompletedProcess) -> str:
        lines = result.stdout.splitlines()
        notes = [line for line in lines if line.startswith("resume: ")]
        assert len(notes) == 1 and lines.index(notes[0]) < lines.index(plan_line(result.stdout)), (
            result.stdout
        )
        return notes[0]

    longer = resume("--epochs", "3", "--max-steps", "9")  # told: one more cross-entropy epoch, said first
    note = before_the_plan(longer)
    assert note.startswith("resume: ") and "train.epochs 2 -> 3" in note, note
    assert plan_line(longer.stdout).startswith("plan: cross-entropy epoch 3, then self-critical none; ")
    # The README's `--resume --scst-epochs N` with the configuration repeated: the run keeps its 3
    # cross-entropy epochs rather than running to the configuration's 20 first.
    scst = resume("--scst-epochs", "1")
    assert before_the_plan(scst) == (
        "resume: keeps the checkpoint's train.epochs=3 (the configuration says 20; "
        "pass --epochs 20 to change it); adds 1 self-critical epoch "
        "(train.scst_epochs 0 -> 1)"
    )
    assert plan_line(scst.stdout) == (
        "plan: cross-entropy epoch 3, then self-critical epoch 1; "
        "4 steps per epoch (16 training images, batch 4); "
        "images: train 16, val 4 (validating on 4); feature cache in data/coco/features; "
        "resuming from step 9: stage xe (cross-entropy), 2 epochs done, 1 batches into epoch 3"
    )
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert [(s["stage"], s["epoch"]) for s in steps] == [("xe", e) for e in (1, 2, 3) for _ in range(4)] + [
        ("scst", 1)
    ] * 4
    finished = resume()  # the finished run, its configuration repeated: it keeps both lengths, trains nothing
    assert "keeps the checkpoint's train.epochs=3" in before_the_plan(finished)
    assert "keeps the checkpoint's train.scst_epochs=1" in before_the_plan(finished)
    assert len((tmp_path / "run" / "steps.jsonl").read_text().splitlines()) == len(steps)


def test_the_plan_of_a_resumed_run_counts_finished_stages_and_batches():
    config = load_config(COCO_YAML, {**TINY, "train.epochs": 2, "train.scst_epochs": 3})
    counts = Counter({"train": 10, "val": 3, "test": 2})
    after_xe = {"stage": "xe", "epoch": 2, "batch_in_epoch": 0, "global_step": 6}
    assert describe_plan(config, counts, after_xe, test=True) == (
        "plan: cross-entropy done, then self-critical epochs 1-3; "
        "3 steps per epoch (10 training images, batch 4); "
        "images: train 10, val 3 (validating on 3), test 2 (scored at the end); "
        "resuming from step 6: stage xe (cross-entropy), 2 epochs done"
    )
    mid_scst = {"stage": "scst", "epoch": 1, "batch_in_epoch": 2, "global_step": 11}
    assert describe_plan(config, counts, mid_scst, test=False).startswith(
        "plan: cross-entropy done, then self-critical epochs 2-3; "
    )
    assert describe_plan(config, counts, mid_scst, test=False).endswith(
        "resuming from step 11: stage scst (self-critical), 1 epoch done, 2 batches into epoch 2"
    )
    stopped = {
        "stage": "xe",
        "epoch": 7,
        "batch_in_epoch": 0,
        "global_step": 28,
        "epochs_without_improvement": 5,
    }
    assert describe_plan(
        load_config(COCO_YAML, TINY | {"train.epochs": 20}), counts, stopped, test=False
    ).startswith("plan: cross-entropy done (stopped early after 7 epochs), then self-critical none; ")


@pytest.fixture
def offline(monkeypatch, tmp_path) -> None:
    """No network, and an empty torch hub cache: torchvision's weights cannot be had."""
    import torch.hub

    def unreachable(url: str, *args, **kwargs) -> None:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", unreachable)


def test_offline_the_coco_configuration_names_the_offline_one_which_trains_into_its_own_folder(
    offline, tmp_path
):
    write_coco_tree(tmp_path / "data" / "coco")
    published = {**TINY, "model.encoder.name": "resnet101", "model.encoder.weights": "pretrained"}
    refused = tool(tmp_path, "train.py", "--config", COCO_YAML, *flags(published), "--no-test")
    assert_refused_before_any_work(
        refused, tmp_path, "Temporary failure in name resolution", "--config configs/coco_lite0.yaml"
    )
    lite0 = {
        key: value
        for key, value in TINY.items()  # the packaged pretrained weights, at 64 px
        if key not in ("model.encoder.name", "model.encoder.weights")
    }
    result = tool(
        tmp_path, "train.py", "--config", REPO / "configs" / "coco_lite0.yaml", *flags(lite0), "--no-test"
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs" / "coco_lite0" / "checkpoints" / "best.pt").is_file()
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["coco_lite0"]


def test_a_short_first_run_of_the_transformer_configuration_warms_up_over_part_of_it(tmp_path):
    # configs/coco_transformer.yaml warms up over 20,000 noam steps; `--epochs 1` has 4 of them.
    write_coco_tree(tmp_path / "data" / "coco")
    transformer = {
        **{key: value for key, value in TINY.items() if not key.startswith("model.decoder.")},  # LSTM sizes
        "model.decoder.d_model": 16,
        "model.decoder.num_heads": 2,
        "model.decoder.d_ff": 32,
        "model.decoder.encoder_layers": 1,
        "model.decoder.decoder_layers": 1,
    }
    result = tool(
        tmp_path,
        "train.py",
        "--config",
        REPO / "configs" / "coco_transformer.yaml",
        "--output-dir",
        "run",
        *flags(transformer),
        "--no-test",
    )
    assert result.returncode == 0, result.stderr
    assert (
        "note: train.warmup_steps=20000 is more than 25% of the cross-entropy stage's 4 steps (1 epoch x 4); "
        "the noam schedule warms up over 1 steps instead"
    ) in result.stdout.splitlines()
