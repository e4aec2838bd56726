"""One self-contained HTML page of captions and their attention, plus the figures of the training run.

Every picture is embedded as a ``data:`` URI, so the page is a single file with no external assets.
Each word of a caption is a link; hovering, focusing or clicking it shows that word's attention
map (a precomputed transparent PNG, coloured like the figures) stacked over the image with CSS.
Without any interaction each image shows its first word's map, and a URL fragment such as
``report.html#img0-w2`` selects word 2 of image 0 (this works without JavaScript too).
"""

from __future__ import annotations

import base64
import html
import io
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from captioning.data.images import load_image
from captioning.evaluation.grounding import Instances, WordMatcher, word_boxes
from captioning.utils.files import atomic_write
from captioning.visualization.figures import Box, attention_figure, save_figure, statistics_text
from captioning.visualization.fonts import font_note
from captioning.visualization.overlay import (
    DEFAULT_CMAP,
    attention_statistics,
    colorize,
    display_range,
    display_size,
    upsample_attention,
)
from captioning.visualization.pages import page_asset, render_page

if TYPE_CHECKING:
    from captioning.inference.captioner import Captioned

logger = logging.getLogger(__name__)

VIEWER_STYLE = page_asset("viewer.css")

_BOX_RGBA = (255, 77, 77, 255)

VIEWER_SCRIPT = page_asset("viewer.js")


def _data_uri(pixels: np.ndarray, image_format: str) -> str:
    """(H, W, 3|4) uint8 -> ``data:image/...;base64,...``."""
    buffer = io.BytesIO()
    if image_format == "JPEG":
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    else:
        Image.fromarray(pixels).save(buffer, format="PNG", optimize=False, compress_level=6)
    mime = "image/jpeg" if image_format == "JPEG" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


def _overlay(
    heat: np.ndarray, cmap: str, alpha: float, boxes: Sequence[Box], scale: tuple[float, float]
) -> np.ndarray:
    """(H, W) map in [0, 1] -> (H, W, 4) RGBA overlay, with the named objects' boxes outlined."""
    rgba = colorize(heat, cmap, alpha)
    if boxes:
        picture = Image.fromarray(rgba)
        draw = ImageDraw.Draw(picture)
        line = max(1, round(max(heat.shape) / 150))  # about 2 pixels wide once shown at 300 pixels
        for x, y, w, h in boxes:
            draw.rectangle(
                (x * scale[0], y * scale[1], (x + w) * scale[0], (y + h) * scale[1]),
                outline=_BOX_RGBA,
                width=line,
            )
        rgba = np.asarray(picture)
    return rgba


def item_html(
    index: int,
    item: Captioned,
    grid: tuple[int, int],
    mode: str,
    cmap: str,
    alpha: float,
    max_side: int | None,
    normalize: str = "figure",
    boxes: Instances | None = None,
    map_side: int | None = None,
    note: str = "",
    matcher: WordMatcher | None = None,
) -> str:
    """One image's section: the picture as it is, beside it the picture under one overlay per word
    (shown by its word's link), references.
    ``matcher``: the category-word table that finds each word's boxes, shared by a page's images.

    ``map_side``: the overlays are drawn at most this long (the page stretches them over the
    picture, smoothly), which keeps a page of many images small; None draws them at the picture's size.
    Word ``t``'s overlay has the id ``img{index}-w{t}``; the section's id is ``img{index}``.
    ``note`` (e.g. the image's scores) is added to its heading.
    """
    image = load_image(item.record.path)
    scale = 1.0, 1.0
    width, height = display_size(image.size, max_side)
    if (width, height) != image.size:
        scale = width / image.size[0], height / image.size[1]
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    words = list(item.words)
    map_width, map_height = display_size((width, height), map_side)
    scale = scale[0] * map_width / width, scale[1] * map_height / height
    # (T, h, w): one map per word at the displayed size
    weights = upsample_attention(item.caption.attention, grid, (map_height, map_width), mode, normalize=False)
    tops = [top for _, top in display_range(item.caption.attention, normalize)]
    peaks, entropies = attention_statistics(item.caption.attention)
    named = word_boxes(words, item.record.image_id, boxes, matcher)
    betas = item.caption.betas
    name = html.escape(Path(item.record.path).name)
    photo = _data_uri(np.asarray(image), "JPEG")
    layers = [f'<img class="photo" src="{photo}" alt="{name}">']
    links = []
    for t, word in enumerate(words):
        map_id = f"img{index}-w{t}"
        first = " first" if t == 0 else ""
        label = html.escape(word)
        layers.append(
            f'<img class="map{first}" id="{map_id}" alt="attention for {label}" '
            f'src="{_data_uri(_overlay(weights[t] / tops[t], cmap, alpha, named[t], scale), "PNG")}">'
        )
        tip = statistics_text(peaks[t], entropies[t]) + (
            f", beta={float(betas[t]):.2f}" if betas is not None else ""
        )
        tip = f' title="{html.escape(tip)}"'
        links.append(f'<a class="word" href="#{map_id}" data-map="{map_id}"{tip}>{label}</a>')
    # the words' links joined as the caption is written (no spaces between Chinese or Japanese words)
    separator = " " if item.text == " ".join(words) else ""
    caption = separator.join(links) if links else "<em>(empty caption)</em>"
    references = "".join(f"<li>{html.escape(str(ref))}</li>" for ref in item.record.raw)
    # the image's other captions, ranked (decode.num_return); the overlays are the first one's
    others = "".join(
        f"<li>{html.escape(other.text or '(empty caption)')}</li>" for other in item.alternatives
    )
    return (
        f'<section class="item" id="img{index}">\n'
        f"<h2>{name} &middot; image {item.record.image_id}"
        + (f" &middot; {html.escape(note)}" if note else "")
        + "</h2>\n"
        # the image itself beside its overlays: a colour the overlay darkens can be checked there
        f'<div class="pair">\n<img class="plain" src="{photo}" alt="{name}" '
        f'width="{width}" height="{height}">\n'
        f'<div class="stage" style="width:{width}px;height:{height}px">\n'
        + "\n".join(layers)
        + "\n</div>\n</div>\n"
        f'<p class="caption">{caption}</p>\n'
        + (f'<p>Other captions, ranked:</p>\n<ol class="refs" start="2">{others}</ol>\n' if others else "")
        + (f'<ol class="refs">{references}</ol>\n' if references else "")
        + "</section>"
    )


def write_report(
    items: Sequence[Captioned],
    path: str | Path,
    grid: tuple[int, int],
    mode: str = "bilinear",
    cmap: str = DEFAULT_CMAP,
    alpha: float = 0.6,
    max_side: int | None = 384,
    title: str = "Where the model looked",
    attention_label: str = "",
    normalize: str = "figure",
    boxes: Instances | None = None,
) -> Path:
    """Write one self-contained HTML page: each image, its caption word by word, its references.

    Args:
        items: decoded images (``Captioned``: ``record`` with ``path``, ``image_id`` and ``raw``
            references, ``caption`` with ``attention`` (T, P) and ``betas``, and the T ``words``).
        path: the HTML file to write (its folder is created).
        grid: (gh, gw), the attention grid of the model that produced the captions.
        mode: ``bilinear`` or ``gaussian`` upsampling.
        cmap: matplotlib colour map of the overlays.
        alpha: opacity of the overlays.
        max_side: images are embedded scaled down to this longer side (None: full size).
        attention_label: which map is shown (e.g. ``layer 3 of 3, mean of 8 heads``); empty says nothing.
        normalize: ``figure``, ``absolute`` or ``word``: the colour scale of each image's maps (as in
            ``attention_figure``); a word's tooltip gives its peak weight and entropy.
        boxes: ground-truth boxes; a word's map outlines the boxes of the objects it names.
    Returns:
        ``path``. Word ``t`` of item ``i`` can be selected with the fragment ``#img{i}-w{t}``.
    """
    path = Path(path)
    matcher = WordMatcher()  # one table of category words for every image
    sections = [
        item_html(i, item, grid, mode, cmap, alpha, max_side, normalize, boxes, matcher=matcher)
        for i, item in enumerate(items)
    ]
    page = render_page(
        "attention_page.html.j2",
        title=title,
        attention_label=attention_label,
        sections=sections,
        style=VIEWER_STYLE,
        script=VIEWER_SCRIPT,
    )
    # Lone surrogates (from a caption file's "\\ud800" escapes) cannot be UTF-8: written as "?".
    atomic_write(path, lambda temporary: temporary.write_text(page, encoding="utf-8", errors="replace"))
    return path


def write_figures(
    items: Sequence[Captioned],
    figures_dir: str | Path,
    grid: tuple[int, int],
    mode: str = "bilinear",
    suffix: str = ".png",
    names: Sequence[str] | None = None,
    progress: bool = False,
    attention_label: str = "",
    normalize: str = "figure",
    cmap: str = DEFAULT_CMAP,
    boxes: Instances | None = None,
) -> list[tuple[Path, int]]:
    """One attention figure per item, references under it; ``figures_dir/<name><suffix>``.

    Args:
        suffix: ``.png``, ``.pdf`` or ``.svg``.
        names: file names without suffix, one per item (default: the image ids).
        progress: show a progress bar.
        attention_label: which map the figures show, printed under each caption (see ``attention_figure``).
        normalize, cmap: the colour scale and map (see ``attention_figure``).
        boxes: ground-truth boxes; each word's panel outlines the boxes of the objects it names.
    Returns:
        (file, panels) of each figure, in the order of ``items``.
    """
    figures_dir = Path(figures_dir)
    note = font_note(text for item in items for text in (item.text, *item.record.raw))
    if note:
        logger.warning(note)
    matcher = WordMatcher()
    written = []
    for k, item in enumerate(tqdm(items, desc="figures", disable=not progress, leave=False, unit="image")):
        image = load_image(item.record.path)
        result = attention_figure(
            image,
            item.words,
            item.caption.attention,
            grid,
            betas=item.caption.betas,
            references=list(item.record.raw),
            mode=mode,
            attention_label=attention_label,
            normalize=normalize,
            cmap=cmap,
            boxes=word_boxes(item.words, item.record.image_id, boxes, matcher),
            text=item.text,
            alternatives=[other.text for other in item.alternatives],
        )
        name = (names[k] if names is not None else str(item.record.image_id)) + suffix
        written.append((save_figure(result.figure, figures_dir / name), result.panels))
    return written
