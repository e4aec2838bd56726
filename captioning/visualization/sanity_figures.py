"""The randomisation tests of Adebayo et al. 2018 as figures and page sections: each method's similarity to
its trained maps per stage of the cascade (or of the independent randomisation), one panel per measure,
one line per method, the stages top down from left to right (their Figures 2 and 4, for the words of a
captioner); and the data randomisation test's table.

What the numbers are: :mod:`captioning.explain.sanity` and :mod:`captioning.explain.similarity`.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# measure -> its title in figures and tables
MEASURE_TITLES = {
    "spearman": "Spearman rank correlation",
    "spearman_abs": "Spearman rank correlation of |map|",
    "ssim": "SSIM",
    "hog": "HOG similarity (Pearson)",
}
VARIANT_TITLES = {
    "cascading": "cascading randomisation (each stage adds the next layer group, output layer first)",
    "independent": "independent randomisation (one layer group at a time, the rest trained)",
}
_MARKERS = "osD^vP*Xh"


def _values(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def stage_figure(sanity: Mapping[str, Any], variant: str = "cascading") -> Figure:
    """One panel per measure: each method's similarity (y, -1 to 1) after each stage (x).

    Args:
        sanity: ``scores["faithfulness"]["sanity"]`` (:func:`captioning.explain.sanity.randomisation_test`).
        variant: ``cascading`` or ``independent``.
    Raises:
        ValueError: the table holds no such variant.
    """
    if variant not in sanity:
        raise ValueError(f"the sanity table holds no {variant!r} randomisation")
    stages = list(sanity["stages"])
    curves = sanity[variant]
    figure = Figure(figsize=(3.2 * len(MEASURE_TITLES), 3.6 + 0.06 * max(len(s) for s in stages)))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(MEASURE_TITLES), sharey=True)
    positions = np.arange(len(stages))
    for ax, (measure, title) in zip(axes, MEASURE_TITLES.items(), strict=True):
        for index, (method, curve) in enumerate(curves.items()):
            ax.plot(
                positions,
                _values(curve[measure]),
                marker=_MARKERS[index % len(_MARKERS)],
                linestyle=("-", "--", ":", "-.")[index // len(_MARKERS) % 4],
                label=method,
            )
        ax.axhline(0.0, color="0.6", linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(positions)
        ax.set_xticklabels(stages, rotation=60, ha="right", fontsize=7)
        ax.set_ylim(-1.05, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("similarity to the trained model's maps")
    axes[-1].legend(fontsize=7, loc="lower left")
    figure.suptitle(f"{VARIANT_TITLES.get(variant, variant)}; {sanity.get('words', '?')} words", fontsize=9)
    figure.tight_layout()
    return figure


def figure_jpeg(figure: Figure) -> str:
    """The figure as a base64 JPEG (for a self-contained page)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="jpeg", dpi=80, pil_kwargs={"quality": 85})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass(frozen=True)
class SanitySection:
    """What the page's randomisation section prints.

    Attributes:
        figures: (variant title, base64 JPEG) per variant run.
        stages: (stage, its parameters joined) top down.
        flag: this project's flag: (measure, threshold, the methods it marks).
        data_rows: the data randomisation test, (method, each measure as text), empty without it.
        data_words: the words it compared.
    """

    figures: list[tuple[str, str]]
    stages: list[tuple[str, str]]
    flag: tuple[str, float, list[str]]
    data_rows: list[tuple[str, list[str]]]
    data_words: int


def _number(value: Any) -> str:
    return "\u2013" if not isinstance(value, int | float) or isinstance(value, bool) else f"{value:.3f}"


def sanity_section(table: Mapping[str, Any]) -> SanitySection | None:
    """The section of ``scores["faithfulness"]`` (None when it holds no randomisation test)."""
    sanity = table.get("sanity")
    if not isinstance(sanity, Mapping) or "stages" not in sanity:
        return None
    figures = [
        (VARIANT_TITLES[variant], figure_jpeg(stage_figure(sanity, variant)))
        for variant in ("cascading", "independent")
        if variant in sanity
    ]
    flag = sanity.get("flag", {})
    flagged = [name for name, value in flag.items() if value is True]
    data = table.get("data_randomisation") or {}
    rows = [
        (name, [_number(values.get(measure)) for measure in MEASURE_TITLES])
        for name, values in data.get("methods", {}).items()
    ]
    return SanitySection(
        figures,
        [(stage, ", ".join(sanity["parameters"][stage])) for stage in sanity["stages"]],
        (str(flag.get("measure", "")), float(flag.get("threshold", 0.0)), flagged),
        rows,
        int(data.get("words", 0)),
    )
