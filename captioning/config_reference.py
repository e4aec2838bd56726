"""The configuration reference (docs/configuration.md), generated from the configuration dataclasses.

python -m captioning.config_reference      # prints the table (a test keeps docs/configuration.md in sync)
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing
from typing import Any

from captioning.config import Config


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, Any]]:
    """Every configuration key as ``(dotted key, type, default)``, for generated documentation."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            rows.extend(describe(hint, prefix + f.name + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            type_name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "").replace(
                " | ", " or "
            )
            rows.append((prefix + f.name, type_name, default))
    return rows


def _field_comments(cls: type) -> dict[str, str]:
    """The ``# comment`` after each field in the class source: the one place options are explained."""
    pattern = re.compile(r"^\s+(\w+):[^#]*#\s*(.+)$")
    return {
        m.group(1): m.group(2).strip()
        for line in inspect.getsource(cls).splitlines()
        if (m := pattern.match(line))
    }


def reference_markdown() -> str:
    """The configuration reference table of docs/configuration.md, generated from the dataclasses."""
    comments: dict[str, str] = {}

    def collect(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for name, text in _field_comments(cls).items():
            comments[prefix + name] = text
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                collect(hints[f.name], prefix + f.name + ".")

    collect(Config, "")
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, type_name, default in describe():
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        lines.append(f"| `{key}` | {type_name} | `{shown}` | {comments.get(key, '').replace('|', '/')} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m captioning.config_reference prints the reference table
    print(reference_markdown())
