"""Attention figures are honest: one colour scale with a colour bar, each word's peak and entropy,
ground-truth boxes where they are known; ``--normalize`` and ``--cmap`` keep the old view available."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from matplotlib.patches import Rectangle
from messages import raises_naming
from PIL import Image

from captioning.evaluation.grounding import Instances, ObjectBox, word_boxes
from captioning.visualization.figures import attention_figure
from captioning.visualization.overlay import attention_statistics, display_range

GRID = (7, 7)
CELLS = GRID[0] * GRID[1]


def sharp_flat_and_split() -> torch.Tensor:
    """(3, 49): all mass on one cell, spread evenly over all 49, and 0.3 / 0.3 / 0.4 over three cells."""
    attention = torch.zeros(3, CELLS)
    attention[0, 10] = 1.0
    attention[1] = 1 / CELLS
    attention[2, [3, 4, 5]] = torch.tensor([0.3, 0.3, 0.4])
    return attention


def overlays(result) -> list:
    """The attention image drawn on each word's panel (the panel's second image; the first is the photo)."""
    return [ax.images[1] for ax in result.axes[1:]]


def test_peak_and_entropy_of_known_maps():
    peaks, entropies = attention_statistics(sharp_flat_and_split())
    np.testing.assert_allclose(peaks, [1.0, 1 / CELLS, 0.4])
    expected = -(2 * 0.3 * math.log(0.3) + 0.4 * math.log(0.4))
    np.testing.assert_allclose(entropies, [0.0, math.log(CELLS), expected], atol=1e-12)
    np.testing.assert_allclose(np.exp(entropies[:2]), [1.0, CELLS])  # effective number of cells
    zero_peak, zero_entropy = attention_statistics(torch.zeros(1, 4))
    assert zero_peak[0] == 0.0 and zero_entropy[0] == 0.0


@pytest.mark.parametrize(
    "normalize, tops",
    [
        ("figure", [1.0, 1.0, 1.0]),
        ("absolute", [1.0, 1.0, 1.0]),
        ("word", [1.0, 1 / CELLS, 0.4]),
    ],
)
def test_display_ranges(normalize, tops):
    assert display_range(sharp_flat_and_split(), normalize) == [(0.0, pytest.approx(top)) for top in tops]
    # Without the sharp word, the figure's scale tops at the largest remaining weight, 0.4.
    assert display_range(sharp_flat_and_split()[1:], "figure") == [(0.0, pytest.approx(0.4))] * 2
    assert display_range(sharp_flat_and_split()[1:], "absolute") == [(0.0, 1.0), (0.0, 1.0)]
    with raises_naming(ValueError, "normalize", "figure, absolute, word", "'global'"):
        display_range(sharp_flat_and_split(), "global")


def test_default_figure_shares_one_scale_with_a_colour_bar():
    words = ["flat", "split"]
    result = attention_figure(
        Image.new("RGB", (90, 60), (90, 140, 60)), words, sharp_flat_and_split()[1:], GRID
    )
    assert result.normalize == "figure"
    for image in overlays(result):
        assert (image.norm.vmin, image.norm.vmax) == (0.0, pytest.approx(0.4))  # the figure's largest weight
        assert image.get_cmap().name == "viridis"
    assert result.colorbar is not None
    assert (result.colorbar.norm.vmin, result.colorbar.norm.vmax) == (0.0, pytest.approx(0.4))
    assert result.colorbar.cmap.name == "viridis" and "attention weight" in result.colorbar.ax.get_ylabel()
    # The flat map stays dim on the shared scale: 1/49 of 0.4 is about 5% of the bar.
    assert result.maps[0].max() == pytest.approx(1 / CELLS / 0.4, rel=0.05)
    texts = [[text.get_text() for text in ax.texts] for ax in result.axes[1:]]
    assert texts == [
        [f"peak 0.02 \u00b7 H {math.log(CELLS):.2f} (49.0 cells)"],
        ["peak 0.40 \u00b7 H 1.09 (3.0 cells)"],
    ]
    np.testing.assert_allclose(result.peaks, [1 / CELLS, 0.4])


def test_word_and_absolute_scales_and_another_colour_map():
    attention = sharp_flat_and_split()
    word = attention_figure(
        Image.new("RGB", (60, 60)), ["a", "b", "c"], attention, GRID, normalize="word", cmap="jet"
    )
    assert [image.norm.vmax for image in overlays(word)] == pytest.approx([1.0, 1 / CELLS, 0.4])
    assert {image.get_cmap().name for image in overlays(word)} == {"jet"}
    assert (word.colorbar.norm.vmin, word.colorbar.norm.vmax) == (0.0, 1.0)
    assert "peak" in word.colorbar.ax.get_ylabel()  # a share of each word's own peak, not a weight
    absolute = attention_figure(
        Image.new("RGB", (60, 60)), ["b", "c"], attention[1:], GRID, normalize="absolute", cmap="magma"
    )
    assert [image.norm.vmax for image in overlays(absolute)] == [1.0, 1.0]
    assert absolute.colorbar.cmap.name == "magma"
    with pytest.raises(ValueError, match="unknown colour map"):
        attention_figure(Image.new("RGB", (60, 60)), ["b"], attention[1:2], GRID, cmap="no-such-map")
    empty = attention_figure(Image.new("RGB", (60, 60)), [], torch.zeros(0, CELLS), GRID)
    assert empty.colorbar is None and empty.panels == 1


def test_boxes_are_drawn_scaled_to_the_drawn_image():
    image = Image.new("RGB", (1024, 512))  # drawn at 512 x 256: boxes halve too
    result = attention_figure(
        image, ["red", "circle"], sharp_flat_and_split()[:2], GRID, boxes=[[], [(100.0, 50.0, 200.0, 100.0)]]
    )
    assert result.image_size == (512, 256)
    assert not [p for p in result.axes[1].patches if isinstance(p, Rectangle)]
    (box,) = [p for p in result.axes[2].patches if isinstance(p, Rectangle)]
    assert box.get_xy() == pytest.approx((50.0, 25.0))
    assert (box.get_width(), box.get_height()) == pytest.approx((100.0, 50.0))
    with pytest.raises(ValueError, match="lists of boxes"):
        attention_figure(image, ["red"], sharp_flat_and_split()[:1], GRID, boxes=[[], []])


def test_word_boxes_follow_grounding_mentions():
    instances = Instances(
        {5: (64.0, 64.0)},
        {
            5: [
                ObjectBox("circle", (1, 2, 10, 12), {"color": "red"}),
                ObjectBox("square", (30, 30, 8, 8), {"color": "blue"}),
                ObjectBox("square", (0, 0, 0, 5), {"color": "green"}),
            ]
        },
    )
    words = ["a", "red", "circle", "and", "two", "squares"]
    boxes = word_boxes(words, 5, instances)
    assert boxes == [
        [],
        [(1, 2, 10, 12)],
        [(1, 2, 10, 12)],
        [],
        [],
        [(30, 30, 8, 8)],
    ]  # zero-width box left out
    assert word_boxes(words, 6, instances) == [[]] * len(words)
    assert word_boxes(words, 5, None) == [[]] * len(words)


def test_shapes_captions_name_their_boxes(tiny_shapes, shapes_records):
    """On real Shapes data a reference caption's colour and shape words get their object's true box."""
    from captioning.data.tokenizers import tokenize
    from captioning.evaluation.grounding import load_instances

    instances = load_instances(tiny_shapes.instances)
    record = next(r for r in shapes_records if instances.objects.get(r.image_id))
    words = tokenize(record.raw[0])
    boxes = word_boxes(words, record.image_id, instances)
    true_boxes = {obj.bbox for obj in instances.objects[record.image_id]}
    named = [b for per_word in boxes for b in per_word]
    assert named and set(named) <= true_boxes


def test_write_figures_passes_each_words_boxes(tmp_path, monkeypatch):
    """The run's figures and visualize.py's get the boxes of the objects each word names."""
    from captioning.data.records import ImageRecord
    from captioning.inference.captioner import Captioned
    from captioning.models.decoding import Caption
    from captioning.visualization import report

    picture = tmp_path / "shapes.png"
    Image.new("RGB", (64, 64)).save(picture)
    caption = Caption(
        tokens=[4, 5, 6],
        log_prob=-1.0,
        attention=torch.full((3, CELLS), 1 / CELLS),
        betas=None,
        finished=True,
        score=-1.0,
    )
    item = Captioned(ImageRecord(image_id=5, path=picture, split="test"), caption, ["a", "blue", "square"])
    instances = Instances({5: (64.0, 64.0)}, {5: [ObjectBox("square", (30, 30, 8, 8), {"color": "blue"})]})
    drawn = []
    monkeypatch.setattr(
        report,
        "attention_figure",
        lambda *args, **kwargs: drawn.append(kwargs) or attention_figure(*args, **kwargs),
    )
    report.write_figures(
        [item], tmp_path / "figures", GRID, boxes=instances, normalize="absolute", cmap="magma"
    )
    assert drawn[0]["boxes"] == [[], [(30, 30, 8, 8)], [(30, 30, 8, 8)]]
    assert (drawn[0]["normalize"], drawn[0]["cmap"]) == ("absolute", "magma")
    assert (tmp_path / "figures" / "5.png").is_file()
