"""The optional extras of setup.cfg: which modules each installs and what they enable, in one table that
every check before work and the README's list of extras come from.

A command that needs an extra checks it before its first step (``preflight``), with one line naming the
extra: ``visualize.py --method ...`` without captum stops before the model is loaded, not after the
split is decoded. Whether a module is there is asked of the import system (``importlib.util.find_spec``)
without importing it: captum, gradio and open_clip take seconds to import.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from captioning.utils.errors import CaptioningError, MissingExtraError


@dataclass(frozen=True)
class Extra:
    """One extra of setup.cfg.

    Attributes:
        modules: the top-level modules it installs that the code imports (all must be importable).
        enables: what it enables, in the words the README's list uses.
    """

    modules: tuple[str, ...]
    enables: str


# setup.cfg's [options.extras_require], less the developer's ``test``: the README lists these, in this
# order, with these words (tests/project/test_extras.py holds the three to each other).
EXTRAS: dict[str, Extra] = {
    "demo": Extra(("gradio", "gradio_client"), "the live demo (`visualize.py --serve`)"),
    "explain": Extra(
        ("captum",), "gradient attribution methods (`--method`, `--faithfulness`, `model.explain`)"
    ),
    "onnx": Extra(("onnx", "onnxruntime"), 'ONNX export and `runtime="onnxruntime"`'),
    "onnx-runtime": Extra(("onnxruntime",), '`runtime="onnxruntime"` alone, without torch'),
    "timm": Extra(("timm",), "`timm:` encoders"),
    "clip": Extra(("open_clip",), "`open_clip:` encoders and `--clip-score`"),
    "zh": Extra(("jieba",), "`data.tokenizer=jieba`"),
    "ja": Extra(("fugashi", "unidic_lite"), "`data.tokenizer=mecab`"),
    "webdataset": Extra(("webdataset",), "`data.dataset=webdataset`"),
    "docs": Extra(("mkdocs", "material"), "the documentation site (mkdocs)"),
}

# The shipped attribution methods that call captum (``captioning.explain.methods``); the others
# (attention, occlusion, the Transformer's rules) and a user's own run without it.
CAPTUM_METHODS = frozenset({"gradient", "integrated_gradients", "gradcam"})
# Configuration values that need an extra: encoder families by their prefix, tokenizers, datasets.
ENCODER_FAMILIES = {"timm": "timm", "open_clip": "clip"}
TOKENIZER_EXTRAS = {"jieba": "zh", "mecab": "ja"}
DATASET_EXTRAS = {"webdataset": "webdataset"}


def _importable(module: str) -> bool:
    """Whether ``import module`` can find it, without running it (a ``None`` entry in
    ``sys.modules`` is Python's way of blocking an import)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (empty when it is installed)."""
    return [module for module in EXTRAS[extra].modules if not _importable(module)]


def extra_message(extra: str, setting: str, modules: Iterable[str] | None = None) -> str:
    """The one line that says ``setting`` needs ``extra``: ``--method needs captum: pip install -e
    ".[explain]"``."""
    names = list(modules) if modules is not None else list(EXTRAS[extra].modules)
    return f'{setting} needs {", ".join(names)}: pip install -e ".[{extra}]"'


def preflight(needs: Iterable[tuple[str, str]], error: type[CaptioningError] = MissingExtraError) -> None:
    """Check, before any work, that every ``(extra, setting)`` of ``needs`` is installed.

    Raises:
        MissingExtraError (or ``error``): the first setting whose extra is missing, in one line naming
            the setting, the missing modules and the extra that installs them.
    """
    for extra, setting in needs:
        missing = missing_modules(extra)
        if missing:
            raise error(extra_message(extra, setting, missing))


def config_extras(
    encoder: str | None = None, tokenizer: str | None = None, dataset: str | None = None
) -> list[tuple[str, str]]:
    """The ``(extra, setting)`` pairs that configuration values need: an encoder ``timm:...`` or
    ``open_clip:...``, ``data.tokenizer`` jieba or mecab, ``data.dataset`` webdataset."""
    needs = []
    if encoder is not None and ":" in encoder:
        family = encoder.partition(":")[0]
        if family in ENCODER_FAMILIES:
            needs.append((ENCODER_FAMILIES[family], f"model.encoder.name {encoder!r}"))
    if tokenizer in TOKENIZER_EXTRAS:
        needs.append((TOKENIZER_EXTRAS[tokenizer], f"data.tokenizer={tokenizer}"))
    if dataset in DATASET_EXTRAS:
        needs.append((DATASET_EXTRAS[dataset], f"data.dataset={dataset}"))
    return needs


def option_extras(
    method: str | None = None,
    faithfulness: str | None = None,
    clip_score: str | None = None,
    serve: str | None = None,
    tokenizer: str | None = None,
) -> list[tuple[str, str]]:
    """The ``(extra, flag)`` pairs the command-line flags given need (None: the flag was not given);
    ``--method`` and ``--faithfulness`` need captum when they name a method of ``CAPTUM_METHODS``, or
    all of them (``--faithfulness`` alone)."""
    needs = []
    for flag, value in (("--method", method), ("--faithfulness", faithfulness)):
        names = {name.strip() for name in (value or "").split(",")}
        if value == "default" or names & CAPTUM_METHODS:  # default: every method that fits the model
            needs.append(("explain", flag))
    if clip_score is not None:
        needs.append(("clip", "--clip-score"))
    if serve is not None:
        needs.append(("demo", "--serve"))
    if tokenizer in TOKENIZER_EXTRAS:
        needs.append((TOKENIZER_EXTRAS[tokenizer], f"--tokenizer {tokenizer}"))
    return needs
