"""The faithfulness table of scores (``evaluate.py --faithfulness``, ``scores["faithfulness"]``) as HTML,
for the run report: one row per attribution method beside the random control."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

# (key of a method's row, column header)
COLUMNS = (
    ("deletion_auc", "deletion area (lower: faithful)"),
    ("insertion_auc", "insertion area (higher: faithful)"),
    ("deletion_gap", "deletion gap to random"),
    ("insertion_gap", "insertion gap to random"),
    ("sanity_spearman", "rank correlation after randomisation"),
    ("grounding_mass", "mass in box"),
    ("pointing", "pointing game (strict)"),
    ("pointing_published", "pointing game (published, mentions)"),
    ("pointing_published_classes", "pointing game (published, all categories)"),
    ("hallucinated_object_mass", "object mass: hallucinated"),
    ("grounded_object_mass", "object mass: grounded"),
)


def _cell(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "<td>&ndash;</td>"
    return f'<td class="number">{value:.3f}</td>'


def faithfulness_html(table: Mapping[str, Any]) -> str:
    """The table of ``scores["faithfulness"]``: a row per method, the random control first; a method the
    sanity check flags is marked."""
    header = "".join(f"<th>{html.escape(title)}</th>" for _, title in COLUMNS)
    random = table.get("random", {})
    rows = [
        "<tr><td>random order (mean of seeds)</td>"
        + _cell(random.get("deletion_auc"))
        + _cell(random.get("insertion_auc"))
        + "<td>&ndash;</td>" * (len(COLUMNS) - 2)
        + "</tr>"
    ]
    for name, row in table.get("methods", {}).items():
        flag = " (flagged: barely changes with the model)" if row.get("sanity_flagged") else ""
        rows.append(
            f"<tr><td>{html.escape(str(name))}{flag}</td>"
            + "".join(_cell(row.get(key)) for key, _ in COLUMNS)
            + "</tr>"
        )
    settings = html.escape(", ".join(f"{k} {v}" for k, v in table.get("settings", {}).items()))
    return (
        f"<h3>Does the map explain the word? ({table.get('images', '?')} images)</h3>"
        f'<table class="faithfulness"><thead><tr><th>method</th>{header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table><p>settings: {settings}</p>"
    )
