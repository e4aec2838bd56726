"""Importing the modules of a user's own parts (``--import MODULE`` of the tools, ``imports=`` of
``captioning.load``): a module name, or a path to a ``.py`` file imported under its stem, once per
process; a module that is not found is one line, a bug in it keeps its traceback."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path

from captioning.utils.errors import CaptioningError, ConfigError
from captioning.utils.files import not_a_regular_file


def import_modules(names: Sequence[str], option: str = "--import") -> None:
    """Import each user module of ``--import`` (the tools) or ``imports=`` (``captioning.load``), in
    order, before the configuration is read; ``option`` names the option in messages.

    A name ending in ``.py`` or holding a path separator is a file, imported under its stem; any other
    is a module name, looked up on ``sys.path`` and then in the current folder. A file imported already
    (an earlier tool run in this process) is not run again, so its registrations are not repeated.

    Raises:
        ConfigError: one line naming the option and the module when it is not found. Any other
            failure while the module runs is its own and keeps its traceback.
    """
    for name in names:
        if not name.strip():  # importlib would raise a bare ValueError
            raise ConfigError(f"{option} {name!r:.60}: give a module name or a .py file")
        is_file = name.endswith(".py") or os.sep in name
        spec = _file_spec(name, option) if is_file else None
        if not is_file and os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())  # after installed modules: a local file does not shadow them
        try:
            if spec is not None:
                _run_file(spec)
            elif not is_file:
                importlib.import_module(name)
        except ModuleNotFoundError as error:
            # the module itself, not one it imports
            if error.name is not None and name.startswith(error.name):
                raise ConfigError(
                    f"{option} {name}: no module named {error.name!r} on the Python path or in "
                    f"the current folder"
                ) from error
            raise ConfigError(f"{option} {name}: {type(error).__name__}: {error}") from error
        except CaptioningError:
            raise
        except Exception as error:  # a bug in the user's module: its traceback shows where
            add_note = getattr(error, "add_note", None)  # Python 3.11 and later
            if add_note is not None:
                add_note(f"(raised while importing {option} {name})")
            raise


def _file_spec(name: str, option: str) -> ModuleSpec | None:
    """How to import the Python file ``name`` as a module named after its stem; None when this
    process imported that file already (once per process).

    Raises:
        ConfigError: no such file, not a regular file, not a Python source file, or another module
            of that name is imported already.
    """
    file = Path(name).expanduser()
    problem = not_a_regular_file(file) or (None if file.exists() else "no such file")
    if problem:
        raise ConfigError(f"{option} {name}: {problem}")
    file = file.resolve()
    loaded = sys.modules.get(file.stem)
    if loaded is not None:
        location = getattr(loaded, "__file__", None)
        if location and Path(location).resolve() == file:
            return None
        raise ConfigError(
            f"{option} {name}: a module named {file.stem!r} is imported already "
            f"({location or 'built in'}); rename the file"
        )
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None:  # no loader for the file's suffix
        raise ConfigError(f"{option} {name}: not a Python source file (.py)")
    return spec


def _run_file(spec: ModuleSpec) -> None:
    """Run the module of ``spec`` (from ``_file_spec``) under its name; not kept if it fails."""
    assert spec.loader is not None  # _file_spec returns only specs with a loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
