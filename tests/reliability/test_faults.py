"""Bad input gets a one-line error and untrusted files run no code, through the real tools.

Faults (kills, full disks) are in test_recovery.py.

Each promise is shown on the command-line tools (exit status 2, one ``error: ...`` line on stderr
naming the file and the entry, no traceback). A real ``python train.py/evaluate.py`` subprocess shows
the error path of each tool (a path climbing out of the root, a checkpoint holding pickled code, bad
options; visualize.py's in test_visualize_cli); the other cases go through the same
``run_cli(main, get_args_parser(), argv)`` call the scripts make, in this process (tests/tool_runs.py),
to keep the module within its time budget; so do the full-disk cases, which monkeypatch a writer.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from test_training import as_flags, tiny_overrides
from tool_runs import REPO, in_process, run_in_process, run_tool

from captioning.config import LSTMDecoderConfig
from captioning.config.loading import load_config
from captioning.data.feature_cache import FeatureCache
from captioning.data.karpathy import read_karpathy
from captioning.data.records import records_of_split
from captioning.data.vocab import Vocabulary
from captioning.hub.checkpoint import load_checkpoint, save_checkpoint
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.encoders import build_encoder
from captioning.training.run import build_run_model, run_datasets
from captioning.utils.distributed import ProcessGroup

SHAPES_YAML = REPO / "configs" / "shapes.yaml"


# ------------------------------------------------------------------ helpers

pytestmark = pytest.mark.usefixtures("single_thread")


def tool_in_repo(script: str, *args) -> subprocess.CompletedProcess:
    """``run_tool(script, *args)`` in this process (tests/tool_runs.py): same exit status and output."""
    return in_process(script, *args, cwd=REPO)


def assert_one_line_error(returncode: int, stderr: str, *needles: str, alone: bool = True) -> str:
    """Exit status 2, no traceback, and one ``error: ...`` line holding every needle, last on stderr.

    ``alone``: nothing else on stderr (else warnings printed before the error are allowed).
    """
    assert "Traceback" not in stderr, stderr
    assert returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error")] == lines[-1:], stderr
    assert lines[-1].startswith("error: ") and (len(lines) == 1 or not alone), stderr
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])
    return lines[-1]


def karpathy_flags(split_file: Path, root: Path, output_dir: Path, **extra) -> list[str]:
    """train.py flags for the tiny model on a Karpathy split file (not deterministic: some run in-process)."""
    return as_flags(
        tiny_overrides(
            root,
            output_dir,
            **{
                "data.dataset": "karpathy",
                "data.split_file": split_file,
                "train.deterministic": False,
                **extra,
            },
        )
    )


def edited_split(source: Path, destination: Path, edit) -> Path:
    data = json.loads(source.read_text(encoding="utf-8"))
    edit(data)
    destination.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return destination


def truncated_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buffer, "JPEG")
    return buffer.getvalue()[: len(buffer.getvalue()) // 2]


def bomb_png(side: int = 30000) -> bytes:
    """A valid PNG header claiming ``side`` x ``side`` pixels (900 M): PIL refuses it before decoding."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


BAD_IMAGES = {  # name -> (bytes, or None for no file; what the error says)
    "missing.jpg": (None, "image file not found"),
    "zero.jpg": (b"", "empty file (0 bytes)"),
    "truncated.jpg": (truncated_jpeg(), "cannot decode image"),
    "text.jpg": (b"a text file, not a picture\n", "not an image file PIL can read"),
    "bomb.png": (bomb_png(), "image too large"),
}


def write_odd_images(folder: Path) -> list[Path]:
    """16-bit grayscale, CMYK, palette and RGBA images: all load as RGB."""
    folder.mkdir(parents=True, exist_ok=True)
    gray16 = Image.fromarray((np.arange(64 * 48).reshape(48, 64) * 21).astype(np.uint16))
    assert gray16.mode.startswith("I;16")
    images = {
        "gray16.png": gray16,
        "cmyk.jpg": Image.new("CMYK", (64, 48), (0, 200, 200, 30)),
        "palette.png": Image.new("P", (48, 64), 3),
        "rgba.png": Image.new("RGBA", (64, 48), (0, 0, 255, 128)),
    }
    for name, image in images.items():
        image.save(folder / name)
    return [folder / name for name in images]


# ------------------------------------------------------------------ shared data


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> SimpleNamespace:
    """Tiny Shapes data with its feature cache, and a checkpoint of the (untrained) tiny model."""
    root, run = tmp_path_factory.mktemp("shapes"), tmp_path_factory.mktemp("run")
    config = load_config(SHAPES_YAML, tiny_overrides(root, run, **{"train.epochs": 0}))
    records, model = build_run_model(config, None, torch.device("cpu"), ProcessGroup())
    run_datasets(records, model, config, run, False, torch.device("cpu"))
    checkpoint = run / "checkpoints" / "best.pt"
    save_checkpoint(
        checkpoint,
        config=config,
        vocab=model.vocab,
        decoder_state=model.decoder.state_dict(),
        encoder_fingerprint=model.encoder.fingerprint(),
    )
    return SimpleNamespace(
        root=root,
        split_file=root / "dataset_shapes.json",
        config=config,
        checkpoint=checkpoint,
        vocab=model.vocab,
        channels=model.encoder.channels,
    )


@pytest.fixture(scope="module")
def odd_dataset(shapes, tmp_path_factory) -> SimpleNamespace:
    """A copy of the tiny Shapes split with odd captions and unreadable images, as a Karpathy split."""
    root = tmp_path_factory.mktemp("odd")
    for split in ("train", "val", "test"):
        shutil.copytree(shapes.root / split, root / split)
    (root / "train" / "000003.png").write_bytes(truncated_jpeg())
    (root / "train" / "000005.png").write_bytes(b"a text file, not a picture\n")
    (root / "train" / "000007.png").unlink()
    (root / "train" / "000009.png").write_bytes(b"")
    (root / "val" / "000033.png").write_bytes(bomb_png())

    def edit(data):
        first, second = data["images"][0]["sentences"], data["images"][1]["sentences"]
        first[0].update(tokens=[], raw="")
        first[1].update(tokens=["  ", "\t"], raw=" \t ")
        long_words = [f"w{k}" for k in range(40)]
        second[0].update(tokens=long_words, raw=" ".join(long_words))
        second[1].update(tokens=["кошка", "猫", "قطة", "Ünïcödé"], raw="кошка 猫 قطة Ünïcödé")
        for sentence in data["images"][10]["sentences"]:
            sentence.update(tokens=[], raw="")

    split_file = edited_split(shapes.split_file, root / "dataset_odd.json", edit)
    return SimpleNamespace(root=root, split_file=split_file)


# ------------------------------------------------------------------ 1. annotation and results files


@pytest.mark.slow
def test_train_refuses_an_image_path_that_climbs_out_of_the_root(shapes, tmp_path):
    split_file = edited_split(
        shapes.split_file,
        tmp_path / "climbing.json",
        lambda d: d["images"][2].update(filename="../../../etc/passwd"),
    )
    result = run_tool("train.py", "--no-progress", *karpathy_flags(split_file, shapes.root, tmp_path / "run"))
    assert_one_line_error(
        result.returncode, result.stderr, "climbing.json: image 2 (cocoid 3)", "must not contain '..'"
    )


def _pop_split(data):
    data["images"][3].pop("split")


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        ("{oops", ["bad.json: not valid JSON"]),
        ([1, 2], ["bad.json: expected a JSON object with an 'images' list"]),
        (_pop_split, ["bad.json: image 3 (cocoid 4): missing field 'split'"]),
        (lambda d: d["images"][4].update(cocoid=1), ["bad.json: image 4 (cocoid 1): duplicate image id 1"]),
        (
            lambda d: d["images"][2].update(filepath="/etc"),
            ["bad.json: image 2 (cocoid 3)", "must be relative"],
        ),
    ],
    ids=["not-json", "wrong-schema", "missing-field", "duplicate-id", "absolute-path"],
)
def test_train_refuses_malformed_annotations(shapes, tmp_path, edit, needles):
    split_file = tmp_path / "bad.json"
    if callable(edit):
        edited_split(shapes.split_file, split_file, edit)
    else:
        split_file.write_text(edit if isinstance(edit, str) else json.dumps(edit), encoding="utf-8")
    code, stderr = run_in_process(
        "train.py", ["--no-progress", *karpathy_flags(split_file, shapes.root, tmp_path / "run")]
    )
    assert_one_line_error(code, stderr, *needles)


def test_train_keeps_odd_captions_and_skips_unreadable_images(odd_dataset, tmp_path):
    """Empty captions dropped (2, and the 5 of image 10, which goes), a long one cut, other scripts kept,
    unreadable images skipped: all counted."""
    run = tmp_path / "run"
    flags = karpathy_flags(
        odd_dataset.split_file,
        odd_dataset.root,
        run,
        **{
            "data.skip_bad_images": True,
            "data.max_caption_length": 30,
            "data.cache_dir": tmp_path / "cache",
            "train.epochs": 1,
            "train.max_steps": 2,
        },
    )
    result = tool_in_repo("train.py", "--no-progress", "--no-test", *flags)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert (
        "dataset_odd.json: skipped 7 empty captions (first: dataset_odd.json: image 0 (cocoid 1) sentence 0)"
        in result.stderr
    )
    assert (
        "dataset_odd.json: skipped 1 images with no caption (first: dataset_odd.json: image 10 (cocoid 11))"
        in result.stderr
    )
    assert "1 of 153 training captions (0.7%) exceed 30 words and are cut" in result.stderr
    assert "4 of 31 images could not be read" in result.stderr  # truncated, text, missing, empty
    assert "1 of 8 images could not be read" in result.stderr  # the validation bomb
    summary = json.loads((run / "data_summary.json").read_text())
    assert (
        summary["splits"]["train"] == {"images": 31, "captions": 153} and summary["train_captions_cut"] == 1
    )
    vocab = Vocabulary.load(run / "vocab.json")
    assert {"кошка", "猫", "قطة", "ünïcödé", "w39"} <= set(vocab.itos)
    assert load_checkpoint(run / "checkpoints" / "last.pt")["training"]["state"]["global_step"] == 2


def test_train_without_skipping_stops_at_the_first_unreadable_image(odd_dataset, tmp_path):
    flags = karpathy_flags(
        odd_dataset.split_file, odd_dataset.root, tmp_path / "run", **{"data.cache_dir": tmp_path / "cache"}
    )
    result = tool_in_repo("train.py", "--no-progress", "--no-test", *flags)
    # A missing file is found before any image is read; an unreadable one when the cache reaches it.
    assert_one_line_error(
        result.returncode,
        result.stderr,
        str(odd_dataset.root / "train" / "000007.png"),
        "(image 7)",
        "image file not found",
        alone=False,
    )  # after the caption warnings
    assert not list((tmp_path / "cache").glob("*/features.npy"))
    (odd_dataset.root / "train" / "000007.png").write_bytes(
        (odd_dataset.root / "train" / "000001.png").read_bytes()
    )
    try:
        result = tool_in_repo("train.py", "--no-progress", "--no-test", *flags)
    finally:
        (odd_dataset.root / "train" / "000007.png").unlink()
    assert_one_line_error(
        result.returncode,
        result.stderr,
        str(odd_dataset.root / "train" / "000003.png"),
        "(image 3)",
        "cannot decode image",
        alone=False,
    )


def test_a_cache_that_skipped_images_is_refused_by_a_run_that_does_not(odd_dataset, tmp_path, caplog):
    config = load_config(
        SHAPES_YAML,
        tiny_overrides(
            odd_dataset.root,
            tmp_path,
            **{"data.dataset": "karpathy", "data.split_file": odd_dataset.split_file},
        ),
    )
    records = records_of_split(read_karpathy(odd_dataset.split_file, odd_dataset.root), "val")
    encoder = build_encoder(config.model.encoder)
    with caplog.at_level(logging.WARNING, logger="captioning.data.feature_cache"):
        FeatureCache.build_or_open(tmp_path / "cache", encoder, records, progress=False, skip_bad_images=True)
    assert "1 of 8 images could not be read" in caplog.text
    with pytest.raises(ValueError, match=r"val/000033.png \(image 33\): image too large .*skip_bad_images"):
        FeatureCache.build_or_open(tmp_path / "cache", encoder, records, progress=False)


@pytest.fixture(scope="module")
def results_files(shapes, tmp_path_factory) -> SimpleNamespace:
    folder = tmp_path_factory.mktemp("results")
    annotations = shapes.root / "captions_test.json"
    ids = [image["id"] for image in json.loads(annotations.read_text())["images"]]
    good = [{"image_id": i, "caption": "a small red circle"} for i in ids]
    return SimpleNamespace(folder=folder, annotations=annotations, ids=ids, good=good)


def test_evaluate_refuses_a_results_file_with_repeated_ids(results_files, tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(results_files.good + [results_files.good[2]]))
    result = tool_in_repo(
        "evaluate.py", "--annotations", results_files.annotations, "--results", results, "--no-java"
    )
    assert_one_line_error(
        result.returncode, result.stderr, f"{results}: entry 8: image_id {results_files.ids[2]} appears twice"
    )
    assert not list(tmp_path.glob("*.scores*"))


def _drop_caption(data):
    del data["annotations"][3]["caption"]


def _repeat_annotation_id(data):
    data["annotations"][3]["id"] = data["annotations"][2]["id"]


@pytest.mark.parametrize(
    ("which", "content", "needles"),
    [
        ("results", "[{", ["results.json: not valid JSON"]),
        ("results", {"image_id": 41}, ["results.json: expected a list of results, got dict"]),
        ("results", [{"image_id": 41}], ["results.json: entry 0 has no 'caption'"]),
        ("results", "unknown id", ["results.json: image_id 999999 has no reference captions in"]),
        ("results", [], ["results.json: holds no results (an empty list); nothing to score"]),
        ("annotations", "nope", ["captions.json: not valid JSON"]),
        ("annotations", {"images": []}, ["captions.json: missing the list 'annotations'"]),
        ("annotations", _drop_caption, ["captions.json: annotations[3] has no 'caption'"]),
        (
            "annotations",
            _repeat_annotation_id,
            ["captions.json: annotations[3]: duplicate id", "(also annotations[2])"],
        ),
    ],
    ids=[
        "results-not-json",
        "results-not-list",
        "results-missing-key",
        "results-id-without-references",
        "results-empty",
        "annotations-not-json",
        "annotations-wrong-schema",
        "annotations-missing-field",
        "annotations-duplicate-id",
    ],
)
def test_evaluate_refuses_malformed_scoring_files(results_files, tmp_path, which, content, needles):
    annotations, results = tmp_path / "captions.json", tmp_path / "results.json"
    shutil.copy(results_files.annotations, annotations)
    results.write_text(json.dumps(results_files.good))
    target = annotations if which == "annotations" else results
    if content == "unknown id":
        results.write_text(json.dumps(results_files.good + [{"image_id": 999999, "caption": "a dog"}]))
    elif callable(content):
        edited_split(target, target, content)
    else:
        target.write_text(content if isinstance(content, str) else json.dumps(content))
    code, stderr = run_in_process(
        "evaluate.py", ["--annotations", annotations, "--results", results, "--no-java"]
    )
    assert_one_line_error(code, stderr, *needles)


# ------------------------------------------------------------------ 2. images


@pytest.mark.parametrize("name", list(BAD_IMAGES))
def test_visualize_names_an_unreadable_image(shapes, tmp_path, name):
    content, reason = BAD_IMAGES[name]
    image = tmp_path / name
    if content is not None:
        image.write_bytes(content)
    result = tool_in_repo(
        "visualize.py",
        image,
        "--checkpoint",
        shapes.checkpoint,
        "--out-dir",
        tmp_path / "out",
        "--no-progress",
    )
    assert_one_line_error(result.returncode, result.stderr, str(image), reason)
    assert not (tmp_path / "out").exists()


def test_evaluate_folder_captions_odd_modes_and_skips_bad_images_when_asked(shapes, tmp_path):
    folder = tmp_path / "images"
    odd = write_odd_images(folder)
    for name, (content, _) in BAD_IMAGES.items():
        if content is not None:
            (folder / name).write_bytes(content)
    results = tmp_path / "captions.json"
    result = tool_in_repo(
        "evaluate.py",
        "--checkpoint",
        shapes.checkpoint,
        "--images",
        folder,
        "--results",
        results,
        "--skip-bad-images",
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    assert "skipped 4 of 8 images that could not be read" in result.stdout
    for name in ("zero.jpg", "truncated.jpg", "text.jpg", "bomb.png"):
        assert str(folder / name) in result.stderr
    files = json.loads(results.with_name("captions_files.json").read_text())
    captions = json.loads(results.read_text())
    assert sorted(Path(files[str(c["image_id"])]).name for c in captions) == sorted(p.name for p in odd)
    assert all(isinstance(c["caption"], str) for c in captions)  # an untrained model: any words, maybe none


@pytest.mark.parametrize("name", [n for n, (content, _) in BAD_IMAGES.items() if content is not None])
def test_evaluate_folder_names_an_unreadable_image(shapes, tmp_path, name):
    content, reason = BAD_IMAGES[name]
    folder = tmp_path / "images"
    write_odd_images(folder)
    (folder / name).write_bytes(content)
    code, stderr = run_in_process(
        "evaluate.py",
        [
            "--checkpoint",
            shapes.checkpoint,
            "--images",
            folder,
            "--results",
            tmp_path / "r.json",
            "--no-progress",
        ],
    )
    assert_one_line_error(code, stderr, str(folder / name), reason)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_visualize_draws_odd_image_modes(shapes, tmp_path):
    images = write_odd_images(tmp_path / "images")
    code, stderr = run_in_process(
        "visualize.py",
        [*images, "--checkpoint", shapes.checkpoint, "--out-dir", tmp_path / "out", "--no-progress"],
    )
    assert code == 0, stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.stem + ".png" for p in images)


# ------------------------------------------------------------------ 3. checkpoints


class WritesMarker:
    """Unpickling this object creates a file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.slow
def test_evaluate_refuses_a_checkpoint_holding_pickled_code(shapes, tmp_path):
    marker = tmp_path / "code-ran"
    payload = load_checkpoint(shapes.checkpoint)
    payload["training"] = {"hook": WritesMarker(marker)}
    evil = tmp_path / "evil.pt"
    torch.save(payload, evil)  # plain torch.save pickles anything
    result = run_tool("evaluate.py", "--checkpoint", evil, "--split", "test", "--no-progress")
    line = assert_one_line_error(result.returncode, result.stderr, str(evil), "refused")
    assert "weights_only" not in line and "\x1b" not in line  # no advice to load it unsafely, no colour codes
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # the payload is live: an unsafe load runs it
    assert marker.exists()


def _other_sizes(shapes, path: Path) -> None:
    decoder = ShowAttendTellDecoder.from_config(
        LSTMDecoderConfig(embed_dim=24, hidden_dim=48, attention_dim=16), len(shapes.vocab), shapes.channels
    )
    save_checkpoint(path, config=shapes.config, vocab=shapes.vocab, decoder_state=decoder.state_dict())


def _other_vocabulary(shapes, path: Path) -> None:
    larger = Vocabulary(shapes.vocab.itos + ["zebra", "giraffe"])
    decoder = ShowAttendTellDecoder.from_config(shapes.config.model.decoder, len(larger), shapes.channels)
    save_checkpoint(path, config=shapes.config, vocab=shapes.vocab, decoder_state=decoder.state_dict())


def _truncated(shapes, path: Path) -> None:
    data = shapes.checkpoint.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        (_truncated, ["truncated or corrupt checkpoint"]),
        (
            _other_sizes,
            ["decoder weights do not fit the model configuration", "embedding.weight ({V}, 24) vs ({V}, 16)"],
        ),
        (_other_vocabulary, ["decoder weights do not fit", "embedding.weight ({V2}, 16) vs ({V}, 16)"]),
        (None, ["checkpoint file not found"]),
    ],
    ids=["truncated", "other-sizes", "other-vocabulary", "missing"],
)
def test_evaluate_refuses_unusable_checkpoints(shapes, tmp_path, make, needles):
    path = tmp_path / "model.pt"
    if make is not None:
        make(shapes, path)
    code, stderr = run_in_process("evaluate.py", ["--checkpoint", path, "--split", "test", "--no-progress"])
    sizes = {"V": len(shapes.vocab), "V2": len(shapes.vocab) + 2}
    assert_one_line_error(code, stderr, str(path), *(needle.format(**sizes) for needle in needles))


# ------------------------------------------------------------------ 4. command line


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--beam-size", "0"], ["decode.beam_size must be >= 1, got 0"]),
        (["--lr", "-1"], ["train.lr must be > 0, got -1.0"]),
        (["--epochs", "-1"], ["train.epochs must be >= 0, got -1"]),
        (["--config", "missing.yaml"], ["missing.yaml: cannot read configuration"]),
        (["--set", "train.epochs"], ["--set expects KEY=VALUE"]),
    ],
    ids=["beam-size-0", "negative-lr", "negative-epochs", "missing-config", "bad-set"],
)
def test_train_refuses_bad_options(tmp_path, args, needles):
    result = run_tool("train.py", *args, "--output-dir", tmp_path / "run")
    line = assert_one_line_error(result.returncode, result.stderr, *needles)
    assert args[0] == "--config" or "shapes.yaml" not in line  # the value came from the flag, not the file
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("script", ["train.py", "evaluate.py", "visualize.py"])
def test_unknown_options_are_argparse_errors(script):
    required = ["--checkpoint", "x.pt"] if script == "visualize.py" else []
    result = run_tool(script, *required, "--frobnicate", "3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"{script}: error: ")
    assert "--frobnicate" in result.stderr


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--images", "missing/"], ["missing: folder not found"]),
        (["--split", "test", "--beam-size", "0"], ["decode.beam_size must be >= 1, got 0"]),
        (["--split", "test", "--max-length", "0"], ["decode.max_length must be in [1, 500], got 0"]),
        (["--split", "test", "--config", "missing.yaml"], ["missing.yaml: cannot read configuration"]),
        (["--split", "test", "--set", "decode.beams=3"], ["unknown configuration key 'decode.beams'"]),
        (
            ["--split", "test", "--set", "model.decoder.gate=none"],
            ["model.decoder.gate: only data.* and decode.*"],
        ),
    ],
    ids=[
        "missing-folder",
        "beam-size-0",
        "max-length-0",
        "missing-config",
        "set-unknown-key",
        "set-model-key",
    ],
)
def test_evaluate_refuses_bad_options_before_loading_the_model(shapes, monkeypatch, args, needles):
    from captioning.cli import evaluate as commands

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the options were checked")

    monkeypatch.setattr(commands, "load_for_tool", never)
    code, stderr = run_in_process("evaluate.py", ["--checkpoint", shapes.checkpoint, *args])
    assert_one_line_error(code, stderr, *needles)
