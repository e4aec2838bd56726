"""One page owns each answer: what a resumed run's length is (docs/first-run-notes.md), and every other
page that speaks of it agrees and links there. Checked against what the tool does
(``training.plan.resumed_length``), so the owner page cannot drift either."""

from __future__ import annotations

import re

from tool_runs import REPO

from captioning.config import Config
from captioning.training.plan import resumed_length

OWNER = "first-run-notes.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a page (code blocks and tables left out: the key reference is a table)."""
    blocks = re.split(r"\n\s*\n", re.sub(r"```.*?```", "", text, flags=re.S))
    return [block for block in blocks if block.strip() and not block.lstrip().startswith("|")]


def test_pages_on_a_resumed_runs_length_agree_and_link_to_the_one_that_owns_it():
    speaking = []
    for page in PAGES:
        for block in paragraphs(page.read_text(encoding="utf-8")):
            flat = " ".join(block.split())
            # a sentence on a resumed run and its length (train.epochs, "its length", "epochs come first")
            if re.search(r"\bresum[^.]*(train\.epochs|its length|epochs come)", flat, re.I):
                speaking.append((page.name, flat))
    assert any(name == OWNER for name, _ in speaking)
    for name, flat in speaking:
        assert not re.search(r"configuration's \d+ (cross-entropy )?epochs come", flat), (name, flat)
        if name != OWNER:
            assert OWNER in flat, f"{name} speaks of a resumed run's length without linking {OWNER}: {flat}"


def test_the_owner_page_says_what_the_tool_does():
    text = " ".join((REPO / "docs" / OWNER).read_text(encoding="utf-8").split())
    assert "continues a run with the checkpoint's `train.epochs` and `train.scst_epochs`" in text
    stored = Config()
    asked = Config(train=Config().train.__class__(epochs=20))
    kept, note = resumed_length(asked, Config(train=stored.train.__class__(epochs=3)), given=set())
    assert kept.train.epochs == 3 and "keeps the checkpoint's train.epochs=3" in note
    changed, _ = resumed_length(asked, Config(train=stored.train.__class__(epochs=3)), given={"train.epochs"})
    assert changed.train.epochs == 20
