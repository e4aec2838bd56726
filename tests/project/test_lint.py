"""The static checks: every pre-commit hook (``.pre-commit-config.yaml``) runs a command that CI
(``.ci/run``) runs as it is, and every static check of CI has its hook, so the two lists cannot drift."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPOSITORY = Path(__file__).resolve().parents[2]
PRE_COMMIT_CONFIG = REPOSITORY / ".pre-commit-config.yaml"
# The first word of a static check in .ci/run: each must have its hook.
STATIC_CHECKS = ("ruff", "mypy", "lint-imports")


def ci_commands() -> list[str]:
    """The command lines of .ci/run, without comments and blank lines."""
    lines = (line.strip() for line in (REPOSITORY / ".ci" / "run").read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def pre_commit_config() -> dict[str, Any]:
    return yaml.safe_load(PRE_COMMIT_CONFIG.read_text(encoding="utf-8"))


def hooks() -> list[dict[str, Any]]:
    return [hook for repo in pre_commit_config()["repos"] for hook in repo["hooks"]]


def command_of(hook: dict[str, Any]) -> str:
    """The command line a hook runs: its entry and its arguments (no file names are passed)."""
    return " ".join([hook["entry"], *hook.get("args", [])])


def test_every_hook_is_local_and_runs_the_environment_s_tools():
    assert [repo["repo"] for repo in pre_commit_config()["repos"]] == ["local"]  # nothing downloaded
    for hook in hooks():
        assert hook["language"] == "system", hook["id"]
        # The whole tree, as CI checks it: a hook given only the staged files would judge less.
        assert hook["pass_filenames"] is False, hook["id"]


def test_every_hook_runs_a_command_ci_runs_before_the_tests():
    commands = ci_commands()
    tests = next(i for i, command in enumerate(commands) if command.startswith("pytest"))
    for hook in hooks():
        assert command_of(hook) in commands[:tests], f"{hook['id']}: {command_of(hook)!r} is not in .ci/run"


def test_every_static_check_of_ci_has_a_hook():
    static = [command for command in ci_commands() if command.split()[0] in STATIC_CHECKS]
    assert {"ruff check .", "ruff format --check .", "mypy", "lint-imports --no-cache"} <= set(static)
    assert set(static) <= {command_of(hook) for hook in hooks()}


@pytest.mark.parametrize("path", ["captioning/models/decoding.py", "captioning/models/encoders/registry.py"])
def test_every_hook_runs_when_a_package_module_changes(path):
    for hook in hooks():
        assert re.search(hook.get("files", ""), path), f"{hook['id']} skips {path}"


@pytest.mark.skipif(importlib.util.find_spec("pre_commit") is None, reason="pre-commit is not installed")
def test_pre_commit_accepts_the_configuration():
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-config", str(PRE_COMMIT_CONFIG)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
