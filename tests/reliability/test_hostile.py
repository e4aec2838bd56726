"""A hostile or careless user of the command-line tools: where files are written, runs that must not
mix, inputs checked before any work, temporary files, messages, and inputs that must not hang.

Every test runs the real tools (train.py, evaluate.py, visualize.py) through the same
``run_cli(main, get_args_parser(), argv)`` call the scripts make, in this process and in the folder
the script would be started from (tests/tool_runs.py; test_faults shows each tool's error path in a
subprocess). A real subprocess stays where a process is what is tested: a second run refused while
another process holds the folder's lock, the lock a killed process leaves, and a ``java`` on ``PATH``
that never answers. A run that could wait forever on a FIFO gets a SIGALRM, and then fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from test_faults import assert_one_line_error, edited_split, karpathy_flags, shapes, write_odd_images
from test_training import as_flags, tiny_overrides
from tool_runs import ONE_THREAD, REPO, in_process, run_in_process, run_tool

from captioning.hub.checkpoint import load_checkpoint
from captioning.utils.run_folder import RunLock

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["shapes"]  # the module-scoped fixture of test_faults


def start_in(cwd: Path, script: str, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / script), *map(str, args)],
        cwd=cwd,
        env=ONE_THREAD,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def short_run(shapes, output_dir: Path, **extra) -> list[str]:
    """train.py flags for a few steps of the tiny model on the shared Shapes data."""
    return [
        "--no-progress",
        *as_flags(
            tiny_overrides(
                shapes.root,
                output_dir,
                **{"train.epochs": 1, "train.max_steps": 2, "train.deterministic": False, **extra},
            )
        ),
    ]


def with_stored(source: Path, destination: Path, edit) -> Path:
    """A copy of a checkpoint with ``edit(payload)`` applied, saved by plain torch.save."""
    payload = load_checkpoint(source)
    edit(payload)
    destination.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, destination)
    return destination


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained_run(shapes, tmp_path_factory) -> Path:
    """A finished short training run (its checkpoints, logs and configuration), copied by each test."""
    run = tmp_path_factory.mktemp("trained") / "run"
    result = in_process("train.py", "--no-test", *short_run(shapes, run), cwd=REPO)
    assert result.returncode == 0, result.stderr
    return run


def copy_run(trained_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / ".train.lock").unlink(missing_ok=True)
    return run


# ------------------------------------------------------------------ A. where files are written


@pytest.mark.slow
def test_evaluate_never_writes_where_a_checkpoints_paths_point(shapes, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    checkpoint = with_stored(
        shapes.checkpoint,
        tmp_path / "run" / "checkpoints" / "best.pt",
        lambda p: p["config"]["data"].update(
            root=str(elsewhere / "data"), cache_dir=str(elsewhere / "cache")
        ),
    )
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        checkpoint,
        "--split",
        "test",
        "--no-progress",
        "--no-java",
        cwd=tmp_path,
    )
    assert_one_line_error(
        result.returncode, result.stderr, str(elsewhere / "data"), "only read", "--set data.root="
    )
    assert not elsewhere.exists()  # no Shapes generated there

    # The stored root holds the data but the stored cache folder does not exist: images are decoded, no
    # cache built.
    checkpoint = with_stored(
        shapes.checkpoint,
        checkpoint,
        lambda p: p["config"]["data"].update(root=str(shapes.root), cache_dir=str(elsewhere / "cache")),
    )
    before = tree(shapes.root)
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        checkpoint,
        "--split",
        "test",
        "--no-progress",
        "--no-java",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert not elsewhere.exists()
    assert tree(shapes.root) == before
    assert (tmp_path / "run" / "eval_best_test_results.json").is_file()


def test_default_outputs_go_to_the_run_folder_else_the_current_one(shapes, tmp_path):
    loose = tmp_path / "downloads" / "model.pt"
    loose.parent.mkdir()
    shutil.copy(shapes.checkpoint, loose)
    images, work = tmp_path / "images", tmp_path / "work"
    write_odd_images(images)
    work.mkdir()
    result = in_process("evaluate.py", "--checkpoint", loose, "--images", images, "--no-progress", cwd=work)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in work.iterdir()) == [
        "eval_model_images_files.json",
        "eval_model_images_results.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "downloads",
        "images",
        "work",
    ]  # nothing beside them


def test_symlinked_images_are_followed(shapes, tmp_path):
    outside, folder = tmp_path / "elsewhere", tmp_path / "images"
    write_odd_images(outside)
    folder.mkdir()
    (folder / "linked.png").symlink_to(outside / "rgba.png")  # points outside the image folder
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        shapes.checkpoint,
        "--images",
        folder,
        "--results",
        tmp_path / "captions.json",
        "--no-progress",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    files = json.loads((tmp_path / "captions_files.json").read_text())
    assert list(files.values()) == [str(folder / "linked.png")]


# ------------------------------------------------------------------ C. runs never mix


@pytest.mark.slow
def test_one_run_per_folder_and_a_killed_run_leaves_no_lock(shapes, tmp_path):
    run = tmp_path / "run"
    first = start_in(
        REPO, "train.py", "--no-test", *short_run(shapes, run, **{"train.epochs": 50, "train.max_steps": 0})
    )
    try:
        for _ in range(1200):  # the first run holds the lock once it has written its configuration
            if (run / "config.yaml").exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert first.poll() is None, first.communicate()[1]
        second = run_tool("train.py", "--no-test", *short_run(shapes, run, **{"train.overwrite": True}))
        assert_one_line_error(
            second.returncode,
            second.stderr,
            str(run),
            "another train.py run is using this folder",
            f"pid {first.pid}",
            alone=False,
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    third = in_process(
        "train.py", "--no-test", *short_run(shapes, run, **{"train.overwrite": True}), cwd=REPO
    )
    assert third.returncode == 0, third.stderr  # the kernel dropped the killed run's lock


@pytest.mark.slow
def test_a_run_that_ends_in_this_process_leaves_its_folder_free(trained_run, shapes, tmp_path, monkeypatch):
    from captioning.training.trainer import Trainer

    run = copy_run(trained_run, tmp_path)
    resumed = in_process(
        "train.py", "--no-test", *short_run(shapes, run, **{"train.max_steps": 3}), "--resume", cwd=REPO
    )
    assert resumed.returncode == 0, resumed.stderr
    RunLock(run).acquire().release()  # a notebook's second run is not refused by its own finished one

    def full_disk(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Trainer, "fit", full_disk)
    failed = in_process(
        "train.py", "--no-test", *short_run(shapes, run, **{"train.max_steps": 4}), "--resume", cwd=REPO
    )
    assert_one_line_error(failed.returncode, failed.stderr, "No space left on device")
    RunLock(run).acquire().release()  # nor by one that failed after taking the lock

    caching = in_process("train.py", "--cache-only", *short_run(shapes, run), cwd=REPO)
    assert caching.returncode == 0, caching.stderr
    RunLock(run).acquire().release()


def test_a_refused_resume_changes_nothing(trained_run, shapes, tmp_path):
    run = copy_run(trained_run, tmp_path)
    before = tree(run)
    result = in_process("train.py", "--no-test", *short_run(shapes, run), "--lr", "0.1", "--resume", cwd=REPO)
    assert_one_line_error(result.returncode, result.stderr, "train.lr is", "in the checkpoint but 0.1 now")
    assert tree(run) == before  # config.yaml and data_summary.json were not rewritten

    other = tmp_path / "other"
    result = in_process(
        "train.py",
        "--no-test",
        *short_run(shapes, other),
        "--resume",
        run / "checkpoints" / "last.pt",
        cwd=REPO,
    )
    assert_one_line_error(
        result.returncode,
        result.stderr,
        "last.pt: --resume continues a run in its own folder",
        f"--output-dir {run}",
    )
    assert not other.exists() and tree(run) == before

    # a model folder, or a checkpoint outside any run's checkpoints/: said so, no --output-dir advice
    folder = tmp_path / "model"
    folder.mkdir()
    loose = tmp_path / "loose.pt"
    loose.write_bytes((run / "checkpoints" / "last.pt").read_bytes())
    for given, needle in [
        (folder, "a folder; --resume continues a run from its checkpoint"),
        (loose, "loose.pt: --resume continues a run from a checkpoint in its run folder's checkpoints/"),
    ]:
        result = in_process("train.py", "--no-test", *short_run(shapes, other), "--resume", given, cwd=REPO)
        assert_one_line_error(result.returncode, result.stderr, needle)
        assert "--output-dir" not in result.stderr and not other.exists()


def test_overwrite_removes_every_output_of_the_earlier_run_and_only_those(trained_run, shapes, tmp_path):
    run = copy_run(trained_run, tmp_path)
    earlier = [
        "test_results.json",
        "test_scores.json",
        "test_scores.per_image.json",
        "report.html",
        "figures/7.png",
        "eval_best_test_results.json",
        "eval_best_test_scores.json",
        "eval_best_images_files.json",
    ]
    for name in earlier:
        (run / name).parent.mkdir(exist_ok=True)
        (run / name).write_text("from the earlier run")
    (run / "notes.txt").write_text("the user's own")
    result = in_process(
        "train.py", "--no-test", *short_run(shapes, run, **{"train.overwrite": True}), cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert not [name for name in earlier if (run / name).exists()]
    assert (run / "notes.txt").read_text() == "the user's own"
    assert (run / "checkpoints" / "last.pt").is_file() and (run / "config.yaml").is_file()


def test_evaluate_writes_its_own_names_and_says_when_it_replaces_one(trained_run, tmp_path):
    run = copy_run(trained_run, tmp_path)
    (run / "test_results.json").write_text("[] ")  # the main job's
    args = ["--checkpoint", run / "checkpoints" / "last.pt", "--split", "test", "--no-progress", "--no-java"]
    first = in_process("evaluate.py", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert (run / "test_results.json").read_text() == "[] "
    written = [
        "eval_last_test_results.json",
        "eval_last_test_scores.json",
        "eval_last_test_scores.per_image.json",
    ]
    assert all((run / name).is_file() for name in written)
    assert "replaced" not in first.stdout
    second = in_process("evaluate.py", *args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("(replaced the earlier file)") == 3


# ------------------------------------------------------------- D. every input checked, before any writing


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        # What each line must name: the key, the value refused, what it takes or how to fix it.
        (
            ["--set", "train.metric=CIDEr"],
            ["train.metric", "'CIDEr'", "BLEU-4", "ROUGE-L", "CIDEr-D"],
        ),
        (["--set", "train.metric=METEOR"], ["train.metric", "'METEOR'", "Java"]),
        (
            ["--set", "data.dataset=nope"],
            ["data.dataset", "'nope'", "shapes", "karpathy", "imagefolder"],
        ),
        (["--set", "decode.length_alpha=inf"], ["decode.length_alpha", "finite"]),
        (["--set", "decode.temperature=1e-300"], ["decode.temperature", "32-bit", "1e-300"]),
        (["--set", "train.lr=nan"], ["train.lr", "finite"]),
        (["--seed", "-1"], ["train.seed", "-1", "2**32 - 1"]),
        (["--encoder", "nonexistent"], ["model.encoder.name", "nonexistent"]),
        (
            ["--scoring", "luong_concat"],
            ["model.decoder.scoring", "'luong_concat'", "additive", "--import"],
        ),
        (["--decoder", "gru"], ["model.decoder.kind", "'gru'", "lstm", "transformer"]),
        (["--device", "meta"], ["device", "'meta'", "cpu", "cuda:N"]),
        (["--set", "model.encoder.weights=missing.pt"], ["missing.pt"]),
        (
            ["--set", "data.dataset=karpathy", "--set", "data.split_file=missing.json"],
            ["missing.json", "data.split_file", "no such file"],
        ),
        (
            ["--set", "data.dataset=karpathy", "--set", "data.shapes_train=5"],
            ["data.shapes_train", "shapes and shapes_hallucination dataset readers", "'karpathy'"],
        ),
    ],
    ids=[
        "metric",
        "metric-java",
        "dataset",
        "alpha-inf",
        "temperature-tiny",
        "lr-nan",
        "seed",
        "encoder",
        "scorer",
        "decoder",
        "device-meta",
        "weights",
        "split-file",
        "shapes-option",
    ],
)
def test_train_refuses_bad_input_before_writing_anything(shapes, tmp_path, flags, needles):
    run = tmp_path / "run"
    # Another dataset than Shapes runs without the short Shapes run's own options.
    dataset = next((flag.split("=", 1)[1] for flag in flags if flag.startswith("data.dataset=")), "shapes")
    code, stderr = run_in_process("train.py", [*short_run(shapes, run, **{"data.dataset": dataset}), *flags])
    assert_one_line_error(code, stderr, *needles)
    assert not run.exists()


def test_the_main_job_refuses_a_metric_validation_does_not_compute_before_any_work(shapes, tmp_path):
    from captioning.cli.train import main_job
    from captioning.config.loading import load_config
    from captioning.registry import UnknownNameError

    run = tmp_path / "run"
    overrides = tiny_overrides(shapes.root, run, **{"train.metric": "METEOR", "train.max_steps": 1})
    config = load_config(REPO / "configs" / "shapes.yaml", overrides)  # built in Python: no train.py check
    with pytest.raises(UnknownNameError, match="train.metric names 'METEOR'"):
        main_job(config, progress=False, test=False)
    assert not run.exists()


def test_evaluate_refuses_an_unknown_dataset_before_loading_the_checkpoint(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"not a checkpoint: reading it would fail with another error")
    config = tmp_path / "data.yaml"
    config.write_text("data:\n  dataset: shapes\n")
    for flags in (["--config", config, "--set", "data.dataset=nope"], ["--set", "data.dataset=nope"]):
        code, stderr = run_in_process("evaluate.py", ["--checkpoint", checkpoint, "--split", "test", *flags])
        assert_one_line_error(code, stderr, "data.dataset names an unknown dataset reader 'nope'", "shapes")
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == ["checkpoints"]


def test_train_refuses_unusable_paths_and_files_through_the_tool(shapes, tmp_path):
    null_dir = tmp_path / "null.yaml"
    null_dir.write_text("train:\n  output_dir: null\n")
    result = in_process("train.py", "--config", null_dir, "--no-progress", cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, "train.output_dir must be a string, got null")
    assert not (tmp_path / "None").exists()

    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("train:\n  lr: 0.001 # d\xe9j\xe0\n".encode("latin-1"))
    result = in_process("train.py", "--config", latin1, cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, f"{latin1}: not UTF-8 text")

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    result = in_process(
        "train.py", "--no-progress", *karpathy_flags(deep, shapes.root, tmp_path / "run"), cwd=tmp_path
    )
    assert_one_line_error(result.returncode, result.stderr, f"{deep}: JSON nested too deeply")
    assert not (tmp_path / "run").exists()


def test_a_nul_byte_in_a_path_is_named(shapes):
    code, stderr = run_in_process("evaluate.py", ["--checkpoint", "best\x00.pt", "--split", "test"])
    assert_one_line_error(code, stderr, "--checkpoint", "contains a NUL character")
    code, stderr = run_in_process("train.py", ["--set", "train.output_dir=runs/a\x00b"])
    assert_one_line_error(code, stderr, "contains a NUL character")


def test_train_refuses_an_image_id_beyond_64_bits(shapes, tmp_path):
    split_file = edited_split(
        shapes.split_file, tmp_path / "huge_id.json", lambda d: d["images"][4].update(cocoid=2**63)
    )
    result = in_process(
        "train.py", "--no-progress", *karpathy_flags(split_file, shapes.root, tmp_path / "run"), cwd=REPO
    )
    assert_one_line_error(result.returncode, result.stderr, "huge_id.json", f"image id {2**63} does not fit")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("image_id", ["1", None], ids=["string", "null"])
def test_evaluate_refuses_a_reference_whose_image_id_is_not_an_integer(tmp_path, image_id):
    annotations = tmp_path / "refs.json"
    annotations.write_text(
        json.dumps(
            {
                "images": [{"id": 1}],
                "annotations": [
                    {"image_id": 1, "caption": "a red circle"},
                    {"image_id": image_id, "caption": "a blue square"},
                ],
            }
        )
    )
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}]))
    result = in_process(
        "evaluate.py", "--annotations", annotations, "--results", results, "--no-java", cwd=tmp_path
    )
    assert_one_line_error(
        result.returncode, result.stderr, f"{annotations}: annotations[1]: image_id must be an integer"
    )


def test_grounding_refuses_huge_boxes(shapes, tmp_path):
    instances = json.loads((shapes.root / "instances_shapes.json").read_text())
    instances["annotations"][0]["bbox"] = [0, 0, 1e308, 1e308]
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(instances))
    code, stderr = run_in_process(
        "evaluate.py",
        [
            "--checkpoint",
            shapes.checkpoint,
            "--split",
            "test",
            "--instances",
            path,
            "--results",
            tmp_path / "r.json",
            "--no-java",
            "--no-progress",
        ],
    )
    assert_one_line_error(code, stderr, f"{path}: annotations[0]: bbox values must be within")


def _nan_weight(payload):
    name = next(iter(payload["decoder"]))
    payload["decoder"][name] = torch.full_like(payload["decoder"][name], float("nan"))


def _crc_damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)
    start = member.header_offset + 30 + len(member.filename.encode()) + len(member.extra)
    data[start + member.compress_size // 2] ^= 0xFF  # one flipped byte inside the largest tensor
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (_nan_weight, ["decoder weights", "holds NaN or infinite values"]),
        ("crc", ["corrupt checkpoint", "fails its CRC check"]),
        (
            lambda p: p["decoder"].pop("init_h.weight"),
            ["decoder weights do not fit", "missing init_h.weight"],
        ),
        (
            lambda p: p.update(encoder_fingerprint=[1]),
            ["'encoder_fingerprint' must be a mapping or null, got list"],
        ),
        (
            lambda p: p["decoder"].update({"init_h.weight": "text"}),
            ["decoder weights: entry 'init_h.weight' is not a tensor"],
        ),
    ],
    ids=["nan", "crc", "missing-weight", "fingerprint-list", "weight-not-a-tensor"],
)
def test_evaluate_refuses_a_damaged_checkpoint_in_one_line(shapes, tmp_path, edit, needles):
    path = tmp_path / "damaged.pt"
    if edit == "crc":
        shutil.copy(shapes.checkpoint, path)
        _crc_damage(path)
    else:
        with_stored(shapes.checkpoint, path, edit)
    code, stderr = run_in_process(
        "evaluate.py",
        ["--checkpoint", path, "--split", "test", "--no-progress", "--results", tmp_path / "r.json"],
    )
    line = assert_one_line_error(code, stderr, str(path), *needles)
    assert "KeyError" not in line and "TypeError" not in line and "AttributeError" not in line


def test_a_damaged_checkpoint_through_the_tool(shapes, tmp_path):
    path = with_stored(shapes.checkpoint, tmp_path / "nan.pt", _nan_weight)
    result = in_process("evaluate.py", "--checkpoint", path, "--split", "test", "--no-progress", cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, str(path), "holds NaN or infinite values")


@pytest.mark.parametrize(
    ("script", "option"),
    [
        ("evaluate.py", "--results"),
        ("evaluate.py", "--out"),
        ("visualize.py", "--html"),
        ("visualize.py", "--out-dir"),
    ],
)
def test_unwritable_outputs_are_refused_before_decoding(shapes, tmp_path, monkeypatch, script, option):
    from captioning.cli import evaluate as commands
    from captioning.inference import captioner as runner

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the outputs were checked")

    monkeypatch.setattr(commands, "load_for_tool", never)
    monkeypatch.setattr(runner, "load_trained_captioner", never)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    target = tmp_path / "a-file" if option == "--out-dir" else folder
    (tmp_path / "a-file").write_text("not a folder")
    args = ["--checkpoint", shapes.checkpoint, "--split", "test", option, target]
    code, stderr = run_in_process(script, args)
    assert_one_line_error(code, stderr, f"{target}: {option}:")


def test_the_output_checks_hold_through_the_tool(shapes, tmp_path):
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        shapes.checkpoint,
        "--split",
        "test",
        "--results",
        tmp_path,
        cwd=tmp_path,
    )
    assert_one_line_error(result.returncode, result.stderr, f"{tmp_path}: --results: is a folder")


# ------------------------------------------------------------- B. temporary files and text that is not text


def _package_files() -> set[Path]:
    from pycocoevalcap.tokenizer import ptbtokenizer

    return {p for p in Path(ptbtokenizer.__file__).parents[1].rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("java") is None, reason="needs Java: the PTB tokenizer's temporary file")
def test_a_lone_surrogate_neither_crashes_nor_writes_inside_installed_packages(shapes, tmp_path):
    def edit(data):
        data["images"][0]["sentences"][0].update(tokens=["a", "\ud800", "circle"], raw="a \ud800 circle")
        data["images"][-1]["sentences"][0].update(raw="a \udfff square")  # a test image's reference

    data = json.loads(shapes.split_file.read_text(encoding="utf-8"))
    edit(data)
    split_file = tmp_path / "surrogates.json"
    split_file.write_text(json.dumps(data), encoding="ascii")
    assert "\\ud800" in split_file.read_text()  # JSON escapes: valid JSON, not valid text
    run = tmp_path / "run"
    before = _package_files()
    result = in_process(
        "train.py",
        "--no-progress",
        *karpathy_flags(split_file, shapes.root, run, **{"train.epochs": 1, "train.max_steps": 2}),
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    # its captions are cleaned as the vocabulary's
    assert "cannot write the dataset index" not in result.stderr
    assert "\ufffd" in json.loads((run / "vocab.json").read_text(encoding="utf-8"))["words"]
    assert json.loads((run / "test_scores.json").read_text())["tokenizer"] == "ptb"
    assert _package_files() == before


@pytest.mark.slow
def test_java_that_never_answers_times_out_to_the_java_less_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text("#!/bin/sh\nexec sleep 600\n")
    java.chmod(0o755)
    annotations, results = tmp_path / "refs.json", tmp_path / "run_results.json"
    annotations.write_text(
        json.dumps({"images": [{"id": 1}], "annotations": [{"image_id": 1, "caption": "a red circle"}]})
    )
    results.write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}]))
    environment = {**ONE_THREAD, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "evaluate.py"),
            "--annotations",
            annotations,
            "--results",
            results,
            "--java-timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (warning,) = result.stderr.strip().splitlines()  # one line: what timed out, after how long, what is lost
    assert warning.startswith("warning: ")
    assert all(needle in warning for needle in ("PTB tokenizer", "2 s", "without Java", "METEOR")), warning
    scores = json.loads((tmp_path / "run_scores.json").read_text())
    assert scores["tokenizer"] == "python" and scores["METEOR"] is None and scores["CIDEr-D"] is not None


def test_a_write_removes_only_its_own_temporary_file(tmp_path):
    annotations, results = tmp_path / "refs.json", tmp_path / "results.json"
    annotations.write_text(
        json.dumps({"images": [{"id": 1}], "annotations": [{"image_id": 1, "caption": "a red circle"}]})
    )
    results.write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}]))
    folder = tmp_path / "g"
    folder.mkdir()
    (folder / ".notes.backup.tmp").write_text("the user's")
    result = in_process(
        "evaluate.py",
        "--annotations",
        annotations,
        "--results",
        results,
        "--out",
        "g/*",
        "--no-java",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in folder.iterdir()) == sorted([".notes.backup.tmp", "*", "*.per_image.json"])


# ------------------------------------------------------------------ E. messages


def test_resume_trims_a_half_written_last_line_of_the_step_log(trained_run, shapes, tmp_path):
    run = copy_run(trained_run, tmp_path)
    with (run / "steps.jsonl").open("a") as log:
        log.write('{"step": 3, "epoch": 1, "stage": "xe", "lo')  # the disk filled up mid-append
    result = in_process(
        "train.py", "--no-test", *short_run(shapes, run, **{"train.max_steps": 4}), "--resume", cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    steps = [json.loads(line)["step"] for line in (run / "steps.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MiB tmpfs mounted at tmp_path/disk (root only)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'})")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_real_full_disk_while_checkpointing_says_so_and_keeps_the_previous_checkpoint(
    trained_run, shapes, small_disk
):
    run = small_disk / "run"
    shutil.copytree(trained_run, run)
    last = run / "checkpoints" / "last.pt"
    previous, names = last.read_bytes(), sorted(p.name for p in last.parent.iterdir())
    free = shutil.disk_usage(small_disk).free
    room = len(previous) // 2  # the small files a resumed run rewrites fit; a checkpoint does not
    with (small_disk / "filler").open("wb") as filler:
        filler.write(b"\0" * (free - room))
    result = in_process(
        "train.py", "--no-test", *short_run(shapes, run, **{"train.max_steps": 4}), "--resume", cwd=REPO
    )
    assert_one_line_error(result.returncode, result.stderr, f"{last}: no space left on device", alone=False)
    assert "enforce fail" not in result.stderr
    assert last.read_bytes() == previous
    assert sorted(p.name for p in last.parent.iterdir()) == names  # no temporary file left


# ------------------------------------------------------------------ F. nothing hangs


def test_visualize_names_a_fifo_instead_of_waiting_on_it(shapes, tmp_path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    result = in_process("visualize.py", fifo, "--checkpoint", shapes.checkpoint, cwd=tmp_path, timeout=120)
    assert_one_line_error(result.returncode, result.stderr, f"{fifo}: not a regular file (a FIFO)")


def test_a_fifo_or_a_folder_as_a_data_file_is_named_for_what_it_is(shapes, tmp_path):
    fifo = tmp_path / "split.json"
    os.mkfifo(fifo)
    flags = karpathy_flags(fifo, shapes.root, tmp_path / "run", **{"train.epochs": 1, "train.max_steps": 1})
    result = in_process("train.py", "--no-test", "--no-progress", *flags, cwd=REPO, timeout=120)
    assert_one_line_error(result.returncode, result.stderr, f"{fifo}: data.split_file: a FIFO, not a file")
    assert not (tmp_path / "run").exists()
    flags = karpathy_flags(
        tmp_path, shapes.root, tmp_path / "run", **{"train.epochs": 1, "train.max_steps": 1}
    )
    result = in_process("train.py", "--no-test", "--no-progress", *flags, cwd=REPO, timeout=120)
    assert_one_line_error(
        result.returncode, result.stderr, f"{tmp_path}: data.split_file: a folder, not a file"
    )


def test_a_fifo_in_a_dataset_is_skipped_when_asked(shapes, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(shapes.root, root, ignore=shutil.ignore_patterns("features"))
    (root / "train" / "000002.png").unlink()
    os.mkfifo(root / "train" / "000002.png")
    flags = karpathy_flags(
        root / "dataset_shapes.json",
        root,
        tmp_path / "run",
        **{"train.epochs": 1, "train.max_steps": 1, "data.skip_bad_images": True},
    )
    result = in_process("train.py", "--no-test", "--no-progress", *flags, cwd=REPO, timeout=240)
    assert result.returncode == 0, result.stderr
    # One line like the project's other warnings, not Python's UserWarning with a source line.
    assert any(line.startswith("1 of 32 images could not be read") for line in result.stderr.splitlines())
    assert "UserWarning" not in result.stderr and "cache = " not in result.stderr
    # The FIFO is found by the stat of every image before the cache is opened, never opened, and
    # left out of the cache's rows (it is checked again at every open, so nothing records it).
