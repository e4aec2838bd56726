"""Every module (``captioning/...py``) and test (``tests/...py``, ``tests/...py::test_name``) the
documentation names exists, so that a rename or a move cannot leave a page pointing at nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPOSITORY / "README.md", REPOSITORY / "CONTRIBUTING.md", *(REPOSITORY / "docs").rglob("*.md")]
)
# captioning/models/attention.py, tests/models/test_attention.py::test_weights_depend_on_query_and_image
REFERENCE = re.compile(r"\b((?:captioning|tests|examples|benchmarks)/[\w/.-]*?\.py)(?:::(\w+))?")


def references(text: str) -> list[tuple[str, str | None]]:
    return [(path, name or None) for path, name in REFERENCE.findall(text)]


def defined_names(path: Path) -> set[str]:
    """The functions and classes a module defines (tests, test classes), at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPOSITORY)) for page in PAGES])
def test_every_module_and_test_a_page_names_exists(page: Path):
    missing = []
    for path, name in references(page.read_text(encoding="utf-8")):
        if not (REPOSITORY / path).is_file():
            missing.append(path)
        elif name is not None and name not in defined_names(REPOSITORY / path):
            missing.append(f"{path}::{name}")
    assert missing == []


def test_the_check_finds_a_missing_module_and_a_renamed_test():
    text = (
        "`captioning/config.py` and `captioning/models/attention.py`; "
        "`tests/models/test_attention.py::test_weights_depend_on_query_and_image`, "
        "`tests/models/test_attention.py::test_a_renamed_one`"
    )
    found = references(text)
    assert found == [
        ("captioning/config.py", None),
        ("captioning/models/attention.py", None),
        ("tests/models/test_attention.py", "test_weights_depend_on_query_and_image"),
        ("tests/models/test_attention.py", "test_a_renamed_one"),
    ]
    assert not (REPOSITORY / found[0][0]).is_file()
    names = defined_names(REPOSITORY / found[2][0])
    assert found[2][1] in names and found[3][1] not in names
