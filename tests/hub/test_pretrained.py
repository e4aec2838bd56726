"""Model folders: ``save_pretrained`` writes safetensors and no pickle, the folder reloads in a fresh
process with the run folder and the data moved away, the tools take it, bad folders fail in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from messages import raises_naming
from safetensors.torch import load_file
from tiny_models import photo, tiny_checkpoint, trained_checkpoint
from tool_runs import ONE_THREAD, REPO, in_process

import captioning
from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary
from captioning.evaluation.signature import file_hash
from captioning.hub.checkpoint import CheckpointError
from captioning.models.encoders import EncoderWeightsError

FILES = {"model.safetensors", "config.json", "vocab.json", "README.md"}


@pytest.fixture(scope="module")
def untrained(
    tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary
) -> dict:
    folder = tmp_path_factory.mktemp("untrained")
    return {
        kind: tiny_checkpoint(folder / kind / "best.pt", tiny_shapes.root, shapes_vocab, kind)
        for kind in ("lstm", "transformer")
    }


@pytest.mark.slow
def test_folder_holds_safetensors_and_no_pickle(untrained, tmp_path):
    for kind, checkpoint in untrained.items():
        model = captioning.load(checkpoint, device="cpu")
        folder = model.save_pretrained(tmp_path / kind)
        assert {path.name for path in folder.iterdir()} == FILES
        for path in folder.iterdir():  # no pickle stream (protocol 2+ starts with 0x80) and no torch zip
            assert path.read_bytes()[:2] not in (b"PK", b"\x80\x02", b"\x80\x04", b"\x80\x05"), path
        tensors = load_file(folder / "model.safetensors")
        names = {name.split(".")[0] for name in tensors}
        assert names == {"decoder", "encoder"}  # random encoder weights travel with the model
        description = json.loads((folder / "config.json").read_text())
        assert description["format"] == "captioning-model"
        assert description["config"]["model"]["decoder"]["kind"] == kind
        card = (folder / "README.md").read_text()
        assert f'captioning.load("{kind}")' in card and "No test scores" in card
        image = photo(tmp_path / "photo.jpg")
        again = captioning.load(folder, device="cpu")
        before, after = model.caption([image])[0], again.caption([image])[0]
        assert after.words == before.words and after.log_prob == pytest.approx(before.log_prob, abs=1e-5)


@pytest.mark.slow
def test_folder_reloads_elsewhere_without_run_folder_data_or_cache(tmp_path):
    """A fresh process, the run folder and the data moved away: the same captions (the pretrained
    encoder's weights are found as training finds them, from the installed package)."""
    checkpoint, images = trained_checkpoint(tmp_path / "work")
    photos = tmp_path / "photos"
    photos.mkdir()
    for image in images:
        shutil.copy(image, photos / image.name)
    model = captioning.load(checkpoint, device="cpu")
    expected = [caption.text for caption in model.caption(sorted(photos.iterdir()))]
    assert len(set(expected)) > 1
    folder = model.save_pretrained(tmp_path / "shared" / "tiny-shapes")
    assert {name.split(".")[0] for name in load_file(folder / "model.safetensors")} == {"decoder"}
    (tmp_path / "work").rename(tmp_path / "moved")  # run folder, Shapes data and its feature cache
    code = (
        "import json, pathlib, sys, captioning; model = captioning.load(sys.argv[1], device='cpu'); "
        "print(json.dumps([c.text for c in model.caption(sorted(pathlib.Path(sys.argv[2]).iterdir()))]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(folder), str(photos)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path / "shared",
        timeout=300,
        env={**ONE_THREAD, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected


@pytest.mark.slow
def test_evaluate_and_visualize_take_a_folder(untrained, tmp_path):
    folder = captioning.load(untrained["lstm"], device="cpu").save_pretrained(tmp_path / "model")
    images = tmp_path / "images"
    photo(images / "cat.jpg")
    results = tmp_path / "out" / "captions_results.json"
    run = in_process(
        "evaluate.py", "--checkpoint", folder, "--images", images, "--results", results, "--no-progress"
    )
    assert run.returncode == 0, run.stderr
    expected = captioning.load(folder, device="cpu").caption([images / "cat.jpg"])[0].text
    assert json.loads(results.read_text()) == [{"image_id": 1, "caption": expected}]
    run = in_process(
        "visualize.py",
        images / "cat.jpg",
        "--checkpoint",
        folder,
        "--out-dir",
        tmp_path / "figures",
        "--no-progress",
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "figures" / "cat.png").is_file()


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _bad_folders(folder: Path, tmp_path: Path) -> list[tuple[Path, tuple[object, ...]]]:
    """Broken copies of a good model folder, each with what its loading's message must name: the file
    (or folder) and the entry or value at fault."""

    def copy(name: str) -> Path:
        return Path(shutil.copytree(folder, tmp_path / name))

    cases: list[tuple[Path, tuple[object, ...]]] = []
    no_weights = copy("no_weights")
    (no_weights / "model.safetensors").unlink()
    cases.append((no_weights, (no_weights / "model.safetensors", "not found")))
    no_vocab = copy("no_vocab")
    (no_vocab / "vocab.json").unlink()
    cases.append((no_vocab, (no_vocab / "vocab.json", "not found")))
    foreign = tmp_path / "bert"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    (foreign / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    cases.append((foreign, (foreign / "config.json", "captioning")))
    empty = tmp_path / "empty"
    empty.mkdir()
    cases.append((empty, (empty, "config.json")))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.pt").write_bytes(b"")
    # the tools take a checkpoint; captioning.load takes the run and reads its checkpoint
    cases.append((run, (run, "best.pt")))
    unfit = copy("unfit")
    _edit_json(unfit / "config.json", lambda d: d["config"]["model"]["decoder"].update(hidden_dim=24))
    cases.append((unfit, (unfit, "decoder", "shape")))
    for name, change, names in [
        ("not_sections", lambda d: d.update(config="x"), ('"config"',)),
        ("no_model", lambda d: d["config"].update(model=[1]), ('"config"',)),
        ("huge", lambda d: d["config"]["model"]["decoder"].update(hidden_dim=2**40), ("hidden_dim", 2**40)),
        (
            "huge_image",
            lambda d: d["config"]["model"]["encoder"].update(image_size=10**9),
            ("image_size", 10**9),
        ),
        (
            "overflow",
            lambda d: d["config"]["model"]["decoder"].update(embed_dim=10**30),
            ("embed_dim", 10**30),
        ),
        (
            "as_text",
            lambda d: d["config"]["model"]["encoder"].update(image_size="64"),
            ("image_size", "'64'"),
        ),
        ("wide", lambda d: d["config"]["model"]["decoder"].update(hidden_dim=16000), ("16000",)),
    ]:
        edited = copy(name)
        _edit_json(edited / "config.json", change)
        cases.append(
            (edited, (edited / "config.json" if name in ("not_sections", "no_model") else edited, *names))
        )
    truncated = copy("truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    cases.append((truncated, (truncated / "model.safetensors", "safetensors")))
    stray = copy("stray")
    shutil.copy(tmp_path / "lone" / "model.safetensors", stray / "model.safetensors")
    cases.append((stray, (stray / "model.safetensors", "encoder")))
    return cases


@pytest.mark.slow
def test_bad_folders_fail_in_one_line_before_any_work(untrained, tmp_path):
    folder = captioning.load(untrained["lstm"], device="cpu").save_pretrained(tmp_path / "good")
    # A decoder-only weights file, for a folder whose random encoder needs its weights.
    from safetensors.torch import save_file

    (tmp_path / "lone").mkdir()
    save_file(
        {k: v for k, v in load_file(folder / "model.safetensors").items() if k.startswith("decoder.")},
        str(tmp_path / "lone" / "model.safetensors"),
    )
    images = tmp_path / "images"
    photo(images / "cat.jpg")
    for bad, names in _bad_folders(folder, tmp_path):
        with raises_naming(CheckpointError, *names):
            captioning.load(bad, device="cpu")
        results = tmp_path / "results" / f"{bad.name}.json"
        run = in_process(
            "evaluate.py", "--checkpoint", bad, "--images", images, "--results", results, "--no-progress"
        )
        assert run.returncode == 2
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and bad.name in lines[0], run.stderr
        assert not results.exists()


def test_missing_encoder_weights_file_is_named(untrained, tmp_path):
    """An encoder trained from a weights file that this machine lacks: the file is named."""
    folder = captioning.load(untrained["lstm"], device="cpu").save_pretrained(tmp_path / "model")
    _edit_json(
        folder / "config.json",
        lambda d: d["config"]["model"]["encoder"].update(weights="/elsewhere/lite0.pth", fine_tune_stages=1),
    )
    with raises_naming(EncoderWeightsError, "/elsewhere/lite0.pth", "model.encoder.weights"):
        captioning.load(folder, device="cpu")


def test_card_has_the_test_scores_signed_with_the_checkpoint(untrained, tmp_path):
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "best.pt"
    checkpoint.parent.mkdir(parents=True)
    shutil.copy(untrained["lstm"], checkpoint)
    scores = {
        "BLEU-4": 0.4321,
        "CIDEr-D": 1.2345,
        "METEOR": None,
        "images": 8,
        "tokenizer": "python",
        "signature": f"refs:abc|n:8|tok:python|decode:beam2.max5|ckpt:{file_hash(checkpoint)}",
    }
    (run / "test_scores.json").write_text(json.dumps(scores))
    model = captioning.load(checkpoint, device="cpu")
    card = (model.save_pretrained(tmp_path / "signed") / "README.md").read_text()
    assert "| BLEU-4 | CIDEr-D |" in card and "| 0.432 | 1.234 |" in card
    assert f"Signature: `{scores['signature']}`" in card
    # A re-saved folder keeps them; scores of another checkpoint are not this model's.
    again = captioning.load(tmp_path / "signed", device="cpu").save_pretrained(tmp_path / "resaved")
    assert "| 0.432 | 1.234 |" in (again / "README.md").read_text()
    (run / "test_scores.json").write_text(json.dumps({**scores, "signature": "refs:abc|ckpt:000000000000"}))
    card = (model.save_pretrained(tmp_path / "unsigned") / "README.md").read_text()
    assert "No test scores" in card and "0.432" not in card
