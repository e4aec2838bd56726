"""The page of ``evaluate.py --checkpoint C --split S --faithfulness``: ``<name>_faithfulness.html``
beside the scores, one self-contained file.

It holds where the numbers came from (checkpoint, signature), the faithfulness table of the scores
(:func:`captioning.visualization.faithfulness_table.faithfulness_html`: one row per method beside the
random control), and for each explained image (the first ones, up to a number the caller chooses)
a section with its caption, its figure of maps (:func:`method_figure`: one row per method, a panel
per word, each row on its own colour scale) and that image's deletion and insertion areas per
method. The table of images at the top links to each section (``#img3``).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from captioning.utils.files import atomic_write
from captioning.visualization.faithfulness_table import faithfulness_html
from captioning.visualization.method_figures import method_figure
from captioning.visualization.overlay import DEFAULT_CMAP
from captioning.visualization.pages import page_asset, render_page
from captioning.visualization.sanity_figures import sanity_section

_STYLE = page_asset("run_report.css") + "\n" + page_asset("faithfulness_page.css")


@dataclass(frozen=True)
class ExplainedImage:
    """One image of the page.

    Attributes:
        image_id: its id in the split.
        name: what the page calls it (its file name).
        words: the caption's T words.
        maps: method -> (T, P) maps, row-major cells of the grid.
        areas: method (and ``"random"``) -> ``{"deletion_auc", "insertion_auc"}`` of this image
            (the study's ``per_image`` row; empty when it has none).
        boxes: per word, the (x, y, width, height) boxes in the picture's pixels of the objects it
            names (``grounding.word_boxes``), outlined on its maps; empty without boxes.
    """

    image_id: int
    name: str
    words: Sequence[str]
    maps: Mapping[str, np.ndarray]
    areas: Mapping[str, Mapping[str, float]]
    boxes: Sequence[Sequence[tuple[float, float, float, float]]] = field(default_factory=tuple)


@dataclass(frozen=True)
class ImageSection:
    """One image's section as the template prints it (``figure`` is a base64 JPEG)."""

    anchor: str
    image_id: int
    name: str
    caption: str
    methods: list[str]
    figure: str
    rows: list[tuple[str, str, str]]  # (method, deletion area, insertion area), "-" where none
    boxed: list[str]  # the words whose objects' boxes are outlined on their maps


def _area(row: Mapping[str, Any] | None, key: str) -> str:
    value = (row or {}).get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "\u2013"
    return f"{value:.3f}"


def _figure_png(image: Image.Image, item: ExplainedImage, grid: tuple[int, int], mode: str, cmap: str) -> str:
    boxes = item.boxes if len(item.boxes) == len(item.words) else None
    figure = method_figure(image, list(item.words), item.maps, grid, mode, cmap, max_side=160, boxes=boxes)
    buffer = io.BytesIO()
    # JPEG: the overlays do not compress as PNG (about 1 MB a figure of 7 methods), and a page of
    # 20 figures should open in a moment
    figure.savefig(buffer, format="jpeg", dpi=72, pil_kwargs={"quality": 80})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def write_faithfulness_page(
    path: str | Path,
    table: Mapping[str, Any],
    items: Sequence[ExplainedImage],
    images: Sequence[Image.Image],
    grid: tuple[int, int],
    *,
    checkpoint: str | Path | None = None,
    signature: str = "",
    mode: str = "bilinear",
    cmap: str = DEFAULT_CMAP,
    progress: bool = True,
) -> Path:
    """Write the faithfulness page (see the module docstring).

    Args:
        path: the HTML file (written atomically).
        table: ``scores["faithfulness"]`` (:func:`captioning.explain.study.faithfulness_study`).
        items: the images whose maps are drawn, in the page's order.
        images: their pictures, one per item.
        grid: (gh, gw), P = gh * gw.
        checkpoint, signature: where the numbers came from, for the page's head.
        mode, cmap: the overlays' upsampling and colour map.
        progress: a progress bar while the figures are drawn.
    Returns:
        ``path``.
    Raises:
        ValueError: not one picture per item, or a method's maps not one per word.
    """
    if len(items) != len(images):
        raise ValueError(f"{len(items)} explained images but {len(images)} pictures")
    sections = []
    for index, (item, image) in enumerate(
        tqdm(
            list(zip(items, images, strict=True)),
            desc="drawing maps",
            disable=not progress,
            leave=False,
            unit="image",
        )
    ):
        methods = list(item.maps)
        rows = [
            (name, _area(item.areas.get(name), "deletion_auc"), _area(item.areas.get(name), "insertion_auc"))
            for name in [*methods, "random"]
        ]
        sections.append(
            ImageSection(
                anchor=f"img{index}",
                image_id=item.image_id,
                name=item.name,
                caption=" ".join(item.words),
                methods=methods,
                figure=_figure_png(image, item, grid, mode, cmap),
                rows=rows,
                boxed=[word for word, boxes in zip(item.words, item.boxes, strict=False) if boxes],
            )
        )
    facts = [
        ("checkpoint", str(checkpoint) if checkpoint is not None else "(not given)"),
        ("signature", signature or "(none)"),
        ("images explained", str(table.get("images", "?"))),
        ("words explained", str(table.get("statistics", {}).get("words", "?"))),
        ("baseline", str(table.get("baseline", table.get("settings", {}).get("baseline", "?")))),
        ("explained score", str(table.get("settings", {}).get("score", "log_prob"))),
        ("images drawn below", str(len(sections))),
        ("colours", f"{cmap}; each method's row from 0 to its largest value in the figure"),
    ]
    page = render_page(
        "faithfulness_page.html.j2",
        title="Does the map explain the word?",
        facts=facts,
        table_html=faithfulness_html(table),
        sections=sections,
        sanity=sanity_section(table),
        style=_STYLE,
    )
    path = Path(path)
    atomic_write(path, lambda temporary: temporary.write_text(page, encoding="utf-8", errors="replace"))
    return path
