"""The faithfulness table of scores (``evaluate.py --faithfulness``, ``scores["faithfulness"]``) as HTML,
for the run report and the faithfulness page (template ``faithfulness_table.html.j2``, every value
escaped).

It shows, for all words and per word class, one row per attribution method beside the random control,
each with its n images and n words and the 95% intervals of its areas and gaps (bootstrap over images,
:mod:`captioning.explain.statistics`); the random control's seeds as their mean and their minimum to
maximum; the paired tests between methods and of each method against the random order, with their
p-values before and after Holm's adjustment; where each method's map peaks at the hallucinated
mentions, beside the grounded ones; and the settings the table was made with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from captioning.visualization.pages import render_page

# (key of a method's row, column header) of the numbers without an interval
PLAUSIBILITY = (
    ("sanity_spearman", "Spearman after the whole cascade"),
    ("sanity_spearman_abs", "Spearman of |map| after the whole cascade"),
    ("sanity_ssim", "SSIM after the whole cascade"),
    ("sanity_hog", "HOG similarity after the whole cascade"),
    ("grounding_mass", "mass in box"),
    ("pointing", "pointing game (strict)"),
    ("pointing_published", "pointing game (published, mentions)"),
    ("pointing_published_classes", "pointing game (published, all categories)"),
    ("hallucinated_object_mass", "object mass: hallucinated"),
    ("grounded_object_mass", "object mass: grounded"),
)
DASH = "\u2013"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value)


def number(value: Any, digits: int = 3) -> str:
    """``value`` to ``digits`` decimals, a dash when it is not a number."""
    found = _number(value)
    return DASH if found is None else f"{found:.{digits}f}"


def interval(values: Any) -> str:
    """``[low, high]`` of a two-number list, a dash otherwise."""
    if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != 2:
        return DASH
    low, high = (_number(v) for v in values)
    return DASH if low is None or high is None else f"[{low:.3f}, {high:.3f}]"


def p_value(value: Any) -> str:
    return number(value, 4)


@dataclass(frozen=True)
class TableRow:
    """One row as the template prints it: every cell a string."""

    name: str
    images: str
    words: str
    cells: list[str]  # deletion, its interval, insertion, its interval, then the gaps' and tests'
    others: list[str]  # the plausibility columns (method rows only)
    flagged: bool = False


def _method_row(name: str, row: Mapping[str, Any]) -> TableRow:
    cells = []
    for curve in ("deletion", "insertion"):
        cells += [number(row.get(f"{curve}_auc")), interval(row.get(f"{curve}_auc_ci"))]
    for curve in ("deletion", "insertion"):
        cells += [
            number(row.get(f"{curve}_gap")),
            interval(row.get(f"{curve}_gap_ci")),
            p_value(row.get(f"{curve}_gap_p")),
            p_value(row.get(f"{curve}_gap_p_holm")),
        ]
    return TableRow(
        str(name),
        number(row.get("images"), 0),
        number(row.get("words"), 0),
        cells,
        [_with_interval(row, key) for key, _ in PLAUSIBILITY],
        bool(row.get("sanity_flagged")),
    )


def _with_interval(row: Mapping[str, Any], key: str) -> str:
    """A plausibility number, with its interval where the row has one (``<key>_ci``)."""
    shown = number(row.get(key), 2 if key.startswith("sanity_") else 3)
    bounds = interval(row.get(f"{key}_ci"))
    return shown if bounds == DASH or shown == DASH else f"{shown} {bounds}"


def _seeds(values: Any) -> str:
    """The random order's per-seed means: their mean and their range, said as such."""
    numbers = (
        [_number(v) for v in values] if isinstance(values, Sequence) and not isinstance(values, str) else []
    )
    if not numbers or any(v is None for v in numbers):
        return DASH
    found = [v for v in numbers if v is not None]
    return (
        f"{sum(found) / len(found):.3f} (min {min(found):.3f}, max {max(found):.3f} over {len(found)} seeds)"
    )


def _random_row(row: Mapping[str, Any]) -> TableRow:
    cells = []
    for curve in ("deletion", "insertion"):
        cells += [number(row.get(f"{curve}_auc")), interval(row.get(f"{curve}_auc_ci"))]
    return TableRow(
        "random order",
        number(row.get("images"), 0),
        number(row.get("words"), 0),
        cells + [DASH] * 8,
        [DASH] * len(PLAUSIBILITY),
    )


def _rows(table: Mapping[str, Any]) -> tuple[list[TableRow], list[str]]:
    """The rows of one table (``methods`` and ``random``, or a word class's rows), and the random
    order's seeds per curve."""
    methods = table.get("methods", {})
    random = table.get("random", {})
    methods = methods if isinstance(methods, Mapping) else {}
    random = random if isinstance(random, Mapping) else {}
    rows = [_random_row(random)] if random else []
    rows += [_method_row(name, row) for name, row in methods.items() if isinstance(row, Mapping)]
    return rows, [_seeds(random.get(f"{curve}_auc_seeds")) for curve in ("deletion", "insertion")]


def _paired(table: Mapping[str, Any]) -> list[list[str]]:
    paired = table.get("paired", [])
    return [
        [
            str(test.get("curve", "")),
            str(test.get("a", "")),
            str(test.get("b", "")),
            number(test.get("a_area")),
            number(test.get("b_area")),
            number(test.get("difference")),
            interval([test.get("ci_low"), test.get("ci_high")]),
            p_value(test.get("p_value")),
            p_value(test.get("p_holm")),
            str(test.get("more_faithful") or "neither (p Holm \u2265 0.05)"),
        ]
        for test in (paired if isinstance(paired, list) else [])
        if isinstance(test, Mapping)
    ]


def _class_rows(table: Mapping[str, Any]) -> list[tuple[str, list[TableRow]]]:
    classes = table.get("by_word_class", {})
    result = []
    for word_class, rows in classes.items() if isinstance(classes, Mapping) else ():
        if not isinstance(rows, Mapping) or not rows:
            continue
        methods = {name: row for name, row in rows.items() if name != "random"}
        result.append((str(word_class), _rows({"methods": methods, "random": rows.get("random", {})})[0]))
    return result


def _setting(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value)
    return str(value)


def _settings(table: Mapping[str, Any]) -> list[tuple[str, str]]:
    settings = table.get("settings", {})
    statistics = table.get("statistics", {})
    pairs = []
    for group in (settings, statistics):
        if isinstance(group, Mapping):
            pairs += [(str(key), _setting(value)) for key, value in group.items()]
    return pairs


def faithfulness_html(table: Mapping[str, Any]) -> str:
    """The tables of ``scores["faithfulness"]`` (see the module docstring) as HTML; a method the
    randomisation test flags (this project's threshold, not Adebayo et al.'s) is marked (a table that
    is not an object shows as an empty one)."""
    table = table if isinstance(table, Mapping) else {}
    rows, seeds = _rows(table)
    statistics = table.get("statistics", {})
    statistics = statistics if isinstance(statistics, Mapping) else {}
    peak_pairs, peak_rows = _peak_rows(table)
    return render_page(
        "faithfulness_table.html.j2",
        images=str(table.get("images", statistics.get("images", "?"))),
        words=str(statistics.get("words", "?")),
        rows=rows,
        seeds=seeds,
        plausibility=[title for _, title in PLAUSIBILITY],
        paired=_paired(table),
        correction=str(statistics.get("correction", "")),
        classes=_class_rows(table),
        peak_pairs=peak_pairs,
        peak_rows=peak_rows,
        settings=_settings(table),
    )


def _peak_rows(table: Mapping[str, Any]) -> tuple[str, list[list[str]]]:
    """The co-occurring classes as text and, per method, where its maps peak at the hallucinated
    mentions beside the grounded ones (:func:`captioning.explain.hallucinated_maps.hallucination_peaks`):
    ``[method, mentions, co-occurring, wrong object, which, nowhere, grounded mentions, on their object,
    on another, nowhere]``; no rows when no mention was hallucinated."""
    peaks = table.get("hallucination_peaks", {})
    methods = peaks.get("methods", {}) if isinstance(peaks, Mapping) else {}
    entries = {name: entry for name, entry in methods.items() if isinstance(entry, Mapping)}
    if not any(entry.get("mentions") for entry in entries.values()):
        return "", []
    rows = []
    for name, entry in entries.items():
        grounded = entry.get("grounded", {})
        which = ", ".join(f"{c} {n}" for c, n in sorted(entry.get("wrong_object_classes", {}).items()))
        rows.append(
            [str(name), *(str(entry.get(key, 0)) for key in ("mentions", "co_occurring", "wrong_object"))]
            + [which, str(entry.get("nowhere", 0))]
            + [str(grounded.get(key, 0)) for key in ("mentions", "named_object", "other_object", "nowhere")]
        )
    pairs = ", ".join(f"{c} beside {d}" for c, d in peaks.get("co_occurring_classes", {}).items())
    return pairs or "none", rows
