"""evaluate.py's decoding flags, one per field of the configuration's ``decode`` section: a new field of
``DecodeConfig`` is a flag (``--beam-size`` for ``beam_size``) with no edit here.

Each flag's type is the field's (a bool one is ``--x`` / ``--no-x``), its help the field's meaning
(``captioning.config.reference.field_help``: its ``metadata["help"]`` or its comment), its choices
the field's ``metadata["choices"]``; left out, the checkpoint's value stays.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from captioning.config import Config, DecodeConfig
from captioning.config.reference import field_help


def decode_class() -> type[DecodeConfig]:
    """The class of the configuration's ``decode`` section (the one a checkpoint's is read as)."""
    return typing.get_type_hints(Config)["decode"]


def add_decoding_flags(group: Any, notes: Mapping[str, str] | None = None) -> None:
    """A flag per field of ``decode_class()`` in the argparse ``group``; ``notes`` adds to a field's
    help what the tool does with it (``num_return``: where the ranked captions go)."""
    cls = decode_class()
    hints = typing.get_type_hints(cls)
    meanings = field_help(cls)
    for item in dataclasses.fields(cls):
        flag = "--" + item.name.replace("_", "-")
        meaning = " ".join(filter(None, [meanings.get(item.name, ""), (notes or {}).get(item.name, "")]))
        meaning = meaning.replace("%", "%%")  # argparse formats help with %
        hint = hints[item.name]
        if hint is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=meaning)
            continue
        scalar = hint if hint in (int, float, str) else str
        choices = item.metadata.get("choices")
        group.add_argument(flag, type=scalar, default=None, choices=choices, help=meaning)


def check_decoding_values(decoding: Mapping[str, Any]) -> None:
    """Each given ``decode.*`` value (field name -> value, None: not given) in its own range, before the
    checkpoint is read; what depends on the checkpoint's options (num_return and beam_groups against
    its beam_size, min_length against its max_length) is checked once it is loaded.

    Raises:
        ConfigError: the first value out of its range, naming its key.
    """
    from captioning.config import MAX_DECODE_LENGTH
    from captioning.inference.captioner import decode_config_with

    given = {key: value for key, value in decoding.items() if value is not None}
    early = {
        "beam_size": given.get("beam_size", given.get("num_return", 1) * given.get("beam_groups", 1)),
        "max_length": given.get("max_length", MAX_DECODE_LENGTH),
    }
    decode_config_with(decode_class()(), **{**given, **early})


def decoding_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The value of each decoding flag by field name (None: not given)."""
    return {item.name: getattr(args, item.name, None) for item in dataclasses.fields(decode_class())}
