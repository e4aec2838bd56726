"""Attention figures in the style of Show, Attend and Tell: the image, then one overlay per word.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot state, no window,
safe in threads, on servers and in notebooks (a ``Figure`` displays itself in Jupyter).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colorbar import Colorbar
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image
from torch import Tensor

from captioning.utils.files import atomic_write
from captioning.utils.text import printable
from captioning.visualization.fonts import CJK_FONTS as CJK_FONTS  # the fonts' names, importable here too
from captioning.visualization.fonts import font_families, quiet_fonts
from captioning.visualization.overlay import (
    DEFAULT_CMAP,
    attention_statistics,
    colour_map,
    display_range,
    display_size,
    upsample_attention,
)

FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}

# Layout, in inches.
_PANEL_WIDTH = 2.6
_MARGIN = 0.15
_GAP = 0.12
_TITLE_LINE = 0.2
_TEXT_LINE = 0.18
_TITLE_SIZE = 10
_REFERENCE_SIZE = 9
_STATS_LINE = 0.2  # the peak/entropy line under each panel
_STATS_SIZE = 8
_COLORBAR_WIDTH = 0.12
_COLORBAR_SPACE = 0.9  # the bar, its ticks and its label, right of the panels
BOX_COLOUR = "#ff4d4d"  # the dashed outline of the objects a word names, in every figure
ATTENTION_UNITS = "attention weight (share of the word's attention)"
_COLORBAR_LABELS = {
    "figure": ATTENTION_UNITS,
    "absolute": ATTENTION_UNITS,
    "word": "share of the word's peak weight",
}

Box = tuple[float, float, float, float]  # (x, y, width, height) in pixels, COCO convention


@dataclass
class FigureResult:
    """An attention figure and what it was drawn from.

    Attributes:
        figure: the matplotlib ``Figure`` (Agg canvas); save it with ``save_figure``.
        maps: (T, H, W) attention maps at the drawn image size, divided by each panel's colour-scale
            top and clipped to [0, 1] (what the colours show).
        image_size: (W, H) of the drawn image (the original, scaled down to ``max_side``).
        panels: 1 + T, the image panel and one panel per word.
        rows: rows of panels.
        columns: panels per row.
        axes: the panels' axes, image first.
        normalize: ``figure``, ``absolute`` or ``word`` (see ``overlay.NORMALIZATIONS``).
        ranges: (vmin, vmax) of each word's colour scale, in attention weight per grid cell.
        peaks: (T,) each word's largest cell weight.
        entropies: (T,) each word's attention entropy in nats; ``exp`` of it is the effective
            number of cells attended.
        colorbar: the figure's colour bar (None for an empty caption).
    """

    figure: Figure
    maps: np.ndarray
    image_size: tuple[int, int]
    panels: int
    rows: int
    columns: int
    axes: list[Axes]
    normalize: str = "figure"
    ranges: list[tuple[float, float]] = field(default_factory=list)
    peaks: np.ndarray = field(default_factory=lambda: np.zeros(0))
    entropies: np.ndarray = field(default_factory=lambda: np.zeros(0))
    colorbar: Colorbar | None = None


def _plain(text: str) -> str:
    """Keep matplotlib from reading ``$...$`` in a word as mathtext."""
    return text.replace("$", r"\$")


def _wrap(text: str, width_inches: float, font_size: float) -> list[str]:
    characters = max(8, int(width_inches * 72 / (0.6 * font_size)))
    return textwrap.wrap(text, characters, break_long_words=True) or [""]


def wrapped_label(label: str, length_inches: float, font_size: float) -> str:
    """A colour bar's label broken into lines that fit along a bar ``length_inches`` long."""
    return "\n".join(_wrap(label, length_inches, font_size))


def statistics_text(peak: float, entropy: float, peak_format: str = ".2f") -> str:
    """The line under a word's panel: its peak (in the colours' units, written with ``peak_format``),
    entropy and effective number of cells."""
    return f"peak {peak:{peak_format}} \u00b7 H {entropy:.2f} ({math.exp(entropy):.1f} cells)"


@dataclass(frozen=True)
class _Layout:
    """Where the parts of an attention figure go, in inches from its bottom left corner.

    Attributes:
        columns, rows: panels per row, and rows of panels.
        panel_height: every panel's height (its width is ``_PANEL_WIDTH``).
        title_heights: per row, the room its longest title takes above the panels.
        stats_height: the peak/entropy line under each row (0 for an empty caption).
        bar_width: the colour bar's room right of the panels (0 for an empty caption).
        width, height: the figure's size.
        notes: the lines under the panels (other captions, references).
        notes_height: their room.
    """

    columns: int
    rows: int
    panel_height: float
    title_heights: list[float]
    stats_height: float
    bar_width: float
    width: float
    height: float
    notes: list[str]
    notes_height: float

    def row_bottoms(self) -> list[float]:
        """Each row of panels' bottom edge, top row first."""
        bottoms = []
        top = self.height - _MARGIN
        for title_height in self.title_heights:
            top -= title_height
            bottoms.append(top - self.panel_height)
            top = bottoms[-1] - self.stats_height - _GAP
        return bottoms

    def rectangle(
        self, left: float, bottom: float, width: float, height: float
    ) -> tuple[float, float, float, float]:
        """(left, bottom, width, height) in inches as the shares of the figure ``add_axes`` takes."""
        return (left / self.width, bottom / self.height, width / self.width, height / self.height)


def _checked_betas(
    words: list[str],
    attention: Tensor | np.ndarray,
    betas: Tensor | np.ndarray | Sequence[float] | None,
    boxes: Sequence[Sequence[Box]] | None,
    columns: int,
) -> np.ndarray | None:
    """The (T,) gate values as floats, once every per-word input is checked to be one per word.

    Raises:
        ValueError: ``columns`` < 1, or the numbers of words, attention rows, betas and box lists differ.
    """
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    if len(attention) != len(words):
        raise ValueError(f"{len(words)} words but {len(attention)} attention maps")
    beta_values = None if betas is None else np.asarray(betas, dtype=np.float64).reshape(-1)
    if beta_values is not None and len(beta_values) != len(words):
        raise ValueError(f"{len(words)} words but {len(beta_values)} betas")
    if boxes is not None and len(boxes) != len(words):
        raise ValueError(f"{len(words)} words but {len(boxes)} lists of boxes")
    return beta_values


def drawn_pixels(image: Image.Image, max_side: int | None) -> tuple[np.ndarray, tuple[float, float]]:
    """The (H, W, 3) uint8 RGB pixels of ``image`` scaled down to ``max_side`` (``display_size``), and
    (x, y) scale from the original's pixels to the drawn ones (for boxes)."""
    width, height = display_size(image.size, max_side)
    picture = image.convert("RGB")
    scale = (width / picture.size[0], height / picture.size[1])
    if (width, height) != picture.size:
        picture = picture.resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(picture), scale


def _panel_titles(
    words: list[str], text: str | None, attention_label: str, beta_values: np.ndarray | None
) -> list[list[str]]:
    """Each panel's title as wrapped lines: the caption (and which map is drawn) over the image, then
    each word (with its gate value)."""
    # A vocabulary's words are data: control characters, line breaks and lone surrogates drawn as escapes.
    caption = printable(" ".join(words) if text is None else text) or "(empty caption)"
    titles = [
        _wrap(caption, _PANEL_WIDTH, _TITLE_SIZE)
        + (_wrap(f"(attention: {attention_label})", _PANEL_WIDTH, _TITLE_SIZE) if attention_label else [])
    ]
    for t, word in enumerate(map(printable, words)):
        title = word if beta_values is None else f"{word} (beta={beta_values[t]:.2f})"
        titles.append(_wrap(title, _PANEL_WIDTH, _TITLE_SIZE))
    return titles


def _note_lines(
    alternatives: Sequence[str] | None, references: Sequence[str] | None, width_inches: float
) -> list[str]:
    """The lines under the panels: the other captions, ranked from 2, then the references."""
    lines = []
    if alternatives:
        lines.append("Other captions, ranked:")
        for rank, other in enumerate(alternatives, 2):
            wrapped = _wrap(f"{rank}. " + printable(str(other)), width_inches, _REFERENCE_SIZE)
            lines.extend([wrapped[0], *("   " + line for line in wrapped[1:])])
    if references:
        lines.append("References:")
        for reference in references:
            wrapped = _wrap(printable(str(reference)), width_inches, _REFERENCE_SIZE)
            lines.extend(["- " + wrapped[0], *("  " + line for line in wrapped[1:])])
    return lines


def _layout(
    titles: list[list[str]],
    columns: int,
    pixels: np.ndarray,
    alternatives: Sequence[str] | None,
    references: Sequence[str] | None,
) -> _Layout:
    """The figure's size and its parts' places for ``titles`` (the image's, then one per word)."""
    panels = len(titles)
    has_words = panels > 1
    ncols = min(columns, panels)
    nrows = math.ceil(panels / ncols)
    height, width = pixels.shape[:2]
    panel_height = _PANEL_WIDTH * min(max(height / width, 0.25), 4.0)
    title_heights = [
        0.08 + _TITLE_LINE * max(len(titles[i]) for i in range(r * ncols, min(panels, (r + 1) * ncols)))
        for r in range(nrows)
    ]
    stats_height = _STATS_LINE if has_words else 0.0
    bar_width = _COLORBAR_SPACE if has_words else 0.0
    figure_width = 2 * _MARGIN + ncols * _PANEL_WIDTH + (ncols - 1) * _GAP + bar_width
    notes = _note_lines(alternatives, references, figure_width - 2 * _MARGIN - 0.2)
    notes_height = _TEXT_LINE * len(notes) + (0.1 if notes else 0.0)
    figure_height = (
        2 * _MARGIN
        + sum(title_heights)
        + nrows * (panel_height + stats_height)
        + (nrows - 1) * _GAP
        + notes_height
    )
    return _Layout(
        ncols, nrows, panel_height, title_heights, stats_height, bar_width, figure_width, figure_height,
        notes, notes_height,
    )  # fmt: skip


def outline_boxes(ax: Axes, boxes: Iterable[Box], scale: tuple[float, float]) -> None:
    """Outline ``boxes`` (x, y, width, height in the original image's pixels) on a panel drawn at
    ``scale`` (x, y) of the original, dashed in ``BOX_COLOUR``."""
    for x, y, w, h in boxes:
        ax.add_patch(
            Rectangle(
                (x * scale[0], y * scale[1]),
                w * scale[0],
                h * scale[1],
                fill=False,
                edgecolor=BOX_COLOUR,
                linewidth=1.5,
                linestyle="--",
            )
        )


def _image_panels(figure: Figure, layout: _Layout, pixels: np.ndarray, titles: list[list[str]]) -> list[Axes]:
    """One panel per title, row by row: the image drawn in each, the title over it."""
    axes = []
    for row, bottom in enumerate(layout.row_bottoms()):
        for column in range(min(layout.columns, len(titles) - row * layout.columns)):
            left = _MARGIN + column * (_PANEL_WIDTH + _GAP)
            ax = figure.add_axes(layout.rectangle(left, bottom, _PANEL_WIDTH, layout.panel_height))
            ax.imshow(pixels, interpolation="antialiased")  # aspect kept; extreme shapes letterbox
            title = _plain("\n".join(titles[row * layout.columns + column]))
            ax.set_title(title, fontsize=_TITLE_SIZE, pad=3, fontfamily=font_families())
            ax.set_axis_off()
            axes.append(ax)
    return axes


def _draw_colour_bar(
    figure: Figure, layout: _Layout, bar_range: tuple[float, float], colours: Colormap, label: str
) -> Colorbar:
    """The colour bar right of the panels, beside the first row, labelled ``label``."""
    bottom = layout.row_bottoms()[0]
    left = layout.width - _MARGIN - layout.bar_width + _GAP
    bar_axes = figure.add_axes(layout.rectangle(left, bottom, _COLORBAR_WIDTH, layout.panel_height))
    colorbar = figure.colorbar(ScalarMappable(Normalize(*bar_range), colours), cax=bar_axes)
    colorbar.set_label(wrapped_label(label, layout.panel_height, _STATS_SIZE), fontsize=_STATS_SIZE)
    colorbar.ax.tick_params(labelsize=_STATS_SIZE)
    return colorbar


def _draw_notes(figure: Figure, layout: _Layout) -> None:
    """The other captions and the references under the panels."""
    figure.text(
        _MARGIN / layout.width,
        (_MARGIN + layout.notes_height) / layout.height,
        _plain("\n".join(layout.notes)),
        fontsize=_REFERENCE_SIZE,
        va="top",
        ha="left",
        linespacing=1.3,
        fontfamily=font_families(),
    )


def attention_figure(
    image: Image.Image,
    words: Sequence[str],
    attention: Tensor | np.ndarray,
    grid: tuple[int, int],
    betas: Tensor | np.ndarray | Sequence[float] | None = None,
    references: Sequence[str] | None = None,
    mode: str = "bilinear",
    columns: int = 5,
    cmap: str = DEFAULT_CMAP,
    alpha: float = 0.6,
    max_side: int | None = 512,
    attention_label: str = "",
    normalize: str = "figure",
    boxes: Sequence[Sequence[Box]] | None = None,
    text: str | None = None,
    alternatives: Sequence[str] | None = None,
) -> FigureResult:
    """Draw the image titled by its caption, then one attention overlay per word, on one colour scale.

    Under each word's panel: its peak weight and entropy (with the effective number of cells,
    ``exp(entropy)``: 1 for a one-hot map, gh*gw for a flat one). A colour bar gives the scale.

    Args:
        image: the original picture (any size and aspect ratio); converted to RGB if needed.
        words: the caption's T words; may be empty (the figure is then the image alone).
        attention: (T, P) or (T, gh, gw) attention of each word (rows of ``Caption.attention``).
        grid: (gh, gw), the attention grid (``Captioner.grid``).
        betas: (T,) gate values; each word's title then reads ``word (beta=0.73)``.
        references: reference captions, printed under the panels.
        mode: ``bilinear`` or ``gaussian`` upsampling (see ``upsample_attention``).
        columns: panels per row; longer captions wrap onto more rows.
        cmap: matplotlib colour map of the overlays (default viridis, perceptually uniform).
        alpha: opacity of the overlays.
        max_side: the image is drawn scaled down to this longer side (bounds memory and file size);
            None draws it at full size.
        attention_label: which map the overlays show (``CaptionDecoder.describe_attention``, e.g.
            ``layer 3 of 3, mean of 8 heads``), printed under the caption; empty prints nothing.
        normalize: ``figure`` (every word on one scale, 0 to the largest weight in the figure),
            ``absolute`` (0 to 1) or ``word`` (each map to its own peak: a flat map looks as hot as
            a sharp one; the colour bar then reads as a share of each word's peak).
        boxes: per word, the (x, y, width, height) boxes in the original image's pixels of the
            objects the word names (e.g. ground-truth boxes); drawn as outlines on its panel.
        alternatives: the image's other captions, ranked (``decode.num_return``), printed under
            the panels as ``2. ...``, ``3. ...``: the overlays are the first caption's.
    Returns:
        A ``FigureResult`` with the figure, the (T, H, W) maps, the colour scales and the layout.
    Raises:
        ValueError: the numbers of words, attention rows, betas and box lists differ, ``columns`` < 1,
            or an unknown ``normalize`` or colour map.
    """
    words = list(words)
    beta_values = _checked_betas(words, attention, betas, boxes, columns)
    ranges = display_range(attention, normalize)
    colours = colour_map(cmap)
    pixels, scale = drawn_pixels(image, max_side)
    height, width = pixels.shape[:2]
    weights = upsample_attention(attention, grid, (height, width), mode, normalize=False)  # (T, H, W)
    peaks, entropies = attention_statistics(attention)  # (T,), (T,)
    tops = np.array([top for _, top in ranges], dtype=np.float32).reshape(-1, 1, 1)  # (T, 1, 1)
    maps = np.clip(weights / tops, 0.0, 1.0) if len(words) else weights  # (T, H, W)

    titles = _panel_titles(words, text, attention_label, beta_values)
    layout = _layout(titles, columns, pixels, alternatives, references)
    figure = Figure(figsize=(layout.width, layout.height))
    FigureCanvasAgg(figure)
    axes = _image_panels(figure, layout, pixels, titles)
    for t, ax in enumerate(axes[1:]):
        overlay_norm = Normalize(*ranges[t])
        ax.imshow(weights[t], cmap=colours, norm=overlay_norm, alpha=alpha, interpolation="antialiased")
        statistics = statistics_text(peaks[t], entropies[t])
        ax.text(0.5, -0.02, statistics, transform=ax.transAxes, ha="center", va="top", fontsize=_STATS_SIZE)
        outline_boxes(ax, boxes[t] if boxes is not None else (), scale)
    colorbar = None
    if words:
        bar_range = (0.0, 1.0) if normalize == "word" else ranges[0]
        colorbar = _draw_colour_bar(figure, layout, bar_range, colours, _COLORBAR_LABELS[normalize])
    if layout.notes:
        _draw_notes(figure, layout)
    return FigureResult(
        figure, maps, (width, height), len(titles), layout.rows, layout.columns, axes, normalize, ranges,
        peaks, entropies, colorbar,
    )  # fmt: skip


def save_figure(figure: Figure, path: str | Path, dpi: int = 100) -> Path:
    """Write ``figure`` as PNG, PDF or SVG, chosen by the file extension; creates the folder.

    Raises:
        ValueError: another extension.
    """
    path = Path(path)
    file_format = FORMATS.get(path.suffix.lower())
    if file_format is None:
        raise ValueError(f"{path}: figure format must be one of {', '.join(FORMATS)}")
    with quiet_fonts():  # font_note says what is missing, once
        atomic_write(path, lambda temporary: figure.savefig(temporary, format=file_format, dpi=dpi))
    return path
