"""Figures whose scales can be read, checked on what is drawn: each colour bar's label, the
normalisation of every overlay (``AxesImage.norm``), the pixels a flat map is painted with, the text
under each panel against the colours' units, and the box patches of the named objects."""

from __future__ import annotations

import re

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib.patches import Rectangle
from PIL import Image

from captioning.visualization.figures import attention_figure
from captioning.visualization.method_figures import METHOD_UNITS, method_figure

GRID = (7, 7)
CELLS = 49
WHITE = Image.new("RGB", (70, 70), (255, 255, 255))


def _pixel(figure, ax, x: float = 0.5, y: float = 0.5) -> np.ndarray:
    """The RGB colour drawn at the point (x, y) of ``ax`` (axes fractions), read from the canvas."""
    figure.canvas.draw()
    pixels = np.asarray(figure.canvas.buffer_rgba())[..., :3].astype(float)  # (H, W, 3)
    px, py = ax.transAxes.transform((x, y))
    return pixels[pixels.shape[0] - int(round(py)), int(round(px))]


def _painted(value: float, alpha: float = 0.6) -> np.ndarray:
    """What a cell of colour-scale position ``value`` looks like over white: viridis at ``alpha``."""
    colour = np.array(colormaps["viridis"](value)[:3]) * 255
    return alpha * colour + (1 - alpha) * 255


def _bar_label(ax) -> str:
    return " ".join(ax.get_ylabel().split())


def test_a_flat_attention_figure_is_drawn_dark():
    """Every word attends evenly to 49 cells (peak 0.02): the scale still starts at 0 and tops at
    4/49, so each panel is painted with the colour a quarter up the scale, not the top colour."""
    flat = np.full((2, CELLS), 1 / CELLS)
    result = attention_figure(WHITE, ["a", "b"], flat, GRID)
    for ax in result.axes[1:]:
        overlay = ax.images[1]
        assert (overlay.norm.vmin, overlay.norm.vmax) == (0.0, pytest.approx(4 / CELLS))
        drawn = _pixel(result.figure, ax)
        assert np.abs(drawn - _painted(0.25)).max() < 12, drawn
        assert np.abs(drawn - _painted(1.0)).max() > 60  # far from the bright end
    assert _bar_label(result.colorbar.ax) == "attention weight (share of the word's attention)"
    assert (result.colorbar.norm.vmin, result.colorbar.norm.vmax) == (0.0, pytest.approx(4 / CELLS))


def test_a_sharp_map_still_tops_the_scale():
    sharp = np.zeros((1, CELLS))
    sharp[0, 24] = 1.0  # the centre cell
    result = attention_figure(WHITE, ["a"], sharp, GRID, mode="bilinear")
    assert result.axes[1].images[1].norm.vmax == pytest.approx(1.0)
    drawn = _pixel(result.figure, result.axes[1])  # the centre of the one attended cell, upsampled
    assert np.abs(drawn - _painted(1.0)).max() < np.abs(drawn - _painted(0.25)).max() / 2


def _method_axes(figure, label: str) -> list:
    """The word panels of the row whose colour bar reads ``label``: axes with an overlay, between that
    bar's bottom and top."""
    bar = next(ax for ax in figure.axes if not ax.images and _bar_label(ax) == label)
    y0, y1 = bar.get_position().y0, bar.get_position().y1
    return [
        ax for ax in figure.axes
        if len(ax.images) == 2 and ax.get_position().y0 >= y0 - 1e-6 and ax.get_position().y1 <= y1 + 1e-6
    ]  # fmt: skip


def test_method_rows_name_their_units_and_the_text_reads_in_them():
    attention = np.zeros((2, CELLS))
    attention[:, 10] = 1.0
    gradient = np.zeros((2, CELLS))
    gradient[0, 3], gradient[1, 5] = 0.004, 0.012  # raw gradient x input, far below 1
    gradient[1, 6] = -0.5  # a negative cell is drawn as 0
    figure = method_figure(WHITE, ["a", "b"], {"attention": attention, "gradient": gradient}, GRID)
    labels = sorted(_bar_label(ax) for ax in figure.axes if not ax.images)
    assert labels == sorted([METHOD_UNITS["attention"], "gradient x input (log-prob units)"])
    panels = _method_axes(figure, "gradient x input (log-prob units)")
    assert len(panels) == 2
    for ax, peak in zip(panels, (0.004, 0.012), strict=True):
        norm = ax.images[1].norm
        assert (norm.vmin, norm.vmax) == (0.0, pytest.approx(0.012))  # the row's largest raw value
        text = ax.texts[0].get_text()
        assert float(re.match(r"peak (\S+) ", text).group(1)) == pytest.approx(peak)  # same units
        assert np.asarray(ax.images[1].get_array()).max() <= peak + 1e-12  # raw values, not shares


def test_a_flat_method_row_is_drawn_dark():
    flat = np.full((1, CELLS), 0.003)  # gradient x input spread evenly: nothing stands out
    figure = method_figure(WHITE, ["a"], {"gradient": flat}, GRID)
    (ax,) = _method_axes(figure, "gradient x input (log-prob units)")
    assert ax.images[1].norm.vmax == pytest.approx(4 * 0.003)
    assert np.abs(_pixel(figure, ax) - _painted(0.25)).max() < 12


def test_a_method_of_unknown_units_says_so():
    figure = method_figure(WHITE, ["a"], {"mine": np.ones((1, CELLS))}, GRID)
    assert any(_bar_label(ax) == "mine (the method's own units)" for ax in figure.axes if not ax.images)


def test_method_panels_outline_the_named_objects_boxes():
    image = Image.new("RGB", (200, 100), (255, 255, 255))  # drawn at max_side 100: boxes halve
    maps = {"attention": np.full((2, CELLS), 1 / CELLS), "gradient": np.ones((2, CELLS))}
    figure = method_figure(
        image, ["red", "circle"], maps, GRID, max_side=100, boxes=[[], [(20.0, 10.0, 60.0, 40.0)]]
    )
    for label in (METHOD_UNITS["attention"], "gradient x input (log-prob units)"):
        red, circle = _method_axes(figure, label)
        assert not [p for p in red.patches if isinstance(p, Rectangle)]
        (box,) = [p for p in circle.patches if isinstance(p, Rectangle)]
        assert (box.get_x(), box.get_y(), box.get_width(), box.get_height()) == (10.0, 5.0, 30.0, 20.0)
    with pytest.raises(ValueError, match="1 lists of boxes for 2 words"):
        method_figure(image, ["red", "circle"], maps, GRID, boxes=[[]])


def test_method_figure_wraps_at_columns():
    words = [f"w{k}" for k in range(9)]
    maps = {"attention": np.full((9, CELLS), 1 / CELLS), "gradient": np.ones((9, CELLS))}
    one_line = method_figure(WHITE, words, maps, GRID)
    wrapped = method_figure(WHITE, words, maps, GRID, columns=5)
    (w1, h1), (w2, h2) = one_line.get_size_inches(), wrapped.get_size_inches()
    assert w1 / h1 > 2.5 and w2 / h2 < 1.2  # a strip, then a block near square
    rows = {round(ax.get_position().y0, 4) for ax in wrapped.axes if ax.images}
    assert len(rows) == 2 * 3  # each method: 9 words at 4 a line after the image -> 3 lines


@pytest.mark.slow  # trains a tiny model (tiny_models.trained_checkpoint): its captions name the shapes
def test_visualize_method_on_a_split_outlines_the_named_objects(tmp_path, monkeypatch, single_thread):
    """``visualize.py --method ... --split test`` hands each figure the boxes of the objects its words
    name, read here from the generated instances file: the box of every word that is the category or
    the colour of an object in the image, and no other; both methods' panels draw them."""
    import json

    from tiny_models import trained_checkpoint
    from tool_runs import in_process

    import captioning.visualization.method_figures as method_figures

    checkpoint, _ = trained_checkpoint(tmp_path / "work")
    shapes = tmp_path / "work" / "shapes"
    drawn: list = []
    real = method_figures.method_figure

    def spy(image, words, maps, grid, *args, **kwargs):
        figure = real(image, words, maps, grid, *args, **kwargs)
        drawn.append((list(words), kwargs.get("boxes"), figure))
        return figure

    monkeypatch.setattr(method_figures, "method_figure", spy)
    result = in_process(
        "visualize.py", "--checkpoint", checkpoint, "--split", "test", "--num", "4",
        "--method", "attention,gradient", "--out-dir", tmp_path / "figures", "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    instances = json.loads((shapes / "instances_shapes.json").read_text())
    names = {c["id"]: c["name"] for c in instances["categories"]}
    split = json.loads((shapes / "dataset_shapes.json").read_text())["images"]
    test_ids = [image.get("cocoid", image.get("imgid")) for image in split if image["split"] == "test"][:4]
    named = 0
    for image_id, (words, boxes, figure) in zip(test_ids, drawn, strict=True):
        objects = [a for a in instances["annotations"] if a["image_id"] == image_id]
        assert boxes is not None and len(boxes) == len(words)
        for word, given in zip(words, boxes, strict=True):
            # Shapes' words: a shape names the objects of its category, a colour the objects of that colour
            expected = sorted(
                tuple(float(v) for v in a["bbox"])
                for a in objects
                if word in (names[a["category_id"]], a["color"])
            )
            assert sorted(tuple(float(v) for v in box) for box in given) == expected, (image_id, word)
            named += bool(expected)
        patches = sum(isinstance(p, Rectangle) for ax in figure.axes for p in ax.patches)
        assert patches == 2 * sum(len(b) for b in boxes)  # on the panels of both methods
    assert len(drawn) == 4
    assert named > 0  # the captions name objects of their images: the check is not empty


def test_method_figure_of_an_empty_caption_is_each_method_over_the_image_alone():
    figure = method_figure(
        WHITE, [], {"attention": np.zeros((0, CELLS)), "gradient": np.zeros((0, *GRID))}, GRID
    )
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == ["attention", "gradient"]  # one image panel per method, no word panel, no colour bar
    assert all(len(ax.get_images()) == 1 for ax in figure.axes)
