"""Reading and writing configurations: YAML files, ``--set key=value`` overrides, and the plain
dicts checkpoints store (``load_config``, ``apply_overrides``, ``from_dict``, ``save_config``).

Every value is coerced to its field's declared type and checked before a ``Config`` exists, so a
bad file or override is one ``ConfigError`` naming its key.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from captioning.config import (
    DATASETS,
    DECODERS,
    Config,
    ConfigError,
    DataConfig,
    DecodeConfig,
    path_options,
    to_dict,
)
from captioning.config.fields import check_float32
from captioning.registry import FamilyRegistry
from captioning.utils.files import not_a_regular_file


def _coerce(type_hint: Any, value: Any, key: str, strict: bool = False, path: bool = False) -> Any:
    """Turn a YAML/CLI value into the field's declared type, or raise ConfigError naming the key.

    ``strict``: the value was written by this project (a checkpoint, a model folder): a number or a
    truth value written as text (``"64"``) is refused, never read as one. ``path``: the field names
    files or folders (a ``PathOption`` on its type): a leading ``~`` or ``~user`` is expanded as a
    shell does (a quoted path or KEY=~/x after --set reaches the program unexpanded), never taken as
    a folder named "~".
    """
    if strict and isinstance(value, str) and type_hint in (int, float, bool):
        raise ConfigError(
            f"{key} must be {'a number' if type_hint is not bool else 'true or false'}, got {_shown(value)}"
        )
    origin = typing.get_origin(type_hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(type_hint)
        is_null = value is None or (isinstance(value, str) and value.lower() in ("none", "null", ""))
        if is_null and type(None) in options:
            return None
        inner = [t for t in options if t is not type(None)]
        return _coerce(inner[0], value, key, strict, path)
    if origin is tuple:
        if value is None:  # older configurations wrote null for an empty optional file
            return ()
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return tuple(_coerce(str, v, key, path=path) for v in value)
    if type_hint is bool:
        # The words YAML reads as truth values, as --set and a file's quoted text: not 1 or 0, which
        # YAML and the Python API take for numbers and refuse for a bool.
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "false", "no", "off"):
            return value.lower() in ("true", "yes", "on")
        raise ConfigError(f"{key} must be true or false, got {_shown(value)}")
    if type_hint is int:
        # Integers only, as written: 1e3 or 2.0 is a float in YAML and is not silently truncated.
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            if isinstance(value, str):
                return int(value.strip())
        except ValueError:
            pass
        raise ConfigError(f"{key} must be an integer, got {_shown(value)}")
    if type_hint is float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be a number, got {_shown(value)}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        check_float32(number, key)  # before any work: --set is checked before a checkpoint is read
        return number
    if type_hint is str:
        if value is None:  # str(None) would be the folder name "None"
            raise ConfigError(f"{key} must be a string, got null")
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        if "\x00" in str(value):
            raise ConfigError(f"{key} must not contain a NUL character")
        return _expand_home(str(value), key) if path else str(value)
    return value


# The spellings YAML reads as null; --set KEY=VALUE reads them the same way.
YAML_NULLS = frozenset(["", "~", "null", "Null", "NULL"])


def _shown(value: Any) -> str:
    return "null" if value is None else repr(value)


def _expand_home(path: str, key: str) -> str:
    if not path.startswith("~"):
        return path
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        raise ConfigError(
            f"{key}: cannot expand {path!r}: no such user or no home folder; give the full path"
        )
    return expanded


# The sections whose class a key of theirs chooses: the section's class -> the registry of its families.
FAMILIES: dict[type, FamilyRegistry] = {families.base: families for families in (DATASETS, DECODERS)}


def _family(families: FamilyRegistry, values: dict[str, Any], prefix: str) -> tuple[str, type]:
    """The name of the family a section's ``values`` choose (``kind: lstm``, ``dataset: shapes``;
    absent: the section's default) and its configuration class."""
    key = prefix + families.field
    name = _coerce(str, values.get(families.field, getattr(families.base, families.field)), key)
    cls = families.config_class(name)
    if cls is None:
        raise ConfigError(families.unknown_message(name))
    return name, cls


def _build(cls: type, values: dict[str, Any], prefix: str, stored: bool = False) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'configuration'} must be a mapping, got {values!r}")
    families = FAMILIES.get(cls)
    if families is not None:
        chosen, cls = _family(families, values, prefix)
        # Configurations written before each family had its own class held every family's options
        # (every run's data section the Shapes generator's): those of the other families are left out.
        if stored:
            values = {k: v for k, v in values.items() if k in _names(cls) or not families.owners(k, cls)}
    hints = typing.get_type_hints(cls)
    paths = path_options(cls)
    names = _names(cls)
    unknown = sorted(set(values) - names)
    if unknown:
        where = prefix.rstrip(".") or "the top level"
        others = families.owners(unknown[0], cls) if families is not None else ()
        if families is not None and others:
            # A name no family registered (a reader of a module not imported) is said to be one.
            unregistered = (
                f", which names no registered {families.what} (a module of your own registers it: "
                "--import MODULE)"
                if chosen not in families
                else ""
            )
            raise ConfigError(
                f"{prefix + unknown[0]} is an option of {families.owners_named(others)}, not of "
                f"{prefix}{families.field} {chosen!r}{unregistered}"
            )
        hint = ""
        if families is not None and cls is families.base:  # e.g. a reader of a module not imported
            hint = (
                f"; {prefix}{families.field} {chosen!r} has no options of its own here (a {families.what} "
                "of your own registers its options class with it: --import MODULE)"
            )
        raise ConfigError(
            f"unknown configuration key {prefix + unknown[0]!r} in {where}; known: {', '.join(sorted(names))}"
            + hint
        )
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        key = prefix + name
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, key + ".", stored)
        else:
            kwargs[name] = _coerce(hint, value, key, strict=stored, path=name in paths)
    return cls(**kwargs)


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def from_dict(values: dict[str, Any], stored: bool = False) -> Config:
    """Build a validated Config from nested dicts; missing keys take their defaults.

    ``stored``: the dict was written by this project (a checkpoint, a run's config.yaml), perhaps by an
    older version, whose decoder section held the options of every decoder family; those of the other
    families are left out. A user's file is read strictly: an option of another family is an error.
    """
    return _build(Config, values, "", stored)


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {key!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


# The sections of a checkpoint's configuration that evaluating or visualizing may change: the model is fixed.
CHECKPOINT_SECTIONS = ("data", "decode")
# Keys of those sections the checkpoint fixes all the same: its vocabulary holds this tokenizer's tokens.
FIXED_BY_CHECKPOINT = ("data.tokenizer",)


def with_data_section(config: Config, data: DataConfig) -> Config:
    """A checkpoint's ``config`` reading another dataset (``--config``), with the checkpoint's tokenizer."""
    return dataclasses.replace(config, data=dataclasses.replace(data, tokenizer=config.data.tokenizer))


def parse_overrides(items: Iterable[str]) -> dict[str, str | None]:
    """``["train.lr=2e-4", ...]`` as typed after ``--set`` -> ``{"train.lr": "2e-4", ...}`` (later wins).

    A value YAML reads as null (``null``, ``~``, nothing) is None, as in a configuration file: an
    optional key is unset by it, and a key that must hold a string refuses it.

    Raises:
        ConfigError: an item without ``=`` or with an empty key.
    """
    overrides: dict[str, str | None] = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = None if value.strip() in YAML_NULLS else value.strip()
    return overrides


def check_overrides(overrides: dict[str, Any], sections: tuple[str, ...] | None = None) -> None:
    """Fail fast on overrides that no configuration can take: each key must name a field (inside
    ``sections`` when given) and each value must have the field's type. Range and cross-field rules
    (``decode.min_length <= decode.max_length``) are checked when the overrides are applied.

    Raises:
        ConfigError: naming the key.
    """
    for key, value in overrides.items():
        if sections is not None and key in FIXED_BY_CHECKPOINT:
            raise ConfigError(f"{key}: fixed by the checkpoint (its vocabulary was made with its tokenizer)")
        if sections is not None and key.split(".", 1)[0] not in sections:
            allowed = " and ".join(f"{section}.*" for section in sections)
            raise ConfigError(
                f"{key}: only {allowed} keys can be overridden here (the rest is fixed, "
                "e.g. by the checkpoint)"
            )
        cls: type = Config
        parts = key.split(".")
        for depth, part in enumerate(parts):
            # A family's section (data, model.decoder) takes the options of every registered family:
            # which family is known only once the whole configuration is read, where an option of
            # another one is refused.
            families = (
                [cls, *(family.config for _, family in FAMILIES[cls].items())] if cls in FAMILIES else [cls]
            )
            names = set().union(*(_names(family) for family in families))
            prefix = ".".join(parts[:depth]) + "." if depth else ""
            if part not in names:
                where = prefix.rstrip(".") or "the top level"
                raise ConfigError(
                    f"unknown configuration key {prefix + part!r} in {where}; "
                    f"known: {', '.join(sorted(names))}"
                )
            owner = next(family for family in families if part in _names(family))
            hint = typing.get_type_hints(owner)[part]
            is_section = dataclasses.is_dataclass(hint)
            if depth == len(parts) - 1:
                if is_section:
                    example = f"{key}.{dataclasses.fields(hint)[0].name}"
                    raise ConfigError(f"{key} is a section: set one of its keys, e.g. {example}")
                _coerce(hint, value, key)
            elif not is_section:
                raise ConfigError(f"cannot set {key!r}: {prefix + part!r} is not a section")
            else:
                cls = hint


def apply_overrides(
    config: Config, overrides: dict[str, Any], sections: tuple[str, ...] | None = None
) -> Config:
    """``config`` with dotted-key ``overrides`` applied and the result validated again.

    Args:
        config: a validated configuration, e.g. a checkpoint's.
        overrides: ``{"decode.beam_size": "5", ...}``; values may be strings as typed on a command line.
        sections: when given, the only top-level sections whose keys may change (a checkpoint's
            ``model`` must stay as it was trained).
    Raises:
        ConfigError: a key outside ``sections``, an unknown key or an invalid value.
    """
    check_overrides(overrides, sections)
    tree = to_dict(config)
    _drop_other_family(tree, overrides, None, warn=False)  # another family's options are not the user's
    for key, value in overrides.items():
        _set_dotted(tree, key, value)
    return from_dict(tree)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML would keep the last)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r:.60} given twice in one section", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    stored: bool = False,
    warn_left_out: bool = True,
    run_config: bool = False,
) -> Config:
    """Read a YAML configuration (or start from the defaults) and apply dotted-key overrides.

    Args:
        path: YAML file whose nested sections mirror ``Config``; None starts from the defaults.
        overrides: ``{"train.lr": 2e-4, ...}``; values may be strings as typed on a command line.
            A family given here (``model.decoder.kind``, ``data.dataset``) replaces the file's: the
            file's options of another family that the new one lacks are left out, with a warning
            naming them.
        stored: the file was written by this project (a run's ``config.yaml``): see ``from_dict``.
        warn_left_out: whether that warning is given; not for a file the user did not name (the
            tools' default configuration), whose options are no one's choice.
        run_config: the file is a run folder's ``config.yaml`` given as ``--config`` (resuming it,
            say), perhaps written by an older version whose data section held every reader's
            options: those of a family other than the chosen one are left out without a word, as
            from a stored configuration, while ``overrides`` are read as typed.
    Returns:
        The validated, frozen ``Config``.
    Raises:
        ConfigError: the file is unreadable or not YAML, a key is unknown, or a value is invalid.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            kind = not_a_regular_file(path)
            if kind is not None:
                raise ConfigError(f"{path}: {kind}")
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"{path}: cannot read configuration ({error.strerror})") from None
        except UnicodeDecodeError as error:
            raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None
        try:
            tree = yaml.load(text, Loader=_UniqueKeyLoader)
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
        except RecursionError:
            raise ConfigError(f"{path}: YAML nested too deeply to read") from None
        if tree is None:  # an empty or comment-only file would silently run the defaults (the demo)
            raise ConfigError(
                f"{path}: an empty configuration (no section); give the sections to change, or leave out "
                "--config for the defaults"
            )
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: a configuration must be a mapping of sections")
    _drop_other_family(tree, overrides or {}, path, warn=warn_left_out)
    if run_config:
        _drop_other_family(tree, _families_of(tree), path, warn=False)
    for key, value in (overrides or {}).items():
        _set_dotted(tree, key, value)
    try:
        return from_dict(tree, stored)
    except ConfigError as error:
        # Name the file only when the bad value came from it, not from an override (a flag or --set).
        from_override = any(str(error).startswith(key) or repr(key) in str(error) for key in overrides or {})
        raise ConfigError(f"{path}: {error}" if path and not from_override else str(error)) from None


def _families_of(tree: dict[str, Any]) -> dict[str, Any]:
    """The families ``tree`` chooses (``{"data.dataset": "shapes", ...}``; absent: the defaults), as
    overrides choosing them again."""
    chosen = {}
    for families in FAMILIES.values():
        section: Any = tree
        for part in families.section.split("."):
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict):
            chosen[f"{families.section}.{families.field}"] = section.get(
                families.field, getattr(families.base, families.field)
            )
    return chosen


def _drop_other_family(
    tree: dict[str, Any], overrides: dict[str, Any], path: str | Path | None, warn: bool = True
) -> None:
    """A family chosen by ``overrides`` (``model.decoder.kind``, ``data.dataset``) replaces the family
    of ``tree`` (a file, a checkpoint's configuration): the options of another family that the new one
    lacks are left out of ``tree`` (with a warning naming them and the shared options kept:
    ``dropout``, ``root``, ...), unless ``overrides`` sets them. A key no family has stays, for the
    strict check to refuse."""
    for families in FAMILIES.values():
        section_key, name = families.section, overrides.get(f"{families.section}.{families.field}")
        section: Any = tree
        for part in section_key.split("."):
            section = section.get(part) if isinstance(section, dict) else None
        if name is None or not isinstance(section, dict):
            continue
        family = families.config_class(str(name))
        if family is None:
            continue
        names = _names(family)
        dropped = [
            option
            for option in section
            if option not in names
            and families.owners(option, family)
            and f"{section_key}.{option}" not in overrides
        ]
        for option in dropped:
            del section[option]
        if dropped and warn:
            kept = [option for option in section if option in names and option != families.field]
            logging.getLogger(__name__).warning(
                "%s=%s: %s's options of another %s left out (%s)%s",
                families.key,
                name,
                path,
                families.what,
                ", ".join(dropped),
                f"; kept: {', '.join(kept)}" if kept else "",
            )


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved configuration as YAML (readable by ``load_config``)."""
    from captioning.utils.files import atomic_write

    text = yaml.safe_dump(to_dict(config), sort_keys=False)
    atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def decode_config_with(config: Config | DecodeConfig, **changes) -> DecodeConfig:
    """``config``'s decoding options (a whole configuration's ``decode`` section, or a
    ``DecodeConfig``) with the non-None ``changes`` applied, validated as one ``DecodeConfig`` of
    the same class (a subclass's own fields may be changed too).

    Raises:
        ConfigError: a change that names no field of it (listing the fields), or an invalid value.
    """
    decode = config.decode if isinstance(config, Config) else config
    names = [f.name for f in dataclasses.fields(decode)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise ConfigError(
            f"unknown decoding option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
            f"the options are {', '.join(names)}"
        )
    return dataclasses.replace(decode, **{k: v for k, v in changes.items() if v is not None})
