"""What the sections of the configuration share: the markers of options that name files or folders,
the check that every field holds its declared type, the 32-bit float bounds, and the one-line checks
the sections' ``__post_init__`` raise ``ConfigError`` with."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from captioning.registry import FamilyRegistry
from captioning.utils.errors import ConfigError

__all__ = [
    "FLOAT32_MAX",
    "FLOAT32_TINY",
    "ConfigError",
    "FilePath",
    "FolderPath",
    "NameOrFile",
    "OutputFolder",
    "PathOption",
    "check_float32",
    "path_options",
]


def check(condition: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``condition``."""
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class PathOption:
    """The marker of an option that names a file or folder, declared on its type
    (``split_file: FilePath | None``, ``annotations: tuple[FilePath, ...]``): wherever it is read, a
    leading ``~`` is expanded as a shell does, and a data option that ``must_exist`` is checked before
    any work (``captioning.data.readers.check_data_paths``). A reader of your own marks its own the
    same way."""

    kind: str  # file | folder
    must_exist: bool = True  # False: a place the project writes, or a name that may be a path


FilePath = Annotated[str, PathOption("file")]  # a file that must exist
FolderPath = Annotated[str, PathOption("folder")]  # a folder that must exist
OutputFolder = Annotated[str, PathOption("folder", must_exist=False)]  # a folder written, made if need be
NameOrFile = Annotated[str, PathOption("file", must_exist=False)]  # a name, or a path to a file


def path_options(cls: type) -> dict[str, PathOption]:
    """The fields of a section class that name files or folders (alone, in a tuple or optional), with
    their markers, by field name."""
    if cls not in _PATHS:
        hints = typing.get_type_hints(cls, include_extras=True)
        found = {item.name: _marker(hints[item.name]) for item in dataclasses.fields(cls)}
        _PATHS[cls] = {name: marker for name, marker in found.items() if marker is not None}
    return _PATHS[cls]


def _marker(hint: Any) -> PathOption | None:
    if typing.get_origin(hint) is Annotated:
        return next((extra for extra in hint.__metadata__ if isinstance(extra, PathOption)), None)
    return next(filter(None, map(_marker, typing.get_args(hint))), None)


_PATHS: dict[type, dict[str, PathOption]] = {}
_HINTS: dict[type, dict[str, Any]] = {}


def _type_hints(cls: type) -> dict[str, Any]:
    """A section class's resolved field types, once per class (every construction checks them)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


# The 32-bit floats every option that reaches a tensor becomes: a smaller magnitude is 0 or a subnormal
# (top_p 1e-300 would keep no word), a larger one inf.
FLOAT32_TINY = 1.1754943508222875e-38  # numpy.finfo(numpy.float32).tiny
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max


def check_float32(value: float, key: str) -> None:
    """Refuse a finite ``value`` that is neither 0 nor a normal 32-bit float (NaN and inf are each
    option's own check), naming ``key``."""
    if math.isfinite(value) and value != 0 and not FLOAT32_TINY <= abs(value) <= FLOAT32_MAX:
        raise ConfigError(
            f"{key} must be 0 or of magnitude in [{FLOAT32_TINY:.4g}, {FLOAT32_MAX:.4g}], the "
            f"32-bit floats it is used as, got {value!r}"
        )


def check_types(section: object, prefix: str) -> None:
    """Every field of ``section`` holds its declared type (a configuration built in Python, e.g. by the
    API's ``beam_size=2.5``, is refused here as a file's would be when it is read): ``int`` fields an
    int (not a bool), ``float`` fields a finite-or-not real number that is 0 or a normal 32-bit float
    (the type options become in tensors), ``bool`` fields a bool, ``str`` fields a str."""
    hints = _type_hints(type(section))
    for item in dataclasses.fields(section):  # type: ignore[arg-type]
        value, hint = getattr(section, item.name), hints.get(item.name)
        key = prefix + item.name
        if hint is int and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        if hint is float and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        if hint is float:
            check_float32(value, key)
        if hint is bool and not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        if hint is str and not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")


def one_of(name: str, value: Any, choices: tuple) -> None:
    """Raise ``ConfigError`` naming option ``name`` unless ``value`` is one of ``choices``."""
    check(value in choices, f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def check_family(section: Any, families: FamilyRegistry) -> None:
    """``section`` is an instance of the options class its family's name (``section.kind``,
    ``section.dataset``) chooses."""
    name = getattr(section, families.field)
    expected = families.config_class(name)
    if expected is None:
        raise ConfigError(families.unknown_message(name))
    check(
        type(section) is expected,
        f"{families.key} {name!r} is configured by {expected.__name__}, not {type(section).__name__}",
    )
