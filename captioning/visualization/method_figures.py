"""One figure comparing attribution methods: a row per method, a panel per word.

Every row is drawn on one colour scale, 0 to the largest positive value of that method's maps in the
figure (a method's scores have their own units: attention weights, gradient x input, a drop in
log-probability), with the row's colour bar beside it. Negative values (a cell that lowers the word's
probability) are drawn as 0. Under each panel: the map's peak and entropy over its positive part as
shares summing to 1 (``statistics_text``), so a flat map and a sharp one read differently whatever
the scale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

from captioning.utils.text import printable
from captioning.visualization.figures import BOX_COLOUR, statistics_text
from captioning.visualization.overlay import (
    attention_statistics,
    colour_map,
    display_size,
    upsample_attention,
)

_PANEL = 1.6  # inches per panel side (width)
_MARGIN, _GAP, _BAR, _TITLE, _STATS = 0.2, 0.1, 0.5, 0.3, 0.22


def shares(maps: np.ndarray) -> np.ndarray:
    """(T, P) maps -> their positive parts as shares summing to 1 per word (uniform when none)."""
    positive = np.clip(np.asarray(maps, dtype=np.float64), 0.0, None)
    totals = positive.sum(axis=1, keepdims=True)
    uniform = np.full_like(positive, 1.0 / max(positive.shape[1], 1))
    return np.where(totals > 0, positive / np.where(totals > 0, totals, 1.0), uniform)


def method_figure(
    image: Image.Image,
    words: Sequence[str],
    maps: Mapping[str, np.ndarray],
    grid: tuple[int, int],
    mode: str = "bilinear",
    cmap: str = "viridis",
    alpha: float = 0.6,
    max_side: int | None = 384,
    boxes: Sequence[Sequence[tuple[float, float, float, float]]] | None = None,
) -> Figure:
    """The image with each method's map of each word over it.

    Args:
        image: the picture; words: the caption's T words.
        maps: method -> (T, P) or (T, gh, gw) map of each word, in row order.
        grid: (gh, gw).
        mode: ``bilinear`` or ``gaussian`` upsampling; cmap, alpha: the overlays' colours.
        boxes: per word, the (x, y, width, height) boxes in the image's pixels of the objects it names
            (``grounding.word_boxes``), outlined dashed on each of its panels.
    Raises:
        ValueError: a method's maps, or the lists of boxes, are not one per word.
    """
    words = list(words)
    rows = list(maps)
    if boxes is not None and len(boxes) != len(words):
        raise ValueError(f"{len(boxes)} lists of boxes for {len(words)} words")
    for name in rows:
        if len(maps[name]) != len(words):
            raise ValueError(f"method {name}: {len(maps[name])} maps for {len(words)} words")
    width, height = display_size(image.size, max_side)
    pixels = np.asarray(image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC))
    panel_height = _PANEL * min(max(height / width, 0.25), 4.0)
    columns = len(words) + 1
    figure_width = 2 * _MARGIN + columns * _PANEL + (columns - 1) * _GAP + _BAR
    row_height = _TITLE + panel_height + _STATS
    figure_height = 2 * _MARGIN + len(rows) * row_height + max(len(rows) - 1, 0) * _GAP
    figure = Figure(figsize=(figure_width, figure_height))
    FigureCanvasAgg(figure)
    colours = colour_map(cmap)
    for r, name in enumerate(rows):
        flat = np.asarray(maps[name], dtype=np.float64).reshape(len(words), -1)  # (T, P)
        positive = np.clip(flat, 0.0, None)
        top = float(positive.max()) if positive.size and positive.max() > 0 else 1.0
        upsampled = upsample_attention(positive, grid, (height, width), mode, normalize=False)  # (T, H, W)
        peaks, entropies = attention_statistics(shares(flat))  # of the positive part's shares
        bottom = figure_height - _MARGIN - (r + 1) * row_height - r * _GAP + _STATS
        for c in range(columns):
            left = _MARGIN + c * (_PANEL + _GAP)
            ax = figure.add_axes(
                (
                    left / figure_width,
                    bottom / figure_height,
                    _PANEL / figure_width,
                    panel_height / figure_height,
                )
            )
            ax.imshow(pixels)
            if c == 0:
                ax.set_title(printable(name), fontsize=9, fontweight="bold")
            else:
                t = c - 1
                ax.imshow(upsampled[t], cmap=colours, norm=Normalize(0.0, top), alpha=alpha)
                ax.set_title(printable(words[t]), fontsize=9)
                for x, y, w, h in boxes[t] if boxes is not None else ():
                    scale_x, scale_y = width / image.size[0], height / image.size[1]
                    ax.add_patch(
                        Rectangle(
                            (x * scale_x, y * scale_y), w * scale_x, h * scale_y,
                            fill=False, edgecolor=BOX_COLOUR, linewidth=1.5, linestyle="--",
                        )
                    )  # fmt: skip
                ax.text(
                    0.5, -0.02, statistics_text(peaks[t], entropies[t]), transform=ax.transAxes,
                    ha="center", va="top", fontsize=6,
                )  # fmt: skip
            ax.set_axis_off()
        bar = figure.add_axes(
            (
                (figure_width - _MARGIN - _BAR + _GAP) / figure_width,
                bottom / figure_height,
                0.12 / figure_width,
                panel_height / figure_height,
            )
        )
        colorbar = figure.colorbar(ScalarMappable(Normalize(0.0, top), colours), cax=bar)
        colorbar.ax.tick_params(labelsize=6)
    return figure
