"""Every function of the package reads in one screen and every module stays a size a reader holds:
no function over 100 lines, no module over 500 (CONTRIBUTING.md). The count is the one a reader
sees: a function from its ``def`` (its decorators not counted) to its last line, a module's lines."""

from __future__ import annotations

import ast
from pathlib import Path

import captioning

PACKAGE = Path(captioning.__file__).resolve().parent
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 500


def sizes(path: Path) -> tuple[int, list[tuple[str, int]]]:
    """The module's line count and each function's (qualified name, lines)."""
    source = path.read_text(encoding="utf-8")
    functions: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    functions.append((name, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return len(source.splitlines()), functions


def test_no_function_over_100_lines_and_no_module_over_500():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines, functions = sizes(path)
        where = path.relative_to(PACKAGE.parent)
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{where}: {lines} lines")
        too_long += [f"{where}::{name}: {n} lines" for name, n in functions if n > MAX_FUNCTION_LINES]
    assert not too_long, "split by what it does:\n" + "\n".join(too_long)


def test_the_count_sees_nested_and_long_functions(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(101))
    path = tmp_path / "module.py"
    path.write_text(
        f"class A:\n    def short(self):\n        def inner():\n{body.replace('    ', '            ')}\n"
    )
    lines, functions = sizes(path)
    assert lines == 104
    assert dict(functions) == {"A.short": 103, "A.short.inner": 102}
