"""``visualize.py`` end to end with a tiny real checkpoint: figures, report, summary, one-line errors."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image
from tool_runs import in_process, run_tool, script_module

from captioning.cli.visualize import visualization_config, visualize_images
from captioning.config import (
    Config,
    ConfigError,
    DecodeConfig,
    EncoderConfig,
    LSTMDecoderConfig,
    ModelConfig,
    ShapesDataConfig,
)
from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary
from captioning.hub.checkpoint import load_checkpoint, save_checkpoint
from captioning.models.captioner import Captioner

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary
) -> Path:
    """An untrained but seeded tiny captioner on the tiny Shapes data; captions of 3 or 4 words."""
    torch.manual_seed(0)
    model_config = ModelConfig(
        encoder=EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64, grid_size=0),
        decoder=LSTMDecoderConfig(embed_dim=16, hidden_dim=16, attention_dim=16),
    )
    model = Captioner.build(model_config, shapes_vocab)
    data = ShapesDataConfig(
        root=str(tiny_shapes.root),
        shapes_train=12,
        shapes_val=4,
        shapes_test=4,
        shapes_image_size=64,
    )
    config = Config(
        data=data,
        model=model_config,
        decode=DecodeConfig(strategy="greedy", beam_size=2, min_length=3, max_length=4),
    )
    path = tmp_path_factory.mktemp("checkpoint") / "best.pt"
    save_checkpoint(
        path,
        config=config,
        vocab=shapes_vocab,
        decoder_state=model.decoder.state_dict(),
        encoder_state=model.encoder.state_dict(),  # random weights: saved, as training does
        encoder_fingerprint=model.encoder.fingerprint(),
    )
    return path


@pytest.fixture
def odd_images(tmp_path: Path) -> list[Path]:
    """A wide RGB PNG with some structure and a tall grayscale JPEG."""
    wide = Image.new("RGB", (97, 41), (30, 30, 200))
    wide.paste((220, 40, 40), (10, 5, 40, 30))
    wide.save(tmp_path / "wide.png")
    Image.new("L", (33, 80), 90).save(tmp_path / "tall.jpg")
    return [tmp_path / "wide.png", tmp_path / "tall.jpg"]


def run_script(*arguments: str | Path) -> subprocess.CompletedProcess:
    """``python visualize.py arguments --no-progress`` started in the repository, run in this process
    (tests/tool_runs.py; test_end_to_end runs visualize.py from a shell)."""
    return in_process("visualize.py", *arguments, "--no-progress", cwd=ROOT)


@pytest.mark.slow
def test_script_writes_figures_report_and_summary(tmp_path: Path, checkpoint: Path, odd_images: list[Path]):
    out_dir, report = tmp_path / "figures", tmp_path / "report.html"
    result = run_script(*odd_images, "--checkpoint", checkpoint, "--out-dir", out_dir, "--html", report)
    assert result.returncode == 0, result.stderr
    figures = [out_dir / "wide.png", out_dir / "tall.png"]
    for figure in figures:
        with Image.open(figure) as image:
            assert image.format == "PNG" and image.size[0] > 300
        assert str(figure) in result.stdout
    assert str(report) in result.stdout
    assert "wide.png: " in result.stdout and "tall.jpg: " in result.stdout
    page = report.read_text(encoding="utf-8")
    assert page.count('class="photo"') == 2 and 'id="img1-w2"' in page  # >= 3 words each


@pytest.mark.slow
def test_missing_image_is_one_line_error(tmp_path: Path, checkpoint: Path, odd_images: list[Path]):
    missing = tmp_path / "no_such_image.jpg"
    result = run_tool(
        "visualize.py",
        odd_images[0],
        missing,
        "--checkpoint",
        checkpoint,
        "--out-dir",
        tmp_path / "out",
        "--no-progress",
    )  # a real process: the tool's error path, from a shell
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and str(missing) in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "problem",
    ["not an image", "missing checkpoint", "images and split", "nothing", "model key set", "colour map"],
)
def test_bad_input_exits_2(tmp_path: Path, checkpoint: Path, odd_images: list[Path], problem):
    text_file = tmp_path / "notes.png"
    text_file.write_text("not a picture")
    argv = {
        "not an image": [str(text_file), "--checkpoint", str(checkpoint)],
        "missing checkpoint": [str(odd_images[0]), "--checkpoint", str(tmp_path / "none.pt")],
        "images and split": [str(odd_images[0]), "--split", "val", "--checkpoint", str(checkpoint)],
        "nothing": ["--checkpoint", str(checkpoint)],
        # Checked before the checkpoint is read: the error names the key, not the missing file.
        "model key set": [
            str(odd_images[0]),
            "--checkpoint",
            str(tmp_path / "none.pt"),
            "--set",
            "model.decoder.gate=none",
        ],
        "colour map": [str(odd_images[0]), "--checkpoint", str(tmp_path / "none.pt"), "--cmap", "rainbowish"],
    }[problem]
    result = in_process("visualize.py", *argv, "--out-dir", tmp_path / "out")
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error:")
    if problem == "not an image":
        assert str(text_file) in error[0]
    if problem == "missing checkpoint":
        assert "none.pt" in error[0]
    if problem == "model key set":
        assert all(name in error[0] for name in ("model.decoder.gate", "data.*", "decode.*")), error[0]
    if problem == "colour map":  # checked before the checkpoint is read
        assert "--cmap" in error[0] and "rainbowish" in error[0]


@pytest.mark.slow
def test_split_with_references_pdf_and_gaussian(tmp_path: Path, checkpoint: Path):
    result = visualize_images(
        checkpoint,
        split="val",
        num=3,
        out_dir=tmp_path / "figures",
        mode="gaussian",
        file_format="pdf",
        html=tmp_path / "val.html",
        progress=False,
        normalize="word",
        cmap="jet",
    )
    assert len(result.captioned) == len(result.figures) == 3
    for item, figure, panels in zip(result.captioned, result.figures, result.panels, strict=True):
        assert 3 <= len(item.words) <= 4 and panels == len(item.words) + 1
        assert item.caption.attention.shape == (len(item.words), 4)  # the 2x2 grid of a 64 px Lite0
        assert figure == tmp_path / "figures" / f"{item.record.image_id}.pdf"
        assert figure.read_bytes().startswith(b"%PDF")
        assert item.record.raw  # references, printed under the figure
    page = (tmp_path / "val.html").read_text(encoding="utf-8")
    assert result.captioned[0].record.raw[0] in page
    assert str(result.report) in result.summary()


@pytest.mark.slow
def test_image_figures_panel_count(tmp_path: Path, checkpoint: Path, odd_images: list[Path]):
    duplicate = tmp_path / "again" / "wide.png"
    duplicate.parent.mkdir()
    duplicate.write_bytes(odd_images[0].read_bytes())
    result = visualize_images(
        checkpoint, [*odd_images, duplicate], out_dir=tmp_path / "out", beam_size=1, progress=False
    )
    assert [p.name for p in result.figures] == ["wide-1.png", "tall.png", "wide-2.png"]
    assert result.panels == [len(item.words) + 1 for item in result.captioned]
    assert all(panels >= 4 for panels in result.panels)


def test_choices_agree():
    from captioning.cli import visualize as api
    from captioning.visualization import figures, overlay

    actions = {action.dest: action for action in script_module("visualize.py").get_args_parser()._actions}
    assert tuple(actions["mode"].choices) == api.MODES == overlay.MODES
    assert tuple(actions["normalize"].choices) == api.NORMALIZATIONS == overlay.NORMALIZATIONS
    assert tuple(actions["file_format"].choices) == api.FORMATS == tuple(s[1:] for s in figures.FORMATS)


def test_visualization_config(checkpoint: Path):
    from captioning.config.loading import from_dict

    config = from_dict(load_checkpoint(checkpoint)["config"])
    adjusted = visualization_config(config, overrides=["decode.max_length=7"], beam_size=5)
    assert (adjusted.decode.strategy, adjusted.decode.beam_size, adjusted.decode.max_length) == ("beam", 5, 7)
    assert adjusted.model == config.model and adjusted.data == config.data
    assert visualization_config(config, overrides=["decode.strategy=greedy"]).decode.strategy == "greedy"
    with pytest.raises(ConfigError, match="only data"):
        visualization_config(config, overrides=["model.decoder.hidden_dim=8"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        visualization_config(config, overrides=["decode.beam_size"])


def test_figure_names_never_collide():
    from captioning.cli.visualize import _unique_stems

    cases = [
        ["a/cat.jpg", "b/cat.jpg", "cat-2.png"],
        ["a/cat.jpg", "b/Cat.jpg", "c/CAT.png"],
        ["cat-1.png", "a/cat.jpg", "b/cat.jpg"],
        ["x.jpg", "y.png"],
    ]
    for case in cases:
        names = _unique_stems([Path(name) for name in case])
        assert len({name.casefold() for name in names}) == len(case), (case, names)
    assert _unique_stems([Path("x.jpg"), Path("y.png")]) == ["x", "y"]
    assert _unique_stems([Path("a/x.jpg"), Path("b/x.jpg")]) == ["x-1", "x-2"]


def test_config_takes_the_data_section_of_an_older_runs_config_file(tmp_path: Path, checkpoint: Path):
    # A run's config.yaml written before each decoder family had its own options: all of them, flat.
    stored = load_checkpoint(checkpoint)["config"]
    decoder = {**stored["model"]["decoder"], "kind": "transformer", "d_model": 64, "d_ff": 128}
    old = tmp_path / "config.yaml"
    old.write_text(
        yaml.safe_dump({**stored, "model": {**stored["model"], "decoder": decoder}}), encoding="utf-8"
    )
    out_dir = tmp_path / "figures"
    result = run_script(
        "--checkpoint", checkpoint, "--config", old, "--split", "val", "--num", "1", "--out-dir", out_dir
    )
    assert result.returncode == 0, result.stderr
    assert len(list(out_dir.glob("*.png"))) == 1


@pytest.mark.slow
def test_several_captions_are_listed_under_the_figure_and_in_the_summary(
    tmp_path: Path, checkpoint: Path, odd_images: list[Path]
):
    result = visualize_images(
        checkpoint,
        odd_images[:1],
        out_dir=tmp_path / "out",
        html=tmp_path / "page.html",
        beam_size=3,
        num_return=3,
        progress=False,
    )
    (item,) = result.captioned
    page = (tmp_path / "page.html").read_text(encoding="utf-8")
    assert "Other captions, ranked:" in page
    assert all(f"<li>{c.text}</li>" in page for c in item.alternatives)
    assert len(item.alternatives) == 2 and len({c.text for c in item.ranked}) == 3
    summary = result.summary().splitlines()
    assert summary[:3] == [
        f"wide.png: {item.text}",
        *(f"  {k}. {c.text}" for k, c in enumerate(item.alternatives, 2)),
    ]
    from captioning.visualization.figures import attention_figure

    drawn = attention_figure(
        Image.open(odd_images[0]),
        item.words,
        item.caption.attention,
        (2, 2),
        alternatives=[c.text for c in item.alternatives],
    )
    text = "\n".join(t.get_text() for t in drawn.figure.texts)
    assert "Other captions, ranked:" in text
    assert all(f"{k}. {c.text}" in text for k, c in enumerate(item.alternatives, 2))
