"""Hostile values in a faithfulness table handed to the run report or the faithfulness page (the
images' count, method and class names, settings, tests): every one is shown as text, no script or
event handler of theirs is live in the page."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import numpy as np
from PIL import Image

from captioning.visualization.faithfulness_page import ExplainedImage, write_faithfulness_page
from captioning.visualization.run_report import write_run_report

SCRIPT = "<script>alert(1)</script>"
HANDLER = '"><img src=x onerror=alert(2)>'


class Elements(HTMLParser):
    """The page's script elements and event-handler attributes, as a browser parses them."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.handlers: list[tuple[str, str | None]] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handlers += [(name, value) for name, value in attrs if name.startswith("on")]
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


def hostile_table() -> dict:
    row = {
        "deletion_auc": 0.2, "insertion_auc": 0.6,
        "deletion_auc_ci": [0.1, 0.3], "insertion_auc_ci": [0.5, 0.7],
        "deletion_gap": 0.3, "insertion_gap": 0.2, "words": 5, "images": SCRIPT,
    }  # fmt: skip
    return {
        "images": SCRIPT,
        "settings": {SCRIPT: HANDLER, "methods": [SCRIPT]},
        "statistics": {"words": HANDLER, "correction": SCRIPT, "resamples": 10},
        "random": {"deletion_auc": 0.5, "insertion_auc": 0.4, "deletion_auc_seeds": [0.5, SCRIPT]},
        "methods": {SCRIPT: row, HANDLER: dict(row, sanity_flagged=True)},
        "paired": [{"curve": SCRIPT, "a": SCRIPT, "b": HANDLER, "more_faithful": SCRIPT, "difference": 0.1}],
        "by_word_class": {SCRIPT: {"random": {"deletion_auc": 0.5}, HANDLER: row}},
        "per_image": [{"image_id": 1, "words": 5}],
    }


def assert_nothing_live(page: str, own_scripts: int, shown: bool = True) -> None:
    elements = Elements()
    elements.feed(page)
    assert len(elements.scripts) == own_scripts and not any("alert" in s for s in elements.scripts)
    assert elements.handlers == []
    assert ("&lt;script&gt;alert(1)&lt;/script&gt;" in page) is shown  # shown, as text


def test_the_run_report_shows_hostile_table_values_as_text(tmp_path: Path):
    scores = {"faithfulness": hostile_table(), "table": "CIDEr-D 1.0"}
    page = write_run_report(tmp_path / "report.html", [], (2, 2), scores).read_text(encoding="utf-8")
    assert_nothing_live(page, own_scripts=1)  # the report's own table script


def test_the_faithfulness_page_shows_hostile_table_values_as_text(tmp_path: Path):
    item = ExplainedImage(1, SCRIPT, [SCRIPT], {HANDLER: np.ones((1, 4))}, {}, [[(1.0, 1.0, 4.0, 4.0)]])
    page = write_faithfulness_page(
        tmp_path / "page.html", hostile_table(), [item], [Image.new("RGB", (16, 16))], (2, 2),
        checkpoint=SCRIPT, signature=HANDLER, progress=False,
    ).read_text(encoding="utf-8")  # fmt: skip
    assert_nothing_live(page, own_scripts=0)


def test_a_table_that_is_not_an_object_shows_as_an_empty_one(tmp_path: Path):
    page = write_run_report(tmp_path / "report.html", [], (2, 2), {"faithfulness": [SCRIPT]})
    text = page.read_text(encoding="utf-8")
    assert "Does the map explain the word? (? images)" in text
    assert_nothing_live(text, own_scripts=1, shown=False)  # nothing of the list is shown
