"""No import cycle in the package, imports inside functions and under ``if TYPE_CHECKING:`` included
(an import inside a function that closes a cycle only hides it until the import order changes), and
nothing below the Python API imports the root package."""

from __future__ import annotations

import ast
from pathlib import Path

import captioning

PACKAGE = Path(captioning.__file__).resolve().parent
ROOT = PACKAGE.name


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str], package: Path = PACKAGE) -> set[str]:
    """The package's modules ``path`` imports anywhere in its text: ``from a.b import c`` is ``a.b.c``
    when that is a module, else ``a.b``; relative imports resolved."""
    name = module_name(path, package)
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {module for module in found if module in modules and module != name}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files = {module_name(path, package): path for path in package.rglob("*.py")}
    return {name: imported_modules(path, set(files), package) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one importing itself
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    # The front door's lazy import of the API is the one edge up from the root package (.importlinter).
    graph[ROOT] = graph[ROOT] - {f"{ROOT}.api"}
    assert cycles(graph) == []


def test_nothing_below_the_api_imports_the_root_package():
    graph = import_graph()
    above = (f"{ROOT}.api", f"{ROOT}.cli")
    importers = sorted(
        name for name, targets in graph.items() if ROOT in targets and not name.startswith(above)
    )
    assert importers == []


def test_a_cycle_closed_inside_a_function_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("from .c import helper\n")
    (package / "sub" / "c.py").write_text("def helper():\n    from pkg import a\n    return a\n")
    (package / "d.py").write_text("import pkg.a\n")
    graph = import_graph(package)
    assert graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
