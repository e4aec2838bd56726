"""The page a researcher opens after a run: ``report.html``, one self-contained file.

It holds, in order: where the numbers came from (the checkpoint, the signature of the scores and
the run's configuration), the test scores with attention grounding and CHAIR, the training and
validation curves per epoch, and a table of the test images, sortable by each per-image score
(a column's first click sorts worst first: lowest CIDEr-D or grounding, highest CHAIR). Each
row's image opens its caption word by word, each word showing the attention map that produced it
(as in :func:`captioning.visualization.report.write_report`). A URL fragment ``#img3`` opens image
3, and ``#img3-w1`` its word 1; both work without JavaScript.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from captioning.evaluation.grounding import Instances, WordMatcher
from captioning.utils.files import atomic_write
from captioning.visualization.overlay import DEFAULT_CMAP
from captioning.visualization.pages import page_asset, render_page
from captioning.visualization.report import VIEWER_SCRIPT, VIEWER_STYLE, item_html

if TYPE_CHECKING:
    from captioning.inference.captioner import Captioned

# Per-image columns of the table, when the scores hold them: (field, header, worst first by a first click).
COLUMNS = (
    ("CIDEr-D", "CIDEr-D", "ascending"),
    ("grounding-mass", "grounding mass", "ascending"),
    ("grounding-pointing", "pointing", "ascending"),
    ("CHAIR-i", "CHAIR-i", "descending"),
    ("CHAIR-s", "CHAIR-s", "descending"),
)
# Epoch history keys that are not curves.
_NOT_CURVES = frozenset(["stage", "epoch", "seconds", "lr"])

_STYLE = page_asset("run_report.css")

_TABLE_SCRIPT = page_asset("run_report.js")


def _number(value: Any) -> float | None:
    return (
        float(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


def curves_png(history: Sequence[Mapping[str, Any]]) -> bytes:
    """Training and validation curves per epoch as one PNG (empty without epochs).

    Losses (keys naming a loss, cross-entropy or penalty) on the left, every other number (the
    validation scores, SCST's reward) on the right; a dotted line marks where a stage begins.

    Args:
        history: the ``epochs`` of ``history.json``: ``{"stage", "epoch", "train_loss", "val_CIDEr-D", ...}``.
    """
    if not history:
        return b""
    keys = curve_keys(history)
    losses = [key for key in keys if any(word in key for word in ("loss", "cross_entropy", "penalty"))]
    panels = [("loss", losses), ("validation scores and rewards", [key for key in keys if key not in losses])]
    figure = Figure(figsize=(10, 3.4))
    FigureCanvasAgg(figure)
    for position, (title, names) in enumerate(panels, start=1):
        ax = figure.add_subplot(1, 2, position)
        for name in names:
            values = ((x, _number(record.get(name))) for x, record in enumerate(history, start=1))
            points = [(x, y) for x, y in values if y is not None]
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=3, label=name)
        for x in range(1, len(history)):
            if history[x].get("stage") != history[x - 1].get("stage"):
                ax.axvline(x + 0.5, color="#888", linestyle=":", linewidth=1)
                ax.text(
                    x + 0.55,
                    1.0,
                    str(history[x].get("stage", "")),
                    transform=ax.get_xaxis_transform(),
                    fontsize=8,
                    va="top",
                    color="#555",
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("epoch (all stages)", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        if names:
            ax.legend(fontsize=7)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def curve_keys(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The history's keys that are drawn as curves, in their first appearance's order."""
    return [
        key
        for key in dict.fromkeys(k for record in history for k in record)
        if key not in _NOT_CURVES and any(_number(record.get(key)) is not None for record in history)
    ]


def _history_html(history: Sequence[Mapping[str, Any]]) -> str:
    """The curves as a PNG, and their numbers in a table under it."""
    if not history:
        return '<p class="note">no epoch history</p>'
    keys = curve_keys(history)
    picture = base64.b64encode(curves_png(history)).decode("ascii")
    head = "".join(f"<th>{html.escape(key)}</th>" for key in ["stage", "epoch", *keys])
    rows = "".join(
        "<tr>" + f"<td>{html.escape(str(record.get('stage', '')))}</td>"
        f"<td>{html.escape(str(record.get('epoch', '')))}</td>"
        + "".join(_cell(record.get(key)) for key in keys)
        + "</tr>"
        for record in history
    )
    return (
        '<img class="curves" alt="training and validation curves per epoch" '
        f'src="data:image/png;base64,{picture}">'
        f'<details><summary>the numbers</summary><table class="epochs"><thead><tr>{head}</tr></thead>'
        f"<tbody>{rows}</tbody></table></details>"
    )


def _scores_html(scores: Mapping[str, Any], images: int) -> str:
    from captioning.evaluation.runner import summary_lines

    table = scores.get("table") or "\n".join(f"{k}: {v}" for k, v in scores.items() if _number(v) is not None)
    lines = summary_lines(scores, images) if "signature" in scores else []
    return f"<pre>{html.escape(table)}\n\n" + html.escape("\n".join(lines)) + "</pre>"


def _cell(value: Any) -> str:
    number = _number(value)
    if number is None:
        return '<td class="number" data-value="">&ndash;</td>'
    return f'<td class="number" data-value="{number!r}">{number:.3f}</td>'


def _scores_note(scores: Mapping[str, Any]) -> str:
    """An opened image's scores, for its heading: ``CIDEr-D 1.420, grounding mass 0.150, ...``."""
    return ", ".join(
        f"{header} {_number(scores[key]):.3f}"
        for key, header, _ in COLUMNS
        if _number(scores.get(key)) is not None
    )


def _table_html(items: Sequence[Captioned], per_image: Mapping[int, Mapping[str, Any]]) -> str:
    columns = [
        (key, header, worst)
        for key, header, worst in COLUMNS
        if any(key in per_image.get(item.record.image_id, {}) for item in items)
    ]
    head = "".join(
        f'<th data-worst="{worst}"><button type="button">{html.escape(header)}</button></th>'
        for _, header, worst in columns
    )
    rows = []
    for index, item in enumerate(items):
        scores = per_image.get(item.record.image_id, {})
        name = html.escape(Path(item.record.path).name)
        hallucinated = ", ".join(map(str, scores.get("hallucinated", [])))
        rows.append(
            f'<tr data-index="{index}"><td><a href="#img{index}">{name}</a></td>'
            f"<td>{html.escape(item.text) or '<em>(empty caption)</em>'}</td>"
            + "".join(_cell(scores.get(key)) for key, _, _ in columns)
            + f"<td>{html.escape(hallucinated)}</td></tr>"
        )
    return (
        '<table class="images">\n<thead><tr><th>image</th><th>caption</th>'
        + head
        + "<th>hallucinated</th></tr></thead>\n<tbody>\n"
        + "\n".join(rows)
        + "\n</tbody>\n</table>"
    )


def write_run_report(
    path: str | Path,
    items: Sequence[Captioned],
    grid: tuple[int, int],
    scores: Mapping[str, Any],
    *,
    config_text: str = "",
    checkpoint: str | Path | None = None,
    history: Sequence[Mapping[str, Any]] = (),
    boxes: Instances | None = None,
    attention_label: str = "",
    total_images: int | None = None,
    mode: str = "bilinear",
    cmap: str = DEFAULT_CMAP,
    normalize: str = "figure",
    max_side: int | None = 256,
    map_side: int | None = 96,
    title: str = "Run report",
) -> Path:
    """Write the run's ``report.html`` (see the module docstring).

    Args:
        path: the HTML file (written atomically; its folder is created).
        items: the decoded test images shown (``Captioned``, with attention (T, P)).
        grid: (gh, gw), the model's attention grid.
        scores: the test scores (``score_captioned``: overall numbers, ``table``, ``signature`` and
            ``per_image`` entries with CIDEr-D, grounding and CHAIR per image).
        config_text: the run's ``config.yaml``.
        checkpoint: the checkpoint the scores came from.
        history: the ``epochs`` of ``history.json``, for the curves.
        boxes: ground-truth boxes; each word's map outlines the objects it names.
        attention_label: which attention map is shown (``describe_attention``).
        total_images: how many images were scored, when ``items`` are only the first of them.
        mode, cmap, normalize: the overlays' upsampling, colour map and scale (as for the figures).
        max_side, map_side: longest side of the embedded pictures and of their attention overlays.
    Returns:
        ``path``.
    """
    path = Path(path)
    per_image = {
        entry["image_id"]: entry
        for entry in scores.get("per_image", [])
        if isinstance(entry, Mapping) and "image_id" in entry
    }
    scored = total_images if total_images is not None else len(per_image) or len(items)
    facts = [
        ("checkpoint", str(checkpoint) if checkpoint is not None else "(not given)"),
        ("signature", str(scores.get("signature", "(none)"))),
        ("test images", f"{scored} scored, {len(items)} shown below"),
        ("attention", attention_label or "(the decoder's only map)"),
        ("colours", f"{cmap}, scale: {normalize}"),
    ]
    matcher = WordMatcher()  # one table of category words for every image
    sections = [
        item_html(
            i,
            item,
            grid,
            mode,
            cmap,
            0.6,
            max_side,
            normalize,
            boxes,
            map_side,
            _scores_note(per_image.get(item.record.image_id, {})),
            matcher,
        )
        for i, item in enumerate(items)
    ]
    page = render_page(
        "run_report.html.j2",
        title=title,
        facts=facts,
        config_text=config_text,
        scores_html=_scores_html(scores, scored),
        history_html=_history_html(history),
        table_html=_table_html(items, per_image),
        sections=sections,
        viewer_style=VIEWER_STYLE,
        style=_STYLE,
        viewer_script=VIEWER_SCRIPT,
        script=_TABLE_SCRIPT,
    )
    # Lone surrogates (from a caption file's "\\ud800" escapes) cannot be UTF-8: written as "?".
    atomic_write(path, lambda temporary: temporary.write_text(page, encoding="utf-8", errors="replace"))
    return path
