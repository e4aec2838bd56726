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
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from captioning.evaluation.grounding import Instances, WordMatcher
from captioning.utils.files import atomic_write
from captioning.visualization.faithfulness_table import faithfulness_html
from captioning.visualization.overlay import DEFAULT_CMAP
from captioning.visualization.pages import page_asset, render_page
from captioning.visualization.report import VIEWER_SCRIPT, VIEWER_STYLE, item_html

if TYPE_CHECKING:
    from captioning.inference.captioner import Captioned

# Per-image columns of the table, when the scores hold them: (field, header, worst first by a first click).
COLUMNS = (
    ("CIDEr-D", "CIDEr-D", "ascending"),
    ("grounding-mass", "grounding mass", "ascending"),
    ("grounding-pointing", "pointing (strict)", "ascending"),
    ("grounding-pointing-published", "pointing (published)", "ascending"),
    ("CHAIR-i", "CHAIR-i", "descending"),
    ("CHAIR-s", "CHAIR-s", "descending"),
    ("attribute-precision", "attribute precision", "ascending"),
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


# Each curve of a panel: a line style and a marker of its own, so that curves that coincide both show.
_CURVE_STYLES = (
    ("-", "o"),
    ("--", "s"),
    (":", "^"),
    ("-.", "D"),
    ((0, (5, 1, 1, 1)), "v"),
    ((0, (1, 1)), "x"),
    ((0, (8, 2)), "+"),
)

# Validation metrics on a 0-10 scale (CIDEr-D reaches 5 and more); the others lie in [0, 1].
_WIDE_SCALE = ("CIDEr",)


def curve_panels(
    history: Sequence[Mapping[str, Any]], penalty_weight: float | None = None
) -> list[tuple[str, list[tuple[str, str, str | None]]]]:
    """The panels of the curves: one per quantity and scale, as (title, [(label, key, stage)]), a curve
    drawing ``key`` on the epochs of ``stage`` (None: every epoch).

    The cross-entropy stage's losses, the attention penalty weighted as the loss adds it (only when
    its weight is above 0: ``penalty_weight``, else read from the history as loss - cross-entropy),
    the self-critical stage's loss and rewards (its loss is a policy-gradient surrogate, negative as
    often as not: never on the cross-entropy axis), and the validation scores split by scale.
    """
    keys = curve_keys(history)
    stages = {record.get("stage") for record in history}
    panels: list[tuple[str, list[tuple[str, str, str | None]]]] = []
    if "xe" in stages:
        xe: list[tuple[str, str, str | None]] = [
            (key.removeprefix("train_"), key, "xe")
            for key in ("train_loss", "train_cross_entropy")
            if key in keys
        ]
        if xe:
            panels.append(("cross-entropy stage: loss", xe))
        weighted = penalty_weight if penalty_weight is not None else _inferred_weight(history)
        if "train_attention_penalty" in keys and weighted:
            label = (
                f"{weighted:g} x attention penalty" if penalty_weight is not None else "loss - cross-entropy"
            )
            panels.append(("attention penalty, as weighted in the loss", [(label, "weighted_penalty", "xe")]))
    if "scst" in stages:
        scst: list[tuple[str, str, str | None]] = [
            (key.removeprefix("train_"), key, "scst")
            for key in ("train_loss", "train_reward", "train_baseline")
            if key in keys
        ]
        if scst:
            panels.append(("self-critical stage: loss and reward", scst))
    wide = [k for k in keys if k.startswith("val_") and k.removeprefix("val_").startswith(_WIDE_SCALE)]
    narrow = [k for k in keys if k.startswith("val_") and k not in wide]
    if wide:
        panels.append(
            (
                "validation " + ", ".join(k.removeprefix("val_") for k in wide),
                [(k[4:], k, None) for k in wide],
            )
        )
    if narrow:
        panels.append(("validation scores in [0, 1]", [(k[4:], k, None) for k in narrow]))
    listed = {key for _, curves in panels for _, key, _ in curves} | {"train_attention_penalty"}
    rest = [key for key in keys if key not in listed and key not in ("train_loss", "train_cross_entropy")]
    if rest:
        panels.append(("other numbers", [(key, key, None) for key in rest]))
    return panels


def _inferred_weight(history: Sequence[Mapping[str, Any]]) -> float:
    """Whether the history's cross-entropy losses hold a weighted penalty: their largest
    loss - cross-entropy (0 when the penalty's weight was 0)."""
    gaps = [
        (_number(r.get("train_loss")) or 0.0) - (_number(r.get("train_cross_entropy")) or 0.0)
        for r in history
        if r.get("stage") == "xe" and _number(r.get("train_cross_entropy")) is not None
    ]
    return max(gaps, default=0.0) if max(gaps, default=0.0) > 1e-9 else 0.0


def _value(record: Mapping[str, Any], key: str, penalty_weight: float | None) -> float | None:
    if key != "weighted_penalty":
        return _number(record.get(key))
    if penalty_weight is not None:
        raw = _number(record.get("train_attention_penalty"))
        return None if raw is None else penalty_weight * raw
    loss, cross_entropy = _number(record.get("train_loss")), _number(record.get("train_cross_entropy"))
    return None if loss is None or cross_entropy is None else loss - cross_entropy


def curves_png(history: Sequence[Mapping[str, Any]], penalty_weight: float | None = None) -> bytes:
    """Training and validation curves per epoch as one PNG (``curves_figure``; empty without epochs)."""
    if not history:
        return b""
    buffer = io.BytesIO()
    curves_figure(history, penalty_weight).savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def curves_figure(history: Sequence[Mapping[str, Any]], penalty_weight: float | None = None) -> Figure:
    """Training and validation curves per epoch: one panel per quantity and scale (``curve_panels``),
    each legend below its panel, a dotted line where a stage begins; each curve of a panel has its
    own line style and marker, and a panel of one stage spans that stage's epochs.

    Args:
        history: the ``epochs`` of ``history.json`` (at least one): ``{"stage", "epoch", "train_loss",
            "val_CIDEr-D", ...}``.
        penalty_weight: the doubly stochastic penalty's weight (``model.decoder.doubly_stochastic``).
    """
    panels = curve_panels(history, penalty_weight)
    columns = min(3, max(1, len(panels)))
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(4.2 * columns, 3.6 * rows))
    FigureCanvasAgg(figure)
    for position, (title, curves) in enumerate(panels, start=1):
        ax = figure.add_subplot(rows, columns, position)
        for (label, key, stage), (line, marker) in zip(curves, itertools.cycle(_CURVE_STYLES), strict=False):
            values = (
                (x, _value(record, key, penalty_weight))
                for x, record in enumerate(history, start=1)
                if stage is None or record.get("stage") == stage
            )
            points = [(x, y) for x, y in values if y is not None]
            # a line style and hollow marker each: curves that coincide (BLEU-4 and NLTK's) both show
            ax.plot(
                [x for x, _ in points],
                [y for _, y in points],
                linestyle=line,
                marker=marker,
                markersize=4,
                markerfacecolor="none" if marker != "o" else None,
                label=label,
            )
        for x in range(1, len(history)):
            if history[x].get("stage") != history[x - 1].get("stage"):
                ax.axvline(x + 0.5, color="#888", linestyle=":", linewidth=1)
        ax.set_title(title, fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        # a stage's own panel spans that stage's epochs, not the whole run's
        stages = {stage for _, _, stage in curves}
        shown = [
            x for x, record in enumerate(history, start=1) if None in stages or record.get("stage") in stages
        ]
        ax.set_xlim(min(shown) - 0.5, max(shown) + 0.5)
        ax.set_xlabel("epoch (all stages)" if None in stages else "epoch of the run", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    figure.tight_layout()
    return figure


def curve_keys(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The history's keys that are drawn as curves, in their first appearance's order."""
    return [
        key
        for key in dict.fromkeys(k for record in history for k in record)
        if key not in _NOT_CURVES and any(_number(record.get(key)) is not None for record in history)
    ]


def _history_html(history: Sequence[Mapping[str, Any]], penalty_weight: float | None = None) -> str:
    """The curves as a PNG, and their numbers in a table under it."""
    if not history:
        return '<p class="note">no epoch history</p>'
    keys = curve_keys(history)
    picture = base64.b64encode(curves_png(history, penalty_weight)).decode("ascii")
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
    faithfulness = faithfulness_html(scores["faithfulness"]) if "faithfulness" in scores else ""
    return f"<pre>{html.escape(table)}\n\n" + html.escape("\n".join(lines)) + "</pre>" + faithfulness


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
    # The page opens sorted by the first column, worst first, as a first click on it sorts.
    order = list(range(len(items)))
    if columns:
        key, _, worst = columns[0]
        sign = 1 if worst == "ascending" else -1

        def worst_first(index: int) -> tuple[bool, float, int]:
            value = _number(per_image.get(items[index].record.image_id, {}).get(key))
            return value is None, 0.0 if value is None else sign * value, index  # unscored ones last

        order.sort(key=worst_first)
    head = "".join(
        f'<th data-worst="{worst}"' + (f' aria-sort="{worst}"' if k == 0 else "") + ">"
        f'<button type="button">{html.escape(header)}</button></th>'
        for k, (_, header, worst) in enumerate(columns)
    )
    # CHAIR's hallucinated objects need object annotations: without them the column is left out.
    hallucination = any("hallucinated" in per_image.get(item.record.image_id, {}) for item in items)
    # Phrases whose colour, size or object is not in the image, when the boxes annotate attributes.
    phrases = any("wrong-phrases" in per_image.get(item.record.image_id, {}) for item in items)
    rows = []
    for index in order:
        item = items[index]
        scores = per_image.get(item.record.image_id, {})
        name = html.escape(Path(item.record.path).name)
        hallucinated = ", ".join(map(str, scores.get("hallucinated", [])))
        wrong = ", ".join(map(str, scores.get("wrong-phrases", [])))
        rows.append(
            f'<tr data-index="{index}"><td><a href="#img{index}">{name}</a></td>'
            f"<td>{html.escape(item.text) or '<em>(empty caption)</em>'}</td>"
            + "".join(_cell(scores.get(key)) for key, _, _ in columns)
            + (f"<td>{html.escape(hallucinated)}</td>" if hallucination else "")
            + (f"<td>{html.escape(wrong)}</td>" if phrases else "")
            + "</tr>"
        )
    missing = (
        ""
        if hallucination
        else '<p class="note">No "hallucinated" column: CHAIR names the objects a caption invents from the '
        "images' object annotations (instances), and this dataset has none.</p>\n"
    )
    return (
        missing
        + '<table class="images">\n<thead><tr><th>image</th><th>caption</th>'
        + head
        + ("<th>hallucinated</th>" if hallucination else "")
        + ("<th>wrong phrases</th>" if phrases else "")
        + "</tr></thead>\n<tbody>\n"
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
    penalty_weight: float | None = None,
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
        history_html=_history_html(history, penalty_weight),
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
