"""Attention figures in the style of Show, Attend and Tell: the image, then one overlay per word.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot state, no window,
safe in threads, on servers and in notebooks (a ``Figure`` displays itself in Jupyter).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from matplotlib import font_manager, rcParams
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image
from torch import Tensor

from captioning.files import atomic_write
from captioning.visualization.overlay import blend, display_size, upsample_attention

FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}

# Layout, in inches.
_PANEL_WIDTH = 2.6
_MARGIN = 0.15
_GAP = 0.12
_TITLE_LINE = 0.2
_TEXT_LINE = 0.18
_TITLE_SIZE = 10
_REFERENCE_SIZE = 9
# Fonts with Chinese, Japanese and Korean glyphs, used (when installed) for the characters the default
# font lacks: captions of data.tokenizer characters or whitespace are drawn, not shown as empty boxes.
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK KR", "Source Han Sans SC", "WenQuanYi Micro Hei",
             "WenQuanYi Zen Hei", "Droid Sans Fallback", "AR PL UMing CN")


@lru_cache(maxsize=1)
def font_families() -> tuple[str, ...]:
    """The fonts figure text is drawn with: matplotlib's default, then each installed ``CJK_FONTS`` font,
    which matplotlib falls back to glyph by glyph."""
    installed = {font.name for font in font_manager.fontManager.ttflist}
    return (*rcParams["font.sans-serif"][:1], *(name for name in CJK_FONTS if name in installed))


@dataclass
class FigureResult:
    """An attention figure and what it was drawn from.

    Attributes:
        figure: the matplotlib ``Figure`` (Agg canvas); save it with ``save_figure``.
        maps: (T, H, W) display-scaled attention maps in [0, 1], at the drawn image size.
        image_size: (W, H) of the drawn image (the original, scaled down to ``max_side``).
        panels: 1 + T, the image panel and one panel per word.
        rows: rows of panels.
        columns: panels per row.
        axes: the panels' axes, image first.
    """

    figure: Figure
    maps: np.ndarray
    image_size: tuple[int, int]
    panels: int
    rows: int
    columns: int
    axes: list[Axes]


def _plain(text: str) -> str:
    """Keep matplotlib from reading ``$...$`` in a word as mathtext."""
    return text.replace("$", r"\$")


def _wrap(text: str, width_inches: float, font_size: float) -> list[str]:
    characters = max(8, int(width_inches * 72 / (0.6 * font_size)))
    return textwrap.wrap(text, characters, break_long_words=True) or [""]


def attention_figure(image: Image.Image, words: Sequence[str], attention: Tensor | np.ndarray,
                     grid: tuple[int, int], betas: Tensor | np.ndarray | Sequence[float] | None = None,
                     references: Sequence[str] | None = None, mode: str = "bilinear", columns: int = 5,
                     cmap: str = "jet", alpha: float = 0.6, max_side: int | None = 512,
                     attention_label: str = "") -> FigureResult:
    """Draw the image titled by its caption, then one attention overlay per word.

    Args:
        image: the original picture (any size and aspect ratio); converted to RGB if needed.
        words: the caption's T words; may be empty (the figure is then the image alone).
        attention: (T, P) or (T, gh, gw) attention of each word (rows of ``Caption.attention``).
        grid: (gh, gw), the attention grid (``Captioner.grid``).
        betas: (T,) gate values; each word's title then reads ``word (beta=0.73)``.
        references: reference captions, printed under the panels.
        mode: ``bilinear`` or ``gaussian`` upsampling (see ``upsample_attention``).
        columns: panels per row; longer captions wrap onto more rows.
        cmap: matplotlib colour map of the overlays.
        alpha: opacity of the overlays.
        max_side: the image is drawn scaled down to this longer side (bounds memory and file size);
            None draws it at full size.
        attention_label: which map the overlays show (``CaptionDecoder.describe_attention``, e.g.
            ``layer 3 of 3, mean of 8 heads``), printed under the caption; empty prints nothing.
    Returns:
        A ``FigureResult`` with the figure, the (T, H, W) maps and the panel layout.
    Raises:
        ValueError: the numbers of words, attention rows and betas differ, or ``columns`` < 1.
    """
    words = list(words)
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    if len(attention) != len(words):
        raise ValueError(f"{len(words)} words but {len(attention)} attention maps")
    beta_values = None if betas is None else np.asarray(betas, dtype=np.float64).reshape(-1)
    if beta_values is not None and len(beta_values) != len(words):
        raise ValueError(f"{len(words)} words but {len(beta_values)} betas")

    width, height = display_size(image.size, max_side)
    picture = image.convert("RGB")
    if (width, height) != picture.size:
        picture = picture.resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.asarray(picture)  # (H, W, 3) uint8
    maps = upsample_attention(attention, grid, (height, width), mode)  # (T, H, W)

    panels = len(words) + 1
    ncols = min(columns, panels)
    nrows = math.ceil(panels / ncols)
    aspect = min(max(height / width, 0.25), 4.0)
    panel_height = _PANEL_WIDTH * aspect
    caption = " ".join(words) if words else "(empty caption)"
    titles = [_wrap(caption, _PANEL_WIDTH, _TITLE_SIZE)
              + (_wrap(f"(attention: {attention_label})", _PANEL_WIDTH, _TITLE_SIZE) if attention_label else [])]
    for t, word in enumerate(words):
        title = word if beta_values is None else f"{word} (beta={beta_values[t]:.2f})"
        titles.append(_wrap(title, _PANEL_WIDTH, _TITLE_SIZE))
    title_heights = [0.08 + _TITLE_LINE * max(len(titles[i]) for i in range(r * ncols, min(panels, (r + 1) * ncols)))
                     for r in range(nrows)]

    figure_width = 2 * _MARGIN + ncols * _PANEL_WIDTH + (ncols - 1) * _GAP
    reference_lines = []
    if references:
        reference_lines.append("References:")
        for reference in references:
            wrapped = _wrap(reference, figure_width - 2 * _MARGIN - 0.2, _REFERENCE_SIZE)
            reference_lines.extend(["- " + wrapped[0], *("  " + line for line in wrapped[1:])])
    reference_height = _TEXT_LINE * len(reference_lines) + (0.1 if reference_lines else 0.0)
    figure_height = (2 * _MARGIN + sum(title_heights) + nrows * panel_height + (nrows - 1) * _GAP
                     + reference_height)

    figure = Figure(figsize=(figure_width, figure_height))
    FigureCanvasAgg(figure)
    axes = []
    top = figure_height - _MARGIN  # inches from the bottom
    for row in range(nrows):
        top -= title_heights[row]
        bottom = top - panel_height
        for column in range(ncols):
            index = row * ncols + column
            if index >= panels:
                break
            left = _MARGIN + column * (_PANEL_WIDTH + _GAP)
            ax = figure.add_axes((left / figure_width, bottom / figure_height,
                                  _PANEL_WIDTH / figure_width, panel_height / figure_height))
            shown = pixels if index == 0 else blend(pixels, maps[index - 1], cmap, alpha)
            ax.imshow(shown, interpolation="antialiased")  # aspect kept; extreme shapes letterbox
            ax.set_title(_plain("\n".join(titles[index])), fontsize=_TITLE_SIZE, pad=3, fontfamily=font_families())
            ax.set_axis_off()
            axes.append(ax)
        top = bottom - _GAP
    if reference_lines:
        figure.text(_MARGIN / figure_width, (_MARGIN + reference_height) / figure_height,
                    _plain("\n".join(reference_lines)), fontsize=_REFERENCE_SIZE, va="top", ha="left",
                    linespacing=1.3, fontfamily=font_families())
    return FigureResult(figure, maps, (width, height), panels, nrows, ncols, axes)


def save_figure(figure: Figure, path: str | Path, dpi: int = 100) -> Path:
    """Write ``figure`` as PNG, PDF or SVG, chosen by the file extension; creates the folder.

    Raises:
        ValueError: another extension.
    """
    path = Path(path)
    file_format = FORMATS.get(path.suffix.lower())
    if file_format is None:
        raise ValueError(f"{path}: figure format must be one of {', '.join(FORMATS)}")
    atomic_write(path, lambda temporary: figure.savefig(temporary, format=file_format, dpi=dpi))
    return path
