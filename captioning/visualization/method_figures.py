"""One figure comparing attribution methods: a row per method, a panel per word.

Every row is drawn on one colour scale in the method's own units (``METHOD_UNITS``: attention weights,
gradient x input, a drop in log-probability), named on the row's colour bar. The scale starts at 0 and
tops at the row's largest positive value, or at ``overlay.FLAT_FLOOR`` times an even spread of a word's
positive total when that is higher (``overlay.scale_top``): a map whose cells are all about equal is
drawn dark, never stretched to the top. Negative values (a cell that lowers the word's probability)
are drawn as 0. Under each panel: the map's peak in the same units as the colours, and the entropy of
its positive part as shares summing to 1 with the effective number of cells, so a flat map and a sharp
one read differently whatever the units. Where boxes are given (the objects a word names), each
method's panel of that word outlines them, as the attention figures do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from PIL import Image

from captioning.utils.shares import positive_shares
from captioning.utils.text import printable
from captioning.visualization.figures import (
    ATTENTION_UNITS,
    Box,
    drawn_pixels,
    outline_boxes,
    statistics_text,
    wrapped_label,
)
from captioning.visualization.overlay import (
    attention_statistics,
    colour_map,
    scale_top,
    upsample_attention,
)

_PANEL = 1.6  # inches per panel side (width)
_MARGIN, _GAP, _BAR, _TITLE, _STATS = 0.2, 0.1, 1.0, 0.3, 0.22

# What each registered method's maps measure: the label of its row's colour bar. Every method explains
# the word's log-probability (``captioning.explain.scoring``); Chefer et al.'s rules its logit.
METHOD_UNITS = {
    "attention": ATTENTION_UNITS,
    "gradient": "gradient x input (log-prob units)",
    "integrated_gradients": "integrated gradients (log-prob units)",
    "gradcam": "Grad-CAM (log-prob gradient x activation)",
    "occlusion": "drop in log-prob when the cell is occluded",
    "rollout": "attention rollout (share of relevance)",
    "gradient_rollout": "gradient-weighted rollout (relevance)",
    "chefer": "Chefer relevance (logit units)",
}


def method_units(name: str) -> str:
    """The colour-bar label of method ``name``: ``METHOD_UNITS``, or the method's own units."""
    return METHOD_UNITS.get(name, f"{printable(name)} (the method's own units)")


@dataclass(frozen=True)
class _Layout:
    """Where a method figure's panels go, in inches from its bottom left corner.

    Attributes:
        panel_height: every panel's height (its width is ``_PANEL``).
        per_line: word panels per line, after the image's column.
        line_height: one line of panels with its titles and statistics.
        block: one method's lines.
        width, height: the figure's size.
    """

    panel_height: float
    per_line: int
    line_height: float
    block: float
    width: float
    height: float

    @classmethod
    def of(cls, pixels: np.ndarray, words: int, methods: int, columns: int | None) -> _Layout:
        """The layout of ``methods`` rows of the image and ``words`` panels, ``columns`` panels a line."""
        height, width = pixels.shape[:2]
        panel_height = _PANEL * min(max(height / width, 0.25), 4.0)
        per_line = (columns or words + 1) - 1  # word panels per line, after the image's column
        lines = max(1, math.ceil(words / max(per_line, 1)))
        figure_width = 2 * _MARGIN + (per_line + 1) * _PANEL + per_line * _GAP + _BAR
        line_height = _TITLE + panel_height + _STATS
        block = lines * line_height  # one method
        figure_height = 2 * _MARGIN + methods * block + max(methods - 1, 0) * _GAP
        return cls(panel_height, per_line, line_height, block, figure_width, figure_height)

    def rectangle(self, left: float, bottom: float, width: float) -> tuple[float, float, float, float]:
        """A panel's (left, bottom, width, height) in inches as the shares of the figure ``add_axes``
        takes."""
        return (left / self.width, bottom / self.height, width / self.width, self.panel_height / self.height)

    def panel(self, figure: Figure, line_bottom: float, column: int) -> Axes:
        """The axes of the panel in ``column`` of the line whose bottom is ``line_bottom``."""
        return figure.add_axes(self.rectangle(_MARGIN + column * (_PANEL + _GAP), line_bottom, _PANEL))


@dataclass(frozen=True)
class _Overlays:
    """What every panel draws: the image's (H, W, 3) pixels, then a word's map over them.

    Attributes:
        pixels: the drawn image; scale: (x, y) from the original's pixels to the drawn ones.
        grid: (gh, gw) of the maps; mode: ``bilinear`` or ``gaussian`` upsampling.
        colours: the maps' colour map; alpha: their opacity.
    """

    pixels: np.ndarray
    scale: tuple[float, float]
    grid: tuple[int, int]
    mode: str
    colours: Colormap
    alpha: float

    def upsampled(self, maps: np.ndarray) -> np.ndarray:
        """(T, P) maps stretched onto the drawn image: (T, H, W)."""
        size = self.pixels.shape[:2]
        return upsample_attention(maps, self.grid, size, self.mode, normalize=False)


def _check_per_word(
    words: list[str],
    maps: Mapping[str, np.ndarray],
    boxes: Sequence[Sequence[Box]] | None,
    columns: int | None,
) -> None:
    """Raise ``ValueError`` unless every method's maps and the box lists are one per word and
    ``columns`` leaves room for a word."""
    if boxes is not None and len(boxes) != len(words):
        raise ValueError(f"{len(boxes)} lists of boxes for {len(words)} words")
    for name in maps:
        if len(maps[name]) != len(words):
            raise ValueError(f"method {name}: {len(maps[name])} maps for {len(words)} words")
    if columns is not None and columns < 2:
        raise ValueError(f"columns must be >= 2 (the image and a word), got {columns}")


def _draw_method(
    figure: Figure,
    layout: _Layout,
    block_top: float,
    name: str,
    method_maps: np.ndarray,
    words: list[str],
    boxes: Sequence[Sequence[Box]] | None,
    overlays: _Overlays,
) -> None:
    """One method's row below ``block_top``: the image titled by the method, each word's map
    (``method_maps``, (T, P) or (T, gh, gw)) over it with its line, and a colour bar in the method's
    units."""
    first_bottom = block_top - _TITLE - layout.panel_height
    ax = layout.panel(figure, first_bottom, 0)
    ax.imshow(overlays.pixels)
    ax.set_title(printable(name), fontsize=9, fontweight="bold")
    ax.set_axis_off()
    if not words:  # an empty caption: the method's row is the image alone
        return
    flat = np.asarray(method_maps, dtype=np.float64).reshape(len(words), -1)  # (T, P)
    positive = np.clip(flat, 0.0, None)
    norm = Normalize(0.0, scale_top(positive))
    upsampled = overlays.upsampled(positive)  # (T, H, W)
    _, entropies = attention_statistics(positive_shares(flat))  # of the positive part's shares
    peaks = positive.max(axis=1) if positive.size else np.zeros(len(words))  # the colours' units
    for t, word in enumerate(words):
        line, column = divmod(t, max(layout.per_line, 1))
        ax = layout.panel(figure, first_bottom - line * layout.line_height, column + 1)
        ax.imshow(overlays.pixels)
        ax.imshow(upsampled[t], cmap=overlays.colours, norm=norm, alpha=overlays.alpha)
        ax.set_title(printable(word), fontsize=9)
        statistics = statistics_text(peaks[t], entropies[t], ".3g")
        ax.text(0.5, -0.02, statistics, transform=ax.transAxes, ha="center", va="top", fontsize=6)
        outline_boxes(ax, boxes[t] if boxes is not None else (), overlays.scale)
        ax.set_axis_off()
    bar = figure.add_axes(layout.rectangle(layout.width - _MARGIN - _BAR + _GAP, first_bottom, 0.12))
    colorbar = figure.colorbar(ScalarMappable(norm, overlays.colours), cax=bar)
    colorbar.set_label(wrapped_label(method_units(name), layout.panel_height, 6), fontsize=6)
    colorbar.ax.tick_params(labelsize=6)


def method_figure(
    image: Image.Image,
    words: Sequence[str],
    maps: Mapping[str, np.ndarray],
    grid: tuple[int, int],
    mode: str = "bilinear",
    cmap: str = "viridis",
    alpha: float = 0.6,
    max_side: int | None = 384,
    boxes: Sequence[Sequence[Box]] | None = None,
    columns: int | None = None,
) -> Figure:
    """The image with each method's map of each word over it.

    Args:
        image: the picture; words: the caption's T words; may be empty (each method's row is then
            the image alone).
        maps: method -> (T, P) or (T, gh, gw) map of each word, in row order.
        grid: (gh, gw).
        mode: ``bilinear`` or ``gaussian`` upsampling; cmap, alpha: the overlays' colours.
        boxes: per word, the (x, y, width, height) boxes in the original image's pixels of the objects
            it names; outlined on that word's panel of every method.
        columns: panels per line (the image, then words); a method's longer caption wraps onto more
            lines, so a figure stays readable where it is shown narrow (the demo). None: one line.
    Raises:
        ValueError: a method's maps, or the box lists, are not one per word; ``columns`` < 2.
    """
    words = list(words)
    _check_per_word(words, maps, boxes, columns)
    pixels, scale = drawn_pixels(image, max_side)
    layout = _Layout.of(pixels, len(words), len(maps), columns)
    figure = Figure(figsize=(layout.width, layout.height))
    FigureCanvasAgg(figure)
    overlays = _Overlays(pixels, scale, grid, mode, colour_map(cmap), alpha)
    for r, name in enumerate(maps):
        block_top = layout.height - _MARGIN - r * (layout.block + _GAP)
        _draw_method(figure, layout, block_top, name, maps[name], words, boxes, overlays)
    return figure
