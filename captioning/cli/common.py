"""Shared command-line plumbing: configuration flags, dotted overrides, one-line errors."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captioning.config import Config, ConfigError
from captioning.config.loading import load_config, parse_overrides
from captioning.utils.errors import CaptioningError, InputError
from captioning.utils.extras import config_extras, option_extras, preflight
from captioning.utils.imports import import_modules
from captioning.utils.run_folder import is_run_config
from captioning.utils.text import printable

if TYPE_CHECKING:
    import torch

    from captioning.models.captioner import Captioner

# The shipped configurations are package data (``configs/`` at the repository root links here).
SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = SHIPPED_CONFIGS / "shapes.yaml"

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
    "encoder": ("model.encoder.name", str, "image encoder (backbone): %(registered)s"),
    "decoder": (
        "model.decoder.kind",
        str,
        "decoder family: %(registered)s; the file's options of another family are left out",
    ),
    "scoring": ("model.decoder.scoring", str, "attention scorer of the LSTM: %(registered)s"),
    "attention": ("model.decoder.attention", str, "soft or hard"),
    "beam_size": ("decode.beam_size", int, "beam size for decoding"),
}


# Flags whose value a registry looks up: (module, registry); --help lists the registered names.
FLAG_REGISTRIES: dict[str, tuple[str, str]] = {
    "encoder": ("captioning.models.encoders", "ENCODERS"),
    "decoder": ("captioning.config", "DECODERS"),
    "scoring": ("captioning.models.attention", "SCORERS"),
}


class RegisteredNames:
    """A registry's names for a ``--help`` text, read only when the help is printed (importing the
    registries imports torch: seconds that parsing a command line should not cost)."""

    def __init__(self, module: str, registry: str) -> None:
        self.module, self.registry = module, registry

    def __str__(self) -> str:
        module = importlib.import_module(self.module)
        names = list(getattr(module, self.registry).names())
        families = getattr(getattr(module, "registry", None), "FAMILY_FORMS", {})  # timm:<model name>, ...
        names += families.values()
        return ", ".join(names) + " or one registered by --import MODULE"


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
        action = parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=f"{text} (sets {key})",
        )
        if name in FLAG_REGISTRIES:  # the help text's %(registered)s is read from vars(action)
            vars(action)["registered"] = RegisteredNames(*FLAG_REGISTRIES[name])
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
    path = shipped_config(args.config) if args.config is not None else DEFAULT_CONFIG
    # The default file's options of another decoder or dataset than the one chosen are left out silently,
    # as are those a run's config.yaml of an older version holds (every reader's options).
    config = load_config(
        path, overrides, warn_left_out=args.config is not None, run_config=is_run_config(path)
    )
    check_registered_names(config)
    return config


def shipped_config(path: str | Path) -> Path:
    """``path`` as given, or, when no such file exists and it names a shipped configuration
    (``configs/coco_resnet101.yaml``, or the bare file name), the one installed with the package: the
    documented ``--config configs/...`` paths work from any folder and from a non-editable install."""
    given = Path(path)
    if given.exists():
        return given
    parts = given.parts
    if len(parts) == 1 or (len(parts) == 2 and parts[0] == "configs"):
        shipped = SHIPPED_CONFIGS / given.name
        if shipped.is_file():
            return shipped
    return given


def check_registered_names(config: Config) -> None:
    """Each name ``config`` looks up in a registry (encoder, decoder family and its scorer in the
    model's registries, ``data.dataset`` in ``DATASETS``, ``train.metric`` among the validation metrics
    of ``METRICS``), checked before any work; ``run_cli`` has imported the ``--import`` modules by then.

    Raises:
        ValueError: one line naming the key and listing the registered names (``UnknownNameError``).
    """
    from captioning.data.readers import DATASETS  # here: `--help` stays free of the data and metrics code
    from captioning.data.tokenizers import TOKENIZERS
    from captioning.evaluation.scorers import check_validation_metric
    from captioning.models.captioner import check_model_config

    check_model_config(config.model)
    DATASETS.check(config.data.dataset)
    TOKENIZERS.check(config.data.tokenizer)
    check_validation_metric(config.train.metric)
    check_config_extras(config)


def check_option_extras(args: argparse.Namespace) -> None:
    """The extras the flags given need (``--method``, ``--faithfulness``, ``--clip-score``, ``--serve``,
    ``--tokenizer jieba|mecab``), checked before the command's first step.

    Raises:
        MissingExtraError: one line naming the flag and the extra that installs what it needs.
    """
    flags = ("method", "faithfulness", "clip_score", "serve", "tokenizer")
    preflight(option_extras(**{flag: getattr(args, flag, None) for flag in flags}))


def check_config_extras(
    config: Config, encoder: bool = True, tokenizer: bool = True, dataset: bool = True
) -> None:
    """The extras ``config``'s encoder (``timm:``, ``open_clip:``), tokenizer (jieba, mecab) and dataset
    (webdataset) need, checked before any data is read or model built; ``encoder``, ``tokenizer`` or
    ``dataset`` False leaves that part out (a tool that does not use it).

    Raises:
        MissingExtraError: one line naming the key and the extra that installs what it needs.
    """
    preflight(
        config_extras(
            encoder=config.model.encoder.name if encoder else None,
            tokenizer=config.data.tokenizer if tokenizer else None,
            dataset=config.data.dataset if dataset else None,
        )
    )


def given_keys(args: argparse.Namespace) -> set[str]:
    """The configuration keys this command line sets, by flag or ``--set`` (not by ``--config``)."""
    given = set(parse_overrides(args.overrides))
    given.update(key for name, (key, _, _) in FLAG_KEYS.items() if getattr(args, name, None) is not None)
    return given


# What run_cli prints as one line; anything else keeps its traceback.
EXPECTED_ERRORS = (CaptioningError, OSError)  # a bare ValueError is a bug: see run_cli


def run_cli(
    main: Callable[[argparse.Namespace], Any], parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> int:
    """Parse, run ``main(args)``; expected failures print one line ``error: ...`` and exit 2.

    Expected failures are the project's errors (``CaptioningError``: every problem with what a tool
    was given is raised as one, where the file or value is read) and an ``OSError`` met reading or
    writing a file. Anything else is a bug, a bare ``ValueError`` from torch or from a module passed
    with ``--import`` included: it prints Python's traceback, then one line saying so, exit status 1.

    An exception with an ``exit_status`` attribute is a deliberate stop that ``main`` has already
    reported (``captioning.training.stopping.TrainingStopped``, exit status 75): it exits with
    that status and no error line.
    """
    args = parser.parse_args(argv)
    _print_warnings()
    try:
        _refuse_nul_bytes(args)
        import_modules(getattr(args, "imports", None) or [])
        check_option_extras(args)
        main(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        exit_status = getattr(error, "exit_status", None)
        if isinstance(exit_status, int):
            return exit_status
        first_line = printable((str(error).strip().split("\n") or [""])[0])
        if isinstance(error, EXPECTED_ERRORS):  # a problem with the input: one clear line
            if getattr(args, "debug", False):
                traceback.print_exc()
            print(f"error: {first_line}", file=sys.stderr)
            return 2
        # A bug (here, in torch or in an --import module): where it happened matters more than a line.
        traceback.print_exc()
        print(
            f"error: {type(error).__name__}: {first_line}\n"
            "This is not a problem with the input: the traceback above shows where it happened "
            "(in the package, in torch, or in a module passed with --import).",
            file=sys.stderr,
        )
        return 1
    return 0


class _PrintableWarnings(logging.Handler):
    """Prints each warning on one line of the current ``sys.stderr``, as logging's last resort would,
    escaped by ``printable``: a warning may quote a path or a caption from a data file."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(printable(self.format(record)), file=sys.stderr, flush=True)
        except Exception:  # logging's own policy for a handler that fails
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


def checkpoint_to_read(path: str | Path) -> Path:
    """``--checkpoint`` / ``--serve`` as ``captioning.load`` reads it: a run folder stands for the
    checkpoint its test scores came from (said in one line); a file or model folder as given."""
    from captioning.hub.checkpoint import model_path

    chosen = model_path(path)
    if chosen != Path(path):
        print(f"checkpoint: {chosen} (the one the test scores of {path} came from)", flush=True)
    return chosen


def refuse_export_for_attribution(checkpoint: str | Path, option: str) -> None:
    """Attribution methods need the PyTorch model's gradients: an ONNX export given with ``option``
    (``--faithfulness``, ``--method``) is refused, before any work.

    Raises:
        InputError: naming the option, the folder and what to pass instead.
    """
    from captioning.export.folder import is_export

    if is_export(checkpoint):
        raise InputError(
            f"{option} needs gradients: {checkpoint} is an ONNX export, which captions, scores and draws "
            "attention only; give the checkpoint or model folder it was exported from"
        )


def load_for_tool(path: Path, device: str) -> tuple[Captioner, Config, str | None, torch.device]:
    """The captioner ``--checkpoint`` names for ``evaluate.py`` and ``visualize.py``: a checkpoint or a
    model folder on ``device``, or an ONNX export run by ONNX Runtime through its graphs on the CPU;
    also its configuration, its self-critical reward (None after cross-entropy only), and the device
    it runs on.

    Raises:
        InputError: an ONNX export with ``--device`` naming a GPU.
        CheckpointError: as ``captioning.load``.
    """
    import torch

    from captioning.config import reward_description
    from captioning.export.folder import is_export
    from captioning.inference.captioner import load_trained_captioner
    from captioning.utils.device import resolve_device

    if not is_export(path):
        torch_device = resolve_device(device)
        return (*load_trained_captioner(path, torch_device), torch_device)
    if device not in ("auto", "cpu"):
        raise InputError(
            f"--device {device!r}: {path} is an ONNX export, run by ONNX Runtime on the CPU; "
            "leave --device out or pass --device cpu"
        )
    from captioning.export.bridge import torch_captioner

    captioner, config, stage = torch_captioner(path)
    reward = reward_description(config.train) if stage == "scst" else None
    return captioner, config, reward, torch.device("cpu")
