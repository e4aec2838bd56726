"""Shared command-line plumbing: configuration flags, dotted overrides, one-line errors."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
import traceback
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from captioning.config import Config, ConfigError
from captioning.config_files import load_config, parse_overrides
from captioning.files import not_a_regular_file

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "shapes.yaml"

# Common flags and the configuration keys they set; anything else goes through --set KEY=VALUE.
FLAG_KEYS: dict[str, tuple[str, type, str]] = {
    "output_dir": ("train.output_dir", str, "folder for checkpoints, logs and results"),
    "epochs": ("train.epochs", int, "cross-entropy epochs"),
    "scst_epochs": ("train.scst_epochs", int, "self-critical epochs after cross-entropy"),
    "batch_size": ("train.batch_size", int, "images per batch (each with all its captions)"),
    "lr": ("train.lr", float, "decoder learning rate"),
    "seed": ("train.seed", int, "random seed"),
    "device": ("train.device", str, "auto, cpu, cuda or cuda:N"),
    "amp": ("train.amp", str, "mixed precision: none, bf16 (GPU or CPU) or fp16 (GPU)"),
    "max_steps": ("train.max_steps", int, "stop after this many optimisation steps (0 = no limit)"),
    "workers": ("data.num_workers", int, "data loading worker processes"),
    "encoder": ("model.encoder.name", str, "CNN backbone, e.g. resnet101 or efficientnet_lite0"),
    "attention": ("model.decoder.attention", str, "soft or hard"),
    "beam_size": ("decode.beam_size", int, "beam size for decoding"),
}


def add_config_arguments(parser: argparse.ArgumentParser, flags: tuple[str, ...] = tuple(FLAG_KEYS)) -> None:
    """``--config``, the common flags in ``flags`` and ``--set KEY=VALUE``."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"YAML configuration (default: {DEFAULT_CONFIG.relative_to(DEFAULT_CONFIG.parents[1])})",
    )
    for name in flags:
        key, kind, text = FLAG_KEYS[name]
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=f"{text} (sets {key})",
        )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any configuration key, e.g. --set model.decoder.gate=channel (repeatable)",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")


def add_import_argument(parser: argparse.ArgumentParser) -> None:
    """``--import MODULE`` (repeatable): user modules ``run_cli`` imports before anything else runs."""
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (a module name, found on the Python path or in the current "
        "folder, or a path to a .py file), e.g. one that registers an encoder with "
        "@register_encoder; every tool that loads the checkpoint needs it too (repeatable)",
    )


def import_modules(names: list[str]) -> None:
    """Import each user module of ``--import``, in order, before the configuration is read.

    A name ending in ``.py`` or holding a path separator is a file, imported under its stem; any other
    is a module name, looked up on ``sys.path`` and then in the current folder. A file imported already
    (an earlier tool run in this process) is not run again, so its registrations are not repeated.

    Raises:
        ConfigError: one line naming the option and the module: it is not found, or importing it failed
            (the module's own error, chained for ``--debug``).
    """
    for name in names:
        is_file = name.endswith(".py") or os.sep in name
        if is_file:
            file = Path(name).expanduser()
            problem = not_a_regular_file(file) or (None if file.exists() else "no such file")
            if problem:
                raise ConfigError(f"--import {name}: {problem}")
        elif os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())  # after installed modules: a local file does not shadow them
        try:
            if is_file:
                _import_file(Path(name).expanduser().resolve())
            else:
                importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and name.startswith(
                error.name
            ):  # the module itself, not one it imports
                raise ConfigError(
                    f"--import {name}: no module named {error.name!r} on the Python path or in "
                    f"the current folder"
                ) from error
            raise ConfigError(f"--import {name}: {type(error).__name__}: {error}") from error
        except Exception as error:  # the user's module: any failure is reported on one line
            raise ConfigError(f"--import {name}: {type(error).__name__}: {error}") from error


def _import_file(file: Path) -> None:
    """The Python file ``file`` (resolved) imported as a module named after its stem (once per process)."""
    loaded = sys.modules.get(file.stem)
    if loaded is not None:
        if getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == file:
            return
        raise ConfigError(
            f"--import {file}: a module named {file.stem!r} is imported already "
            f"({getattr(loaded, '__file__', None) or 'built in'}); rename the file"
        )
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[file.stem]
        raise


def config_from_args(args: argparse.Namespace) -> Config:
    """The configuration file (or the Shapes default) with flags and ``--set`` applied; flags win.

    Raises:
        ConfigError: a bad file, key or value.
        UnknownNameError: ``data.dataset`` or ``train.metric`` names nothing registered.
    """
    overrides: dict[str, Any] = dict(parse_overrides(args.overrides))
    for name, (key, _, _) in FLAG_KEYS.items():
        value = getattr(args, name, None)
        if value is not None:
            overrides[key] = value
    path = args.config if args.config is not None else (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    config = load_config(path, overrides)
    check_registered_names(config)
    return config


def check_registered_names(config: Config) -> None:
    """The names ``config`` looks up in registries filled at import (``data.dataset`` in ``DATASETS``,
    ``train.metric`` among the validation metrics of ``METRICS``) are registered, so that a typo fails
    before any work; ``run_cli`` has imported the ``--import`` modules by then.

    Raises:
        UnknownNameError: one line naming the key and listing the registered names.
    """
    from captioning.data.readers import DATASETS  # here: `--help` stays free of the data and metrics code
    from captioning.evaluation.scorers import check_validation_metric

    DATASETS.check(config.data.dataset)
    check_validation_metric(config.train.metric)


def given_keys(args: argparse.Namespace) -> set[str]:
    """The configuration keys this command line sets, by flag or ``--set`` (not by ``--config``)."""
    given = set(parse_overrides(args.overrides))
    given.update(key for name, (key, _, _) in FLAG_KEYS.items() if getattr(args, name, None) is not None)
    return given


def run_cli(
    main: Callable[[argparse.Namespace], Any], parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> int:
    """Parse, run ``main(args)``; expected failures print one line ``error: ...`` and exit 2.

    An exception with an ``exit_status`` attribute is a deliberate stop that ``main`` has already
    reported (``captioning.training.stopping.TrainingStopped``, exit status 75): it exits with
    that status and no error line.
    """
    args = parser.parse_args(argv)
    _print_warnings()
    try:
        _refuse_nul_bytes(args)
        import_modules(getattr(args, "imports", None) or [])
        main(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - every failure becomes one clear line
        if isinstance(getattr(error, "exit_status", None), int):
            return error.exit_status
        if getattr(args, "debug", False):
            traceback.print_exc()
        message = printable(str(error).strip().split("\n")[0])
        if not isinstance(
            error, (ValueError, OSError, RuntimeError)
        ):  # not an input problem: say what it was
            message = f"{type(error).__name__}: {message} (run with --debug for the traceback)"
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0


def printable(text: str) -> str:
    """``text`` with control characters, line separators and lone surrogates written as Python escapes
    (``\\x00``, ``\\x1b``, ``\\ud800``): a path read from a data file may hold any of them, and printed
    raw they would be invisible, garble the terminal or cut the one-line message in two."""
    return "".join(
        character.encode("unicode_escape").decode("ascii")
        if unicodedata.category(character) in _UNPRINTABLE
        else character
        for character in text
    )


_UNPRINTABLE = frozenset({"Cc", "Cs", "Zl", "Zp"})


class _PrintableWarnings(logging.Handler):
    """Prints each warning on one line of the current ``sys.stderr``, as logging's last resort would,
    escaped by ``printable``: a warning may quote a path or a caption from a data file."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(printable(self.format(record)), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - logging's own policy for a handler that fails
            self.handleError(record)


def _print_warnings() -> None:
    """Route the package's warnings through ``_PrintableWarnings`` (once per process)."""
    logger = logging.getLogger("captioning")
    if not any(isinstance(handler, _PrintableWarnings) for handler in logger.handlers):
        logger.addHandler(_PrintableWarnings())


_OPTION_OF = {"images": "IMAGE", "overrides": "--set", "imports": "--import"}  # options named by their dest


def _refuse_nul_bytes(args: argparse.Namespace) -> None:
    """A NUL character cannot be in a file name; say which option holds one, before any work."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, (str, Path)) and "\x00" in str(item):
                option = _OPTION_OF.get(name) or "--" + name.replace("_", "-")
                raise ConfigError(f"{option}: {str(item)!r} contains a NUL character")
