"""The Python API: ``captioning.load(...).caption([...])`` on every kind of image, equal to ``evaluate.py
--images``; ``captioning.show`` equal to ``visualize.py``'s figure; the README's example run as is."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from messages import raises_naming
from PIL import Image
from tiny_models import pattern, photo, tiny_checkpoint, trained_checkpoint
from tool_runs import ONE_THREAD, REPO, in_process

import captioning
from captioning.config import ConfigError, DecodeConfig
from captioning.data.images import ImageError
from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary
from captioning.models import choices
from captioning.visualization.figures import save_figure


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    return trained_checkpoint(tmp_path_factory.mktemp("trained"))


@pytest.fixture(scope="module")
def untrained(
    tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary
) -> dict:
    folder = tmp_path_factory.mktemp("untrained")
    return {
        kind: tiny_checkpoint(folder / kind / "best.pt", tiny_shapes.root, shapes_vocab, kind)
        for kind in ("lstm", "transformer")
    }


def test_import_is_light():
    """``import captioning`` loads neither torch nor matplotlib: the tools check their input first."""
    code = "import sys, captioning; print(sorted({'torch', 'matplotlib'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**ONE_THREAD, "PYTHONPATH": str(REPO)},
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_every_kind_of_image_gives_the_same_caption(trained):
    checkpoint, images = trained
    model = captioning.load(checkpoint, device="cpu")
    path = images[0]
    pixels = np.array(Image.open(path).convert("RGB"))  # (H, W, 3) uint8
    forms = [
        path,
        str(path),
        Image.open(path),
        pixels,
        pixels / 255.0,
        torch.from_numpy(pixels).permute(2, 0, 1),
        torch.from_numpy(pixels).permute(2, 0, 1).float() / 255,
    ]
    captions = model.caption(forms)
    assert len(captions) == len(forms)
    first = captions[0]
    assert first.words and first.text == " ".join(first.words)
    for caption in captions[1:]:
        assert caption.words == first.words
        assert caption.log_prob == pytest.approx(first.log_prob, abs=1e-4)
    grid = model.grid
    assert first.attention.shape == (len(first.words), *grid)
    np.testing.assert_allclose(first.attention.sum(axis=(1, 2)), 1.0, atol=1e-5)
    assert first.beta is not None and first.beta.shape == (len(first.words),)
    assert np.isfinite(first.log_prob) and first.log_prob < 0


@pytest.mark.slow
def test_captions_equal_evaluate_images(trained, tmp_path):
    checkpoint, images = trained
    folder = tmp_path / "images"
    folder.mkdir()
    for image in images:
        shutil.copy(image, folder / image.name)
    results = tmp_path / "results.json"
    run = in_process(
        "evaluate.py",
        "--checkpoint",
        checkpoint,
        "--images",
        folder,
        "--results",
        results,
        "--beam-size",
        "3",
        "--max-length",
        "6",
        "--no-progress",
    )
    assert run.returncode == 0, run.stderr
    by_id = {entry["image_id"]: entry["caption"] for entry in json.loads(results.read_text())}
    files = json.loads((tmp_path / "results_files.json").read_text())
    expected = {Path(files[str(image_id)]).name: caption for image_id, caption in by_id.items()}

    model = captioning.load(checkpoint, device="cpu")
    paths = sorted(folder.iterdir())
    captions = model.caption(paths, beam_size=3, max_length=6)
    assert {path.name: caption.text for path, caption in zip(paths, captions, strict=True)} == expected
    assert len(set(expected.values())) > 1  # the images get different captions: a mix-up would show


@pytest.mark.slow
def test_decoding_options_hold_for_one_call(trained):
    checkpoint, images = trained
    model = captioning.load(checkpoint, device="cpu")
    default = model.caption(images[:3])
    short = model.caption(images[:3], max_length=2, strategy="greedy")
    assert all(len(caption.words) <= 2 for caption in short)
    assert any(len(caption.words) > 2 for caption in default)
    assert [c.text for c in model.caption(images[:3])] == [c.text for c in default]
    assert all(len(c.words) >= 7 for c in model.caption(images[:2], min_length=7))
    with pytest.raises(ConfigError, match="beam_size"):
        model.caption(images[:1], beam_size=0)


@pytest.mark.slow
def test_several_ranked_captions_through_the_api_and_evaluate_images(untrained, tmp_path):
    checkpoint = untrained["lstm"]
    folder = tmp_path / "images"
    paths = [photo(folder / "cat.jpg"), pattern(folder / "noise.png", seed=3)]
    model = captioning.load(checkpoint, device="cpu")
    best = model.caption(paths, beam_size=4, max_length=6)
    several = model.caption(paths, beam_size=4, max_length=6, num_return=3)
    for one, caption in zip(best, several, strict=True):
        assert caption.text == one.text and caption.log_prob == pytest.approx(one.log_prob, abs=1e-6)
        ranked = caption.ranked
        assert len(ranked) == 3 and len({c.text for c in ranked}) == 3
        keys = [(c.finished, c.score) for c in ranked]
        assert keys == sorted(keys, reverse=True)
        for other in ranked:
            assert other.attention.shape == (len(other.words), *model.grid)
            np.testing.assert_allclose(other.attention.sum(axis=(1, 2)), 1.0, atol=1e-5)
    assert best[0].alternatives == ()

    results = tmp_path / "out" / "folder_results.json"
    run = in_process(
        "evaluate.py",
        "--checkpoint",
        checkpoint,
        "--images",
        folder,
        "--results",
        results,
        "--beam-size",
        "4",
        "--max-length",
        "6",
        "--num-return",
        "3",
        "--no-progress",
    )
    assert run.returncode == 0, run.stderr
    files = json.loads((tmp_path / "out" / "folder_files.json").read_text())
    by_name = {
        Path(files[str(row["image_id"])]).name: row["caption"] for row in json.loads(results.read_text())
    }
    assert by_name == {path.name: caption.text for path, caption in zip(paths, several, strict=True)}
    rows = json.loads((tmp_path / "out" / "folder_ranked.json").read_text())
    assert len(rows) == 6
    for path, caption in zip(paths, several, strict=True):
        mine = sorted(
            (row for row in rows if Path(files[str(row["image_id"])]).name == path.name),
            key=lambda r: r["rank"],
        )
        assert [row["rank"] for row in mine] == [1, 2, 3]
        assert [row["caption"] for row in mine] == [c.text for c in caption.ranked]
        assert [row["log_prob"] for row in mine] == pytest.approx(
            [c.log_prob for c in caption.ranked], abs=1e-5
        )
    assert "mBLEU-4" in run.stdout and "distinct-2" in run.stdout and "ranked captions" in run.stdout


@dataclasses.dataclass(frozen=True)
class _WithOption(DecodeConfig):
    word_cap: int = 0


def test_decoding_options_are_one_object_and_unknown_names_are_refused(untrained, tmp_path, monkeypatch):
    model = captioning.load(untrained["lstm"], device="cpu")
    image = [photo(tmp_path / "cat.jpg")]
    options = dataclasses.replace(model.decode_config, strategy="greedy", min_length=0, max_length=2)
    assert [c.text for c in model.caption(image, options)] == [
        c.text for c in model.caption(image, strategy="greedy", min_length=0, max_length=2)
    ]
    assert len(model.caption(image, options, max_length=1)[0].words) <= 1  # an override of the object
    with raises_naming(ConfigError, "beam_width", "beam_size"):
        model.caption(image, beam_width=3)
    # a fork's new option: a field of a DecodeConfig subclass reaches the search through caption()
    reached = []
    original = choices.choice_scores

    def choice_scores(log_probs, history, step, config):
        reached.append(config.word_cap)
        return original(log_probs, history, step, config)

    monkeypatch.setattr(choices, "choice_scores", choice_scores)
    model.caption(image, _WithOption(**vars(options)), word_cap=7)
    assert reached and set(reached) == {7}
    with raises_naming(ConfigError, "num_return 2", "strategy", "greedy"):
        model.caption(image, strategy="greedy", num_return=2)


@pytest.mark.slow
def test_show_draws_the_figure_visualize_draws(trained, tmp_path):
    checkpoint, _ = trained
    picture = photo(tmp_path / "photo.jpg")
    run = in_process(
        "visualize.py",
        picture,
        "--checkpoint",
        checkpoint,
        "--out-dir",
        tmp_path / "figures",
        "--no-progress",
    )
    assert run.returncode == 0, run.stderr
    model = captioning.load(checkpoint, device="cpu")
    caption = model.caption([picture], strategy="beam")[0]  # visualize.py decodes with beam search
    assert f"photo.jpg: {caption.text}" in run.stdout
    mine = save_figure(captioning.show(caption, picture), tmp_path / "mine.png")
    drawn = np.asarray(Image.open(tmp_path / "figures" / "photo.png"))
    np.testing.assert_array_equal(np.asarray(Image.open(mine)), drawn)


def test_bad_images_are_named_before_any_decoding(untrained, tmp_path):
    model = captioning.load(untrained["lstm"], device="cpu")
    good = photo(tmp_path / "good.jpg")
    (tmp_path / "empty.png").write_bytes(b"")
    # the file and the entry, and what the entry should be (shape, channels, range, type)
    cases = [
        ([good, tmp_path / "missing.jpg"], (f"{tmp_path / 'missing.jpg'} (images[1])",)),
        ([good, tmp_path / "empty.png"], (f"{tmp_path / 'empty.png'} (images[1])", "0 bytes")),
        ([torch.rand(5, 5)], ("images[0]", "(C, H, W)", "(5, 5)")),
        ([good, np.zeros((4, 4, 2), np.uint8)], ("images[1]", "(H, W, C)", "1, 3 or 4", "(4, 4, 2)")),
        ([np.full((4, 4, 3), 1.5)], ("images[0]", "[0, 1]", "1.5")),
        ([np.zeros((4, 4, 3), np.int64)], ("images[0]", "uint8", "int64")),
        ([good, 7], ("images[1]", "int")),
    ]
    for images, names in cases:
        with raises_naming(ImageError, *names):
            model.caption(images)
    with raises_naming(TypeError, "[image]"):
        model.caption(str(good))
    assert model.caption([]) == []


def test_gray_and_transparent_images_are_read_as_visualize_reads_files(untrained, tmp_path):
    """A (H, W) array and an RGBA tensor go through the conversions a file goes through."""
    model = captioning.load(untrained["lstm"], device="cpu")
    gray = np.random.default_rng(0).integers(0, 256, (30, 40), dtype=np.uint8)
    Image.fromarray(gray).save(tmp_path / "gray.png")
    rgba = np.random.default_rng(1).integers(0, 256, (30, 40, 4), dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    from_memory = model.caption([gray, torch.from_numpy(rgba).permute(2, 0, 1)])
    from_files = model.caption([tmp_path / "gray.png", tmp_path / "rgba.png"])
    for memory, file in zip(from_memory, from_files, strict=True):
        assert memory.words == file.words
        np.testing.assert_allclose(memory.attention, file.attention, atol=1e-6)


def test_transformer_attention_is_the_asked_layer_and_head(untrained, tmp_path):
    model = captioning.load(untrained["transformer"], device="cpu")
    image = photo(tmp_path / "photo.jpg")
    default, one_head = model.caption([image]), model.caption([image], layer=1, head=2)
    assert default[0].attention_label == "layer 2 of 2, mean of 2 heads"
    assert one_head[0].attention_label == "layer 1 of 2, head 2 of 2"
    assert default[0].words == one_head[0].words and default[0].beta is None  # no gate
    for caption in (default[0], one_head[0]):
        np.testing.assert_allclose(caption.attention.sum(axis=(1, 2)), 1.0, atol=1e-5)
    assert not np.allclose(default[0].attention, one_head[0].attention)
    with raises_naming(ValueError, "head 3", "2 heads"):
        model.caption([image], head=3)
    assert model.caption([image])[0].attention_label == default[0].attention_label  # the view is per call


def _python_example(markdown: Path) -> str:
    """The ```python block of ``markdown`` that calls ``captioning.load(``."""
    blocks = re.findall(
        r"^```python\n(.*?)^```", markdown.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE
    )
    found = [block for block in blocks if "captioning.load(" in block]
    assert found, f"{markdown}: no ```python block calls captioning.load("
    return found[0]


@pytest.mark.slow
@pytest.mark.parametrize("page", ["README.md", "docs/python-api.md"])
def test_documented_example_runs_as_is(page, trained, tmp_path):
    example = _python_example(REPO / page)
    assert len([line for line in example.splitlines() if line.strip()]) <= 5
    checkpoint, _ = trained
    (tmp_path / "runs" / "shapes" / "checkpoints").mkdir(parents=True)
    shutil.copy(checkpoint, tmp_path / "runs" / "shapes" / "checkpoints" / "best.pt")
    photo(tmp_path / "photo.jpg", size=(451, 300))
    result = subprocess.run(
        [sys.executable, "-c", example],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**ONE_THREAD, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    printed = result.stdout.strip()
    assert printed and re.fullmatch(r"[a-z ]+", printed)
    assert Image.open(tmp_path / "photo_attention.png").size[0] > 400
