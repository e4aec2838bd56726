"""The README and the documentation pages: their commands are ones the tools accept, the README keeps
its sections in order, and the site builds with ``mkdocs build --strict`` (a page missing from the
navigation or a broken link fails it)."""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import shlex
import shutil
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path
from types import ModuleType

import pytest
from markdown_it import MarkdownIt
from tool_runs import script_module

from captioning.config import ConfigError
from captioning.config.loading import CHECKPOINT_SECTIONS, check_overrides, parse_overrides

REPO = Path(__file__).resolve().parents[2]
# The Markdown files a reader meets: the README, every page of the site, and the benchmarks' README
# (the site includes it as its Benchmarks page).
PAGES = [
    "README.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
    "benchmarks/README.md",
]
TOOLS = ("train.py", "evaluate.py", "visualize.py")
SHELL_BLOCKS = ("bash", "sh", "shell")
# What train.py's --set may change: any key; evaluate.py and visualize.py: data.* and decode.* only.
SET_SECTIONS: dict[str, tuple[str, ...] | None] = {
    "train.py": None,
    "evaluate.py": CHECKPOINT_SECTIONS,
    "visualize.py": CHECKPOINT_SECTIONS,
}
README_SECTIONS = [
    "Install and run the demo",
    "Train on COCO",
    "Train on your own images",
    "Caption your own images",
    "See where the model looks",
    "Compare systems",
    "Run on a cluster",
    "Read more",
    "Tests",
]
MKDOCS_ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def code_blocks(markdown: str) -> list[tuple[str, int, str]]:
    """Every code block of ``markdown`` as ``(language, first line number, content)``; an indented
    block has the language ``""``."""
    return [
        (token.info.strip().split(" ")[0] if token.type == "fence" else "", token.map[0] + 1, token.content)
        for token in MarkdownIt("commonmark").parse(markdown)
        if token.type in ("fence", "code_block")
    ]


def tool_commands(markdown: str) -> list[tuple[int, str, list[str]]]:
    """Every invocation of a tool (train.py, evaluate.py, visualize.py, benchmarks/*.py) in the shell
    code blocks of ``markdown``, as ``(line number, script, arguments)``. Lines continued with a
    backslash are joined; commands joined by ``&&``, ``|`` or ``;`` and prefixes such as
    ``torchrun ...``, ``srun ...`` or ``VAR=value`` are taken apart; ``#`` starts a comment."""
    found = []
    for language, first_line, content in code_blocks(markdown):
        if language not in SHELL_BLOCKS:
            continue
        for line, command in _joined_lines(content, first_line + 1):
            lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            simple: list[str] = []
            for token in [*lexer, ";"]:
                if token and all(ch in lexer.punctuation_chars for ch in token):  # &&, |, ;, &, ( ...
                    found.extend(_invocation(line, simple))
                    simple = []
                else:
                    simple.append(token)
    return found


def _joined_lines(content: str, first_line: int) -> list[tuple[int, str]]:
    """``(line number, command)`` per command line, lines ending in a backslash joined to the next."""
    joined: list[tuple[int, str]] = []
    start, pending = first_line, ""
    for number, line in enumerate(content.splitlines(), first_line):
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append((start, pending + line))
        pending = ""
    if pending:
        joined.append((start, pending))
    return joined


def _invocation(line: int, tokens: list[str]) -> list[tuple[int, str, list[str]]]:
    for index, token in enumerate(tokens):
        if token in TOOLS or (token.startswith("benchmarks/") and token.endswith(".py")):
            return [(line, token, tokens[index + 1 :])]
    return []


def _script(script: str) -> ModuleType:
    """A tool imported without running it; a benchmark under a name of its own in ``sys.modules``
    (its dataclasses need one)."""
    if script in TOOLS:
        return script_module(script)
    name = "docs_check_" + Path(script).stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def check_command(script: str, arguments: list[str]) -> str | None:
    """None when ``script`` accepts ``arguments`` (its flags parse, and every ``--set`` key is one it
    may change); else what is wrong. Nothing is run."""
    if not (REPO / script).is_file():
        return f"{script}: no such script"
    module = _script(script)
    if not hasattr(module, "get_args_parser"):
        return None if not arguments else f"{script} takes no arguments"
    parser: argparse.ArgumentParser = module.get_args_parser()
    stderr = io.StringIO()
    try:
        with redirect_stderr(stderr):
            args = parser.parse_args(arguments)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1]
    if script in SET_SECTIONS and getattr(args, "overrides", None):
        try:
            check_overrides(parse_overrides(args.overrides), SET_SECTIONS[script])
        except ConfigError as error:
            return str(error)
    return None


@pytest.mark.parametrize("page", PAGES)
def test_every_command_in_a_pages_shell_blocks_parses_with_its_tool(page: str) -> None:
    commands = tool_commands((REPO / page).read_text(encoding="utf-8"))
    problems = [
        f"{page}:{line}: {script} {shlex.join(arguments)}: {problem}"
        for line, script, arguments in commands
        if (problem := check_command(script, arguments)) is not None
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES)
def test_every_code_block_is_fenced_and_names_its_language(page: str) -> None:
    # A command in an unlabelled or indented block would escape the check above.
    blocks = code_blocks((REPO / page).read_text(encoding="utf-8"))
    unnamed = [f"{page}:{line}" for language, line, _ in blocks if not language]
    assert not unnamed, f"code blocks without a language (```bash, ```text, ...): {', '.join(unnamed)}"


def test_the_readme_runs_every_tool_and_keeps_its_sections_in_order() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    tokens = MarkdownIt("commonmark").parse(readme)
    headings = [
        (token.tag, tokens[i + 1].content) for i, token in enumerate(tokens) if token.type == "heading_open"
    ]
    assert headings[0] == ("h1", "captioning")
    assert [text for tag, text in headings if tag == "h2"] == README_SECTIONS
    assert len(readme.splitlines()) <= 300, "the README is the front page: the depth goes to docs/"
    invoked = {script for _, script, _ in tool_commands(readme)}
    assert set(TOOLS) <= invoked
    # The tiers: the default one, the slow one, and both, which CI runs.
    assert "\npytest " in readme and "\npytest -m slow " in readme
    both = 'pytest -m "slow or not slow"'
    assert both in readme and both.replace("pytest", "pytest -q") in (REPO / ".ci" / "run").read_text()


def test_the_readmes_links_and_images_reach_files_of_the_repository() -> None:
    # mkdocs checks the pages under docs/; the README lies outside them.
    tokens = MarkdownIt("commonmark").parse((REPO / "README.md").read_text(encoding="utf-8"))
    targets = [
        child.attrGet("href") or child.attrGet("src")
        for token in tokens
        if token.type == "inline"
        for child in token.children or []
        if child.type in ("link_open", "image")
    ]
    local = [str(target).split("#")[0] for target in targets if "://" not in str(target)]
    assert "docs/shapes_attention.png" in local and "docs/coco.md" in local
    assert not [target for target in local if not (REPO / target).is_file()]


def test_the_checks_find_a_wrong_flag_a_wrong_key_and_an_unlabelled_block() -> None:
    page = (
        "```bash\npython train.py --epochs 2 --set train.bogus=1 && \\\n"
        "    OMP_NUM_THREADS=1 python evaluate.py --checkpoint a.pt --nope  # comment\n"
        "torchrun --nproc-per-node 2 train.py --set model.decoder.gate=none\n"
        "python visualize.py x.jpg --checkpoint a.pt --set model.decoder.gate=none\n```\n\n"
        "    python train.py --epochs 1\n"
    )
    commands = tool_commands(page)
    assert [(line, script) for line, script, _ in commands] == [
        (2, "train.py"),
        (2, "evaluate.py"),
        (4, "train.py"),
        (5, "visualize.py"),
    ]
    problems = [check_command(script, arguments) for _, script, arguments in commands]
    assert "train.bogus" in problems[0] and "--nope" in problems[1]
    assert problems[2] is None  # train.py may change any key
    assert "only data.* and decode.* keys" in problems[3]
    assert [language for language, _, _ in code_blocks(page)] == ["bash", ""]


def _mkdocs_build(folder: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env=MKDOCS_ENV,
        check=False,
    )


@pytest.mark.slow
def test_the_documentation_site_builds_strictly(tmp_path: Path) -> None:
    result = _mkdocs_build(REPO, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()
    assert "The FLOP count" in (tmp_path / "site" / "benchmarks" / "index.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_a_page_left_out_of_the_navigation_or_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy)
    (copy / "benchmarks").mkdir()
    shutil.copy(REPO / "benchmarks" / "README.md", copy / "benchmarks")
    (copy / "docs" / "stray.md").write_text("# Stray\n", encoding="utf-8")
    result = _mkdocs_build(copy, tmp_path / "site")
    assert result.returncode != 0 and "stray.md" in result.stderr
    (copy / "docs" / "stray.md").unlink()
    with (copy / "docs" / "index.md").open("a", encoding="utf-8") as page:
        page.write("\n[gone](gone.md) and [no heading](shapes.md#no-such-heading)\n")
    result = _mkdocs_build(copy, tmp_path / "site")
    assert result.returncode != 0 and "gone.md" in result.stderr and "no-such-heading" in result.stderr
