"""A time or a rate a page quotes is a measurement, and a measurement carries its date: every paragraph
(a table counts as one) of the README and of docs/*.md that quotes one (``7 min 0 s``, ``35.4 s``,
``25 images/s``) holds a date, YYYY-MM-DD. A setting in seconds (``600 s by default``) is no
measurement. Code blocks are left out: they are commands and their output."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
PAGES = sorted([REPOSITORY / "README.md", *(REPOSITORY / "docs").glob("*.md")])
TIMING = re.compile(r"\b\d+(?:[.,]\d+)?\s?(?:min|ms|s|h)\b(?!-)|\b(?:img|images|captions|steps|tokens)/s\b")
# Times that are settings or bounds of the code, not measurements: left out before the search.
SETTINGS = re.compile(r"\d+ s by default|10 min for an answer, 1 h idle")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def paragraphs(text: str) -> Iterator[str]:
    """The page's paragraphs, tables and list items with their continuation lines, without code
    blocks and headings."""
    block: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        starts_item = line.startswith(("- ", "* ")) or re.match(r"\d+\. ", line)
        if fenced or line.startswith("```") or not line.strip() or line.startswith("#") or starts_item:
            if block:
                yield "\n".join(block)
            block = [line] if starts_item and not fenced else []
            continue
        block.append(line)
    if block:
        yield "\n".join(block)


def undated(text: str) -> list[str]:
    """The first timing of each paragraph of ``text`` that quotes one and holds no date."""
    return [
        f"{match.group(0)!r} in {paragraph[:80]!r}"
        for paragraph in paragraphs(text)
        if (match := TIMING.search(SETTINGS.sub("", paragraph))) and not DATE.search(paragraph)
    ]


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPOSITORY)) for page in PAGES])
def test_every_quoted_timing_carries_its_date(page: Path):
    assert undated(page.read_text(encoding="utf-8")) == []


def test_the_check_finds_an_undated_timing_and_passes_a_dated_one():
    text = (
        "Intro.\n\nIt took 7 min 0 s on 2 cores.\n\nIt took 7 min 0 s on 2026-12-02.\n\n"
        "- caching at ~25 images/s\n- a timeout, 600 s by default\n\n"
        "| run | time |\n| --- | --- |\n| demo | 35.4 s |\n\n```text\nepoch 1: 21.8 s\n```\n"
    )
    found = undated(text)
    assert len(found) == 3
    assert "'7 min'" in found[0] and "'images/s'" in found[1] and "'35.4 s'" in found[2]
