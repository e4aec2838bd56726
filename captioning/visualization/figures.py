"""Attention figures in the style of Show, Attend and Tell: the image, then one overlay per word.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot state, no window,
safe in threads, on servers and in notebooks (a ``Figure`` displays itself in Jupyter).
"""

from __future__ import annotations

import contextlib
import logging
import math
import textwrap
import unicodedata
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from matplotlib import font_manager, rcParams
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colorbar import Colorbar
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.ft2font import FT2Font
from matplotlib.patches import Rectangle
from PIL import Image
from torch import Tensor

from captioning.utils.files import atomic_write
from captioning.utils.text import printable
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
# Fonts with Chinese, Japanese and Korean glyphs, used (when installed) for the characters the default
# font lacks: captions of data.tokenizer characters or whitespace are drawn, not shown as empty boxes.
CJK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK KR",
    "Source Han Sans SC",
    "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
    "AR PL UMing CN",
)


@lru_cache(maxsize=1)
def font_families() -> tuple[str, ...]:
    """The fonts figure text is drawn with: matplotlib's default, then each installed ``CJK_FONTS`` font,
    which matplotlib falls back to glyph by glyph."""
    installed = {font.name for font in font_manager.fontManager.ttflist}
    return (*rcParams["font.sans-serif"][:1], *(name for name in CJK_FONTS if name in installed))


FONT_FIX = (
    "install a font for them (Debian: apt install fonts-noto-cjk), then delete matplotlib's font cache "
    "(rm -r ~/.cache/matplotlib) so that it is found (docs/own-data.md)"
)


@contextlib.contextmanager
def quiet_fonts() -> Iterator[None]:
    """Keep matplotlib's font noise off stderr while drawing: a ``Glyph ... missing`` warning per
    character and a ``findfont: ...`` line per family it cannot find (``font_note`` says it once)."""
    font_log = logging.getLogger("matplotlib.font_manager")
    level = font_log.level
    font_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
            yield
    finally:
        font_log.setLevel(level)


@lru_cache(maxsize=1)
def _drawn_characters() -> frozenset[int]:
    """The code points some font of ``font_families()`` has a glyph for."""
    drawn: set[int] = set()
    with quiet_fonts():
        for family in font_families():
            try:
                path = font_manager.findfont(FontProperties(family=family), fallback_to_default=False)
                drawn.update(FT2Font(path).get_charmap())
            except (ValueError, OSError, RuntimeError):  # not found, or a file FreeType cannot read
                continue
    return frozenset(drawn)


def missing_characters(texts: Iterable[str]) -> str:
    """The characters of ``texts`` that no figure font draws (they show as empty boxes), each once."""
    drawn = _drawn_characters()
    missing: dict[str, None] = {}
    for text in texts:
        for character in text:
            if ord(character) not in drawn and unicodedata.category(character)[0] not in "ZC":
                missing.setdefault(character)
    return "".join(missing)


def font_note(texts: Iterable[str]) -> str | None:
    """One warning line when figures would draw some characters of ``texts`` as empty boxes, with the
    fix; None when every character has a font."""
    missing = missing_characters(texts)
    if not missing:
        return None
    shown = missing[:8] + ("..." if len(missing) > 8 else "")
    return (
        f"warning: {len(missing)} characters of these captions ({shown}) are in no installed font, so "
        f"the figures draw them as empty boxes: {FONT_FIX}"
    )


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
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    if len(attention) != len(words):
        raise ValueError(f"{len(words)} words but {len(attention)} attention maps")
    beta_values = None if betas is None else np.asarray(betas, dtype=np.float64).reshape(-1)
    if beta_values is not None and len(beta_values) != len(words):
        raise ValueError(f"{len(words)} words but {len(beta_values)} betas")
    if boxes is not None and len(boxes) != len(words):
        raise ValueError(f"{len(words)} words but {len(boxes)} lists of boxes")
    ranges = display_range(attention, normalize)
    colours = colour_map(cmap)

    width, height = display_size(image.size, max_side)
    picture = image.convert("RGB")
    scale_x, scale_y = width / picture.size[0], height / picture.size[1]
    if (width, height) != picture.size:
        picture = picture.resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.asarray(picture)  # (H, W, 3) uint8
    weights = upsample_attention(attention, grid, (height, width), mode, normalize=False)  # (T, H, W)
    peaks, entropies = attention_statistics(attention)  # (T,), (T,)
    tops = np.array([top for _, top in ranges], dtype=np.float32).reshape(-1, 1, 1)  # (T, 1, 1)
    maps = np.clip(weights / tops, 0.0, 1.0) if len(words) else weights  # (T, H, W)

    panels = len(words) + 1
    ncols = min(columns, panels)
    nrows = math.ceil(panels / ncols)
    aspect = min(max(height / width, 0.25), 4.0)
    panel_height = _PANEL_WIDTH * aspect
    # A vocabulary's words are data: control characters, line breaks and lone surrogates drawn as escapes.
    caption = printable(" ".join(words) if text is None else text) or "(empty caption)"
    titles = [
        _wrap(caption, _PANEL_WIDTH, _TITLE_SIZE)
        + (_wrap(f"(attention: {attention_label})", _PANEL_WIDTH, _TITLE_SIZE) if attention_label else [])
    ]
    for t, word in enumerate(map(printable, words)):
        title = word if beta_values is None else f"{word} (beta={beta_values[t]:.2f})"
        titles.append(_wrap(title, _PANEL_WIDTH, _TITLE_SIZE))
    title_heights = [
        0.08 + _TITLE_LINE * max(len(titles[i]) for i in range(r * ncols, min(panels, (r + 1) * ncols)))
        for r in range(nrows)
    ]
    stats_height = _STATS_LINE if words else 0.0
    bar_width = _COLORBAR_SPACE if words else 0.0

    figure_width = 2 * _MARGIN + ncols * _PANEL_WIDTH + (ncols - 1) * _GAP + bar_width
    reference_lines = []
    if alternatives:
        reference_lines.append("Other captions, ranked:")
        for rank, other in enumerate(alternatives, 2):
            wrapped = _wrap(
                f"{rank}. " + printable(str(other)), figure_width - 2 * _MARGIN - 0.2, _REFERENCE_SIZE
            )
            reference_lines.extend([wrapped[0], *("   " + line for line in wrapped[1:])])
    if references:
        reference_lines.append("References:")
        for reference in references:
            wrapped = _wrap(printable(str(reference)), figure_width - 2 * _MARGIN - 0.2, _REFERENCE_SIZE)
            reference_lines.extend(["- " + wrapped[0], *("  " + line for line in wrapped[1:])])
    reference_height = _TEXT_LINE * len(reference_lines) + (0.1 if reference_lines else 0.0)
    figure_height = (
        2 * _MARGIN
        + sum(title_heights)
        + nrows * (panel_height + stats_height)
        + (nrows - 1) * _GAP
        + reference_height
    )

    figure = Figure(figsize=(figure_width, figure_height))
    FigureCanvasAgg(figure)
    axes = []
    top = figure_height - _MARGIN  # inches from the bottom
    first_row_bottom = top
    for row in range(nrows):
        top -= title_heights[row]
        bottom = top - panel_height
        first_row_bottom = bottom if row == 0 else first_row_bottom
        for column in range(ncols):
            index = row * ncols + column
            if index >= panels:
                break
            left = _MARGIN + column * (_PANEL_WIDTH + _GAP)
            ax = figure.add_axes(
                (
                    left / figure_width,
                    bottom / figure_height,
                    _PANEL_WIDTH / figure_width,
                    panel_height / figure_height,
                )
            )
            ax.imshow(pixels, interpolation="antialiased")  # aspect kept; extreme shapes letterbox
            if index > 0:
                t = index - 1
                vmin, vmax = ranges[t]
                ax.imshow(
                    weights[t],
                    cmap=colours,
                    norm=Normalize(vmin, vmax),
                    alpha=alpha,
                    interpolation="antialiased",
                )
                ax.text(
                    0.5,
                    -0.02,
                    statistics_text(peaks[t], entropies[t]),
                    transform=ax.transAxes,
                    ha="center",
                    va="top",
                    fontsize=_STATS_SIZE,
                )
                for x, y, w, h in boxes[t] if boxes is not None else ():
                    ax.add_patch(
                        Rectangle(
                            (x * scale_x, y * scale_y),
                            w * scale_x,
                            h * scale_y,
                            fill=False,
                            edgecolor=BOX_COLOUR,
                            linewidth=1.5,
                            linestyle="--",
                        )
                    )
            ax.set_title(
                _plain("\n".join(titles[index])), fontsize=_TITLE_SIZE, pad=3, fontfamily=font_families()
            )
            ax.set_axis_off()
            axes.append(ax)
        top = bottom - stats_height - _GAP
    colorbar = None
    if words:
        bar_axes = figure.add_axes(
            (
                (figure_width - _MARGIN - bar_width + _GAP) / figure_width,  # beside row 1
                first_row_bottom / figure_height,
                _COLORBAR_WIDTH / figure_width,
                panel_height / figure_height,
            )
        )
        bar_range = (0.0, 1.0) if normalize == "word" else ranges[0]
        colorbar = figure.colorbar(ScalarMappable(Normalize(*bar_range), colours), cax=bar_axes)
        colorbar.set_label(
            wrapped_label(_COLORBAR_LABELS[normalize], panel_height, _STATS_SIZE), fontsize=_STATS_SIZE
        )
        colorbar.ax.tick_params(labelsize=_STATS_SIZE)
    if reference_lines:
        figure.text(
            _MARGIN / figure_width,
            (_MARGIN + reference_height) / figure_height,
            _plain("\n".join(reference_lines)),
            fontsize=_REFERENCE_SIZE,
            va="top",
            ha="left",
            linespacing=1.3,
            fontfamily=font_families(),
        )
    return FigureResult(
        figure,
        maps,
        (width, height),
        panels,
        nrows,
        ncols,
        axes,
        normalize,
        ranges,
        peaks,
        entropies,
        colorbar,
    )


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
