"""Attention overlays land on the right pixels; figures and the HTML report are complete and well formed."""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from messages import raises_naming
from PIL import Image

from captioning.data.records import ImageRecord
from captioning.inference.captioner import Captioned
from captioning.models.decoding import Caption
from captioning.visualization.figures import CJK_FONTS, attention_figure, font_families, save_figure
from captioning.visualization.overlay import blend, colorize, upsample_attention
from captioning.visualization.report import write_report

MODES = ["bilinear", "gaussian"]


def one_hot(grid: tuple[int, int], *cells: tuple[int, int]) -> torch.Tensor:
    """(len(cells), P) attention with all the mass of row t on ``cells[t]``."""
    gh, gw = grid
    attention = torch.zeros(len(cells), gh * gw)
    for t, (row, column) in enumerate(cells):
        attention[t, row * gw + column] = 1.0
    return attention


def cell_masks(
    grid: tuple[int, int], cell: tuple[int, int], size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(H, W) masks of the cell's pixel rectangle and of its 3x3-cell neighbourhood."""
    (gh, gw), (row, column), (height, width) = grid, cell, size
    pixel_rows = np.floor(np.arange(height)[:, None] * gh / height)  # the grid row of each pixel row
    pixel_columns = np.floor(np.arange(width)[None, :] * gw / width)
    inside = (pixel_rows == row) & (pixel_columns == column)
    near = (np.abs(pixel_rows - row) <= 1) & (np.abs(pixel_columns - column) <= 1)
    return inside, near


# ----------------------------------------------------------------------------- overlay
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "grid, cell, size",
    [
        ((7, 7), (2, 5), (224, 224)),
        ((7, 7), (2, 5), (180, 300)),  # a 300 x 180 image: the grid is stretched, not cropped
        ((14, 14), (9, 3), (180, 300)),
        ((14, 14), (0, 13), (41, 97)),  # a corner cell of a small odd-sized image
        ((4, 6), (3, 0), (50, 200)),  # a non-square grid
    ],
    ids=["7x7-square", "7x7-300x180", "14x14-300x180", "14x14-corner", "4x6"],
)
def test_peak_lies_in_its_cell(grid, cell, size, mode):
    maps = upsample_attention(one_hot(grid, cell), grid, size, mode, normalize=False)
    assert maps.shape == (1, *size) and maps.dtype == np.float32
    heat = maps[0]
    inside, near = cell_masks(grid, cell, size)
    peak = np.unravel_index(heat.argmax(), heat.shape)
    assert inside[peak], f"peak at {peak} is outside cell {cell}"
    assert heat[inside].sum() / heat.sum() > 0.3  # the single most covered cell
    assert heat[near].sum() / heat.sum() > 0.95  # and little beyond its neighbours
    # The cell holds more mass than any other cell.
    gh, gw = grid
    rows = np.floor(np.arange(size[0]) * gh / size[0]).astype(int)
    columns = np.floor(np.arange(size[1]) * gw / size[1]).astype(int)
    per_cell = np.zeros(grid)
    np.add.at(per_cell, (rows[:, None].repeat(size[1], 1), columns[None, :].repeat(size[0], 0)), heat)
    assert np.unravel_index(per_cell.argmax(), grid) == cell


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_an_image_smaller_than_the_grid_loses_no_cell(mode):
    # Shrinking a 14x14 map onto 5x5 pixels averages cells: none may vanish.
    grid = (14, 14)
    for row in range(14):
        for column in range(14):
            heat = upsample_attention(one_hot(grid, (row, column)), grid, (5, 5), mode, normalize=False)[0]
            assert heat.max() > 0, (row, column)
            peak = np.unravel_index(heat.argmax(), heat.shape)
            assert abs(peak[0] - row * 5 / 14) <= 1.5 and abs(peak[1] - column * 5 / 14) <= 1.5, (
                row,
                column,
                peak,
            )


@pytest.mark.parametrize("mode", MODES)
def test_display_scaling_flat_and_zero_maps(mode):
    grid = (7, 7)
    attention = torch.stack([torch.full((49,), 1 / 49), torch.zeros(49), one_hot(grid, (3, 3))[0] * 0.2])
    maps = upsample_attention(attention, grid, (30, 53), mode)
    assert not np.isnan(maps).any()
    assert np.allclose(maps[0], 1.0, atol=1e-5)  # flat stays flat, scaled to the top
    assert np.all(maps[1] == 0.0)  # all zero: no division by zero
    assert maps[2].max() == pytest.approx(1.0) and maps[2].min() >= 0.0


def test_grid_shaped_input_and_empty_caption():
    grid = (3, 4)
    attention = torch.softmax(torch.randn(5, 12, generator=torch.Generator().manual_seed(0)), dim=1)
    flat_input = upsample_attention(attention, grid, (20, 33))
    grid_input = upsample_attention(attention.view(5, 3, 4).numpy(), grid, (20, 33))
    np.testing.assert_allclose(flat_input, grid_input)
    assert upsample_attention(torch.zeros(0, 12), grid, (20, 33)).shape == (0, 20, 33)
    with raises_naming(ValueError, "(2, 13)", "3x4"):
        upsample_attention(torch.zeros(2, 13), grid, (20, 33))
    with raises_naming(ValueError, "mode", "bilinear", "'nearest'"):
        upsample_attention(attention, grid, (20, 33), mode="nearest")


def test_blend_and_colorize():
    image = np.full((4, 6, 3), 100, dtype=np.uint8)
    heat = np.linspace(0, 1, 24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(blend(image, heat, alpha=0.0), image)
    rgba = colorize(heat, "jet", alpha=0.6)
    assert rgba.shape == (4, 6, 4) and rgba.dtype == np.uint8 and np.all(rgba[..., 3] == 153)
    np.testing.assert_array_equal(blend(image, heat, "jet", alpha=1.0), rgba[..., :3])
    assert blend(image, heat, "jet")[0, 0, 2] > blend(image, heat, "jet")[0, 0, 0]  # jet's low end is blue
    with pytest.raises(ValueError, match="colour map"):
        colorize(heat, "no-such-map")


# ----------------------------------------------------------------------------- figures
def test_figure_panels_wrap_and_formats(tmp_path: Path):
    words = [
        "a",
        "small",
        "red",
        "circle",
        "above",
        "a",
        "large",
        "blue",
        "square",
        "near",
        "the",
        "left",
        "edge",
    ]  # 13 words: three rows of five panels with the image
    attention = torch.softmax(torch.randn(len(words), 49, generator=torch.Generator().manual_seed(1)), dim=1)
    image = Image.new("RGB", (300, 180), (90, 140, 60))
    result = attention_figure(image, words, attention, (7, 7), references=["a red circle and a blue square"])
    assert result.panels == len(words) + 1 == len(result.axes)
    assert (result.rows, result.columns) == (3, 5)
    tops = sorted({round(ax.get_position().y1, 4) for ax in result.axes})
    assert len(tops) == 3  # the panels really sit on three rows
    assert result.maps.shape == (len(words), 180, 300)
    assert result.axes[0].get_title().replace("\n", " ") == " ".join(words)  # wrapped to the panel width
    assert [ax.get_title() for ax in result.axes[1:]] == words
    assert any("a red circle and a blue square" in text.get_text() for text in result.figure.texts)

    png = save_figure(result.figure, tmp_path / "nested" / "figure.png")
    with Image.open(png) as written:
        written.verify()
    with Image.open(png) as written:
        width, height = written.size
    figure_width, figure_height = result.figure.get_size_inches() * 100
    assert abs(width - figure_width) <= 2 and abs(height - figure_height) <= 2
    assert width > 5 * 200 and height > 3 * 100  # five panels across, three rows down


def test_caption_title_columns_and_formats(tmp_path: Path):
    words = ["one", "two", "three"]
    result = attention_figure(
        Image.new("RGB", (40, 40)), words, one_hot((2, 2), (0, 0), (0, 1), (1, 1)), (2, 2), columns=2
    )
    assert (result.panels, result.rows, result.columns) == (4, 2, 2)
    assert result.axes[0].get_title() == "one two three"
    assert save_figure(result.figure, tmp_path / "figure.pdf").read_bytes().startswith(b"%PDF")
    assert b"<svg" in save_figure(result.figure, tmp_path / "figure.SVG").read_bytes()[:2000]
    with pytest.raises(ValueError, match="format"):
        save_figure(result.figure, tmp_path / "figure.gif")


@pytest.mark.parametrize("mode", MODES)
def test_one_word_zero_words_grayscale_and_betas(tmp_path: Path, mode):
    gray = Image.new("L", (33, 80), 90)
    one = attention_figure(
        gray, ["circle"], one_hot((7, 7), (6, 0)), (7, 7), betas=torch.tensor([0.734]), mode=mode
    )
    assert one.panels == 2 and one.axes[1].get_title() == "circle (beta=0.73)"
    assert one.axes[0].get_title() == "circle"
    none = attention_figure(gray, [], torch.zeros(0, 49), (7, 7), mode=mode)
    assert none.panels == 1 and none.maps.shape == (0, 80, 33)
    assert none.axes[0].get_title() == "(empty caption)"
    flat = attention_figure(gray, ["$x$", "flat"], torch.full((2, 49), 1 / 49), (7, 7), mode=mode)
    assert not np.isnan(flat.maps).any()
    for result in (one, none, flat):
        with Image.open(save_figure(result.figure, tmp_path / f"{result.panels}.png")) as written:
            assert written.size[0] > 100


def test_large_image_is_drawn_scaled_down():
    result = attention_figure(Image.new("RGB", (2400, 1000)), ["wide"], one_hot((7, 7), (0, 0)), (7, 7))
    assert result.image_size == (512, 213) and result.maps.shape == (1, 213, 512)


def test_mismatched_inputs_are_refused():
    image = Image.new("RGB", (40, 30))
    with raises_naming(ValueError, "2 words", "1 attention"):
        attention_figure(image, ["a", "b"], one_hot((2, 2), (0, 0)), (2, 2))
    with raises_naming(ValueError, "1 words", "2 betas"):
        attention_figure(image, ["a"], one_hot((2, 2), (0, 0)), (2, 2), betas=[0.1, 0.2])


# ----------------------------------------------------------------------------- HTML report
GREY = (128, 128, 128)
GRID = (7, 7)
IMAGE_SIZE = (300, 180)  # W, H
FIRST_CELL, SECOND_CELL = (2, 5), (5, 1)


def captioned_item(
    path: Path, image_id: int, words: list[str], attention: torch.Tensor, references: tuple[str, ...] = ()
) -> Captioned:
    caption = Caption(
        tokens=list(range(4, 4 + len(words))),
        log_prob=-1.0,
        attention=attention,
        betas=torch.full((len(words),), 0.5),
        finished=True,
        score=-1.0,
    )
    record = ImageRecord(image_id=image_id, path=path, split="test", captions=(), raw=references)
    return Captioned(record, caption, list(words))


@pytest.fixture
def report_items(tmp_path: Path) -> list[Captioned]:
    grey = tmp_path / "grey.png"
    Image.new("RGB", IMAGE_SIZE, GREY).save(grey)
    small = tmp_path / "small.jpg"
    Image.new("L", (41, 97), 60).save(small)
    return [
        captioned_item(
            grey,
            7,
            ["circle", "square", "flat"],
            torch.cat([one_hot(GRID, FIRST_CELL, SECOND_CELL), torch.full((1, 49), 1 / 49)]),
            ("a red circle", "a circle & a <square>"),
        ),
        captioned_item(small, 8, ["<unk>"], one_hot(GRID, (0, 0))),
        captioned_item(small, 9, [], torch.zeros(0, 49)),
    ]


def test_report_is_self_contained(tmp_path: Path, report_items):
    path = write_report(report_items, tmp_path / "out" / "report.html", GRID)
    page = path.read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page
    sources = re.findall(r'src="([^"]*)"', page)
    # each image twice (as it is, and under its maps), and an overlay per word
    assert len(sources) == 2 * 3 + 3 + 1
    assert all(source.startswith(("data:image/png;base64,", "data:image/jpeg;base64,")) for source in sources)
    assert "<link" not in page and "url(" not in page
    for word in ("circle", "square", "flat", "&lt;unk&gt;"):
        assert f">{word}</a>" in page
    assert "a circle &amp; a &lt;square&gt;" in page and "a red circle" in page
    assert 'href="#img0-w1"' in page and 'id="img0-w1"' in page and "(empty caption)" in page


def screenshot(page: str, out: Path, profile: Path) -> np.ndarray:
    """Render ``page`` (a file:// URL) in headless Chromium; (H, W, 3) uint8 pixels."""
    command = [
        shutil.which("chromium"),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--window-size=800,600",
        f"--screenshot={out}",
        page,
    ]
    subprocess.run(command, check=True, timeout=60, capture_output=True)
    with Image.open(out) as image:
        return np.asarray(image.convert("RGB")).astype(np.int32)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium is not installed")
def test_report_overlay_in_browser(tmp_path: Path, report_items):
    """The shown word's jet overlay is hot (red/yellow) exactly where its attention peak is."""
    path = write_report(report_items, tmp_path / "report.html", GRID, cmap="jet")
    for fragment, cell in (("", FIRST_CELL), ("#img0-w1", SECOND_CELL)):  # default: the first word
        pixels = screenshot(
            path.as_uri() + fragment,
            tmp_path / f"shot{len(fragment)}.png",
            tmp_path / f"profile{len(fragment)}",
        )
        red, blue = pixels[..., 0], pixels[..., 2]
        hot, cold = red - blue > 50, blue - red > 50  # jet's red/yellow end, and its blue end
        # The first image is the topmost coloured area: its box is where hot or cold pixels are.
        coloured_rows = np.flatnonzero((hot | cold).any(axis=1))
        top = coloured_rows[0]
        block = (hot | cold)[top : top + IMAGE_SIZE[1] + 20]
        ys, xs = np.nonzero(block)
        left, bottom, right = xs.min(), top + ys.max(), xs.max()
        assert abs((right - left + 1) - IMAGE_SIZE[0]) <= 2 and abs((bottom - top + 1) - IMAGE_SIZE[1]) <= 2
        stage = (slice(top, top + IMAGE_SIZE[1]), slice(left, left + IMAGE_SIZE[0]))
        inside, near = cell_masks(GRID, cell, IMAGE_SIZE[::-1])
        hot_stage = hot[stage]
        assert hot_stage[inside].mean() > 0.3, "the attended cell is not coloured hot"
        assert hot_stage[~near].sum() == 0, "hot colour outside the attended cell's neighbourhood"
        assert cold[stage][~near].mean() > 0.95  # elsewhere the image is tinted with jet's blue
        ys, xs = np.nonzero(hot_stage)
        centre = (int(ys.mean()), int(xs.mean()))
        assert inside[centre], f"hot region centred at {centre}, outside cell {cell}"


def _installed_cjk_font() -> str | None:
    """A font file of ``CJK_FONTS`` on this system, found even where matplotlib's font cache predates it."""
    from matplotlib import font_manager

    for path in font_manager.findSystemFonts():
        try:
            if font_manager.get_font(path).family_name in CJK_FONTS:
                return path
        except (OSError, RuntimeError):
            continue
    return None


def test_chinese_words_are_drawn_with_an_installed_cjk_font(tmp_path):
    """One panel per token, every glyph drawn: matplotlib warns of each glyph its fonts lack."""
    from matplotlib import font_manager

    path = _installed_cjk_font()
    if path is None:
        pytest.skip(f"no CJK font installed (one of {', '.join(CJK_FONTS)})")
    font_manager.fontManager.addfont(path)
    font_families.cache_clear()
    try:
        assert font_families()[1:] and set(font_families()[1:]) <= set(CJK_FONTS)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "Glyph 19968 missing from font(s) DejaVu Sans" fails the test
            result = attention_figure(
                Image.new("RGB", (40, 30)),
                ["一", "只", "狗", "tv"],
                np.full((4, 4), 0.25),
                (2, 2),
                references=["一只狗在TV前跑。"],
            )
            save_figure(result.figure, tmp_path / "figure.png")
        assert result.panels == 5
    finally:
        font_families.cache_clear()
