"""The configuration reference (docs/configuration.md), generated from the configuration dataclasses.

python -m captioning.config.reference      # prints the table (a test keeps docs/configuration.md in sync)
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from typing import Any

from captioning.config import Config
from captioning.config.loading import FAMILIES


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """Every configuration key as ``(dotted key, type, default, meaning)``, for generated documentation.

    A family's section (``data``, ``model.decoder``) lists the options every family has, then each
    registered family's own (``kind lstm: ...``, ``dataset shapes: ...``): which apply depends on
    the family's name (``model.decoder.kind``, ``data.dataset``).
    """
    rows = []
    hints = typing.get_type_hints(cls)
    comments = field_help(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if hint in FAMILIES:
            families = FAMILIES[hint]
            rows.extend(describe(hint, prefix + f.name + "."))
            shared = {g.name for g in dataclasses.fields(hint)}
            # An option several families share (from a base of their options classes: data.split_file,
            # the karpathy and coco readers') is one row naming them all.
            owned: dict[str, tuple[tuple[str, str, Any, str], list[str]]] = {}
            for name, family in families.items():
                for row in describe(family.config, prefix + f.name + "."):
                    if row[0].rsplit(".", 1)[1] not in shared:
                        same = json.dumps(row, default=repr)  # the same key, type, default and meaning
                        owned.setdefault(same, (row, []))[1].append(name)
            rows.extend(
                (key, type_name, default, f"{families.field} {', '.join(names)}: {meaning}")
                for (key, type_name, default, meaning), names in owned.values()
            )
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            rows.extend(describe(hint, prefix + f.name + "."))
        else:
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                raise TypeError(f"{cls.__name__}.{f.name} has no default: every option needs one")
            type_name = _type_name(hint)
            rows.append((prefix + f.name, type_name, default, comments.get(f.name, "")))
    return rows


def _type_name(hint: Any) -> str:
    """``str``, ``str or None``, ``tuple``: the type, whatever marker it carries (``FilePath``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return "None"
    origin = typing.get_origin(hint)
    return getattr(origin or hint, "__name__", None) or str(hint).replace("typing.", "")


def field_help(cls: type) -> dict[str, str]:
    """What each option of a configuration class means, the one place it is explained: the field's
    ``metadata["help"]`` when it has one (a class made without source, ``dataclasses.make_dataclass``),
    else the ``# comment`` after the field in the class source. A field inherited from a base class
    (``KarpathySplitConfig``'s ``split_file``) has the base's. The configuration reference and
    evaluate.py's decoding flags read it."""
    pattern = re.compile(r"^\s+(\w+):[^#]*#\s*(.+)$")
    comments: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            try:
                source = inspect.getsource(base).splitlines()
            except (OSError, TypeError):  # made at run time: no source
                source = []
            comments.update((m.group(1), m.group(2).strip()) for line in source if (m := pattern.match(line)))
    for item in dataclasses.fields(cls):
        if item.metadata.get("help"):
            comments[item.name] = str(item.metadata["help"])
    return comments


def reference_markdown() -> str:
    """The configuration reference table of docs/configuration.md, generated from the dataclasses."""
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, type_name, default, meaning in describe():
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        lines.append(f"| `{key}` | {type_name} | `{shown}` | {meaning.replace('|', '/')} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m captioning.config.reference prints the reference table
    print(reference_markdown())
