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

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

from captioning.utils.shares import positive_shares
from captioning.utils.text import printable
from captioning.visualization.figures import (
    ATTENTION_UNITS,
    BOX_COLOUR,
    Box,
    statistics_text,
    wrapped_label,
)
from captioning.visualization.overlay import (
    attention_statistics,
    colour_map,
    display_size,
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
        image: the picture; words: the caption's T words.
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
    rows = list(maps)
    if boxes is not None and len(boxes) != len(words):
        raise ValueError(f"{len(boxes)} lists of boxes for {len(words)} words")
    for name in rows:
        if len(maps[name]) != len(words):
            raise ValueError(f"method {name}: {len(maps[name])} maps for {len(words)} words")
    if columns is not None and columns < 2:
        raise ValueError(f"columns must be >= 2 (the image and a word), got {columns}")
    width, height = display_size(image.size, max_side)
    scale = (width / image.size[0], height / image.size[1])
    pixels = np.asarray(image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC))
    panel_height = _PANEL * min(max(height / width, 0.25), 4.0)
    per_line = (columns or len(words) + 1) - 1  # word panels per line, after the image's column
    lines = max(1, math.ceil(len(words) / max(per_line, 1)))
    figure_width = 2 * _MARGIN + (per_line + 1) * _PANEL + per_line * _GAP + _BAR
    line_height = _TITLE + panel_height + _STATS
    block = lines * line_height  # one method
    figure_height = 2 * _MARGIN + len(rows) * block + max(len(rows) - 1, 0) * _GAP
    figure = Figure(figsize=(figure_width, figure_height))
    FigureCanvasAgg(figure)
    colours = colour_map(cmap)

    def panel(line_bottom: float, column: int) -> Axes:
        left = _MARGIN + column * (_PANEL + _GAP)
        box = (left / figure_width, line_bottom / figure_height)
        return figure.add_axes((*box, _PANEL / figure_width, panel_height / figure_height))

    for r, name in enumerate(rows):
        flat = np.asarray(maps[name], dtype=np.float64).reshape(len(words), -1)  # (T, P)
        positive = np.clip(flat, 0.0, None)
        top = scale_top(positive)
        norm = Normalize(0.0, top)
        upsampled = upsample_attention(positive, grid, (height, width), mode, normalize=False)  # (T, H, W)
        _, entropies = attention_statistics(positive_shares(flat))  # of the positive part's shares
        peaks = positive.max(axis=1) if positive.size else np.zeros(len(words))  # the colours' units
        block_top = figure_height - _MARGIN - r * (block + _GAP)
        first_bottom = block_top - _TITLE - panel_height
        ax = panel(first_bottom, 0)
        ax.imshow(pixels)
        ax.set_title(printable(name), fontsize=9, fontweight="bold")
        ax.set_axis_off()
        for t, word in enumerate(words):
            line, column = divmod(t, max(per_line, 1))
            ax = panel(first_bottom - line * line_height, column + 1)
            ax.imshow(pixels)
            ax.imshow(upsampled[t], cmap=colours, norm=norm, alpha=alpha)
            ax.set_title(printable(word), fontsize=9)
            ax.text(
                0.5, -0.02, statistics_text(peaks[t], entropies[t], ".3g"), transform=ax.transAxes,
                ha="center", va="top", fontsize=6,
            )  # fmt: skip
            for x, y, w, h in boxes[t] if boxes is not None else ():
                ax.add_patch(
                    Rectangle(
                        (x * scale[0], y * scale[1]),
                        w * scale[0],
                        h * scale[1],
                        fill=False,
                        edgecolor=BOX_COLOUR,
                        linewidth=1.5,
                        linestyle="--",
                    )  # fmt: skip
                )
            ax.set_axis_off()
        bar = figure.add_axes(
            (
                (figure_width - _MARGIN - _BAR + _GAP) / figure_width,
                first_bottom / figure_height,
                0.12 / figure_width,
                panel_height / figure_height,
            )
        )
        colorbar = figure.colorbar(ScalarMappable(norm, colours), cax=bar)
        colorbar.set_label(wrapped_label(method_units(name), panel_height, 6), fontsize=6)
        colorbar.ax.tick_params(labelsize=6)
    return figure
