"""An ONNX export folder: what ``model.export(folder, format="onnx")`` writes and
``captioning.load(folder, runtime="onnxruntime")`` reads.

::

    folder/
      encoder.onnx, decoder_prepare.onnx, decoder_init.onnx, decoder_step.onnx
                       the graphs (``captioning.export.graphs``), each checked with onnx.checker
      config.json      what a model folder's config.json holds (format "captioning-onnx"), and
                       "onnx": the graphs' sha256, the decoder's tensors in them (``StepLayout``),
                       the attention map ``alpha`` reports and the quantisation, if any
      vocab.json       the vocabulary (the decoder's word ids)

The images' preprocessing (square resize, normalisation) is the encoder fingerprint's
(``encoder_fingerprint`` in config.json), as for the PyTorch model.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from captioning.config import Config, ConfigError
from captioning.config.loading import from_dict
from captioning.data.vocab import Vocabulary, VocabularyError
from captioning.export.graphs import GRAPHS, STEP, StepLayout, export_graphs
from captioning.hub.checkpoint import CheckpointError
from captioning.hub.model_folder import CONFIG, FORMAT, ONNX_FORMAT, VOCAB
from captioning.hub.save import model_description, write_text
from captioning.models.base import AttentionView
from captioning.utils.errors import InputError
from captioning.utils.files import atomic_write, not_a_regular_file, replace_folder
from captioning.utils.output_paths import check_output_folder
from captioning.utils.run_folder import CHECKPOINTS, LOCK_NAME, RunFolderError

if TYPE_CHECKING:
    from captioning.hub.save import SavableModel

VERSION = 1
EXPORT_FILES = (*GRAPHS, CONFIG, VOCAB)
QUANTISATIONS = ("none", "int8")


def require(module: str) -> ModuleType:
    """Import ``onnx`` or ``onnxruntime``, or stop with the one line that says how to install them."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise InputError(
            f'ONNX export and runtime need the {module} library: pip install -e ".[onnx]"'
        ) from None


@dataclass(frozen=True)
class ExportDescription:
    """What config.json says of the graphs, checked when read.

    Attributes:
        layout: the decoder's tensors in the graphs.
        view: the attention map ``alpha`` reports (``AttentionView``: layer and head, None the mean).
        label: that map in words (``Caption.attention_label``).
        quantisation: ``none``, or ``int8`` (dynamic int8 weights of the decoder step).
        hashes: file name -> sha256 of each graph.
    """

    layout: StepLayout
    view: AttentionView
    label: str
    quantisation: str
    hashes: dict[str, str]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_export_target(folder: Path, overwrite: bool) -> None:
    """Refuse, before any work, a folder the export must not replace: a run folder, a model folder or
    any folder holding other files; an earlier ONNX export only with ``overwrite``."""
    check_output_folder(folder, "export")
    if not folder.is_dir():
        return
    names = sorted(os.listdir(folder))
    if not names:
        return
    run_marks = [n for n in (CHECKPOINTS, "config.yaml", "history.json", LOCK_NAME) if n in names]
    if run_marks:
        raise RunFolderError(
            f"{folder}: a run folder (holds {', '.join(run_marks)}); export writes a folder of its own: "
            f"give a new folder, e.g. {folder / 'onnx'}"
        )
    others = [name for name in names if name not in EXPORT_FILES]
    if others or _format_of(folder / CONFIG) != ONNX_FORMAT:
        listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        why = f"holds {listed}" if others else f"its {CONFIG} is not an ONNX export's"
        raise RunFolderError(f"{folder}: not an ONNX export ({why}); give a new or empty folder")
    if not overwrite:
        raise RunFolderError(f"{folder}: holds an ONNX export already; pass overwrite=True to replace it")
    for name in EXPORT_FILES:
        problem = not_a_regular_file(folder / name)
        if problem:
            raise RunFolderError(f"{folder / name}: {problem}; an export's files are regular files")


def _format_of(path: Path) -> str | None:
    try:
        description = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return description.get("format") if isinstance(description, dict) else None


def export_onnx(
    model: SavableModel, folder: str | Path, overwrite: bool = False, quantise: str = "none"
) -> Path:
    """Write ``model`` as an ONNX export (see the module docstring), as one unit (``replace_folder``).

    The graphs are traced from a CPU copy of the model in eval mode, reporting the default attention
    map (the mean of the heads of the last layer); ``model`` itself is left as it was.

    Args:
        quantise: ``none``, or ``int8``: the decoder step's matrix products with int8 weights
            (``onnxruntime.quantization.quantize_dynamic``) for the CPU; the encoder stays float.
    Raises:
        RunFolderError: ``folder`` is a file, a run folder or holds other files (see
            ``check_export_target``), before any work.
        InputError: ``quantise`` is not one of ``QUANTISATIONS``; onnx or onnxruntime is missing.
    """
    folder = Path(folder)
    if quantise not in QUANTISATIONS:
        raise InputError(f"quantise must be one of {', '.join(QUANTISATIONS)}, got {quantise!r}")
    check_export_target(folder, overwrite)
    require("onnx")
    if quantise != "none":
        require("onnxruntime")
    captioner = copy.deepcopy(model.captioner).to("cpu").eval()
    captioner.decoder.set_attention_view(AttentionView())
    description = model_description(model, ONNX_FORMAT, VERSION)

    def write(staging: Path) -> None:
        layout = export_graphs(captioner, staging)
        if quantise == "int8":
            _quantise(staging / STEP)
        description["onnx"] = {
            "graphs": {name: _sha256(staging / name) for name in GRAPHS},
            "layout": asdict(layout),
            "attention_view": asdict(captioner.decoder.attention_view),
            "attention_label": captioner.decoder.describe_attention(),
            "quantisation": quantise,
            "torch": torch.__version__,
        }
        write_text(staging / VOCAB, json.dumps(model.vocab.to_dict(), ensure_ascii=False))
        write_text(staging / CONFIG, json.dumps(description, indent=2))

    replace_folder(folder, write)
    return folder


def _quantise(path: Path) -> None:
    """``path`` replaced by its int8 dynamic quantisation (weights of MatMul and Gemm in int8)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    def write(temporary: Path) -> None:
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)  # its advice to run shape inference first: the graph has the shapes
        try:
            quantize_dynamic(str(path), str(temporary), weight_type=QuantType.QInt8)
        finally:
            logging.disable(previous)

    atomic_write(path, write)


def read_export(folder: str | Path) -> tuple[Config, Vocabulary, dict[str, Any], ExportDescription]:
    """Read and check an ONNX export's config.json and vocab.json, and that its graphs are the ones
    config.json names.

    Returns:
        The configuration, the vocabulary, config.json as read, and what it says of the graphs.
    Raises:
        CheckpointError: a folder that is not an ONNX export, a missing or unreadable file, a graph
            whose bytes are not those config.json names, an entry of config.json with a wrong value
            (one line naming the file and the entry).
    """
    folder = Path(folder)
    if not folder.is_dir():
        what = "no such folder" if not folder.exists() else "a file, not a folder"
        raise CheckpointError(
            f"{folder}: {what}; runtime='onnxruntime' loads a folder written by model.export"
        )
    path = folder / CONFIG
    description = _read_json(path)
    kind = description.get("format") if isinstance(description, dict) else None
    if kind == FORMAT:
        raise CheckpointError(
            f"{path}: a PyTorch model folder, not an ONNX export: load it without runtime='onnxruntime', "
            "or write an export with model.export(folder, format='onnx')"
        )
    if not isinstance(description, dict) or kind != ONNX_FORMAT:
        raise CheckpointError(
            f'{path}: not an ONNX export (no "format": "{ONNX_FORMAT}"); model.export(folder, '
            "format='onnx') writes one"
        )
    if description.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: ONNX export version {description.get('version')!r:.20} is not supported "
            f"(this code reads version {VERSION})"
        )
    try:
        config = from_dict(description["config"], stored=True)
        vocab = Vocabulary.from_dict(_read_json(folder / VOCAB))
    except (ConfigError, VocabularyError, KeyError, TypeError, AttributeError, ValueError) as error:
        raise CheckpointError(f"{path}: invalid stored configuration or vocabulary ({error})") from None
    graphs = _entry(description, "onnx", dict, path)
    return config, vocab, description, _check_graphs(folder, graphs, path)


def _entry(mapping: dict, key: str, kind: type, path: Path, where: str = "") -> Any:
    value = mapping.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise CheckpointError(
            f'{path}: entry "{where}{key}" must be {kind.__name__}, got {json.dumps(value)[:40]}'
        )
    return value


def _check_graphs(folder: Path, graphs: dict, path: Path) -> ExportDescription:
    hashes = _entry(graphs, "graphs", dict, path, "onnx.")
    layout_entry = _entry(graphs, "layout", dict, path, "onnx.")
    counts = [_entry(layout_entry, key, int, path, "onnx.layout.") for key in ("prepared", "state")]
    if any(count < 1 or count > 64 for count in counts):
        raise CheckpointError(f'{path}: entry "onnx.layout" holds a count out of 1..64: {layout_entry}')
    beta = _entry(layout_entry, "beta", bool, path, "onnx.layout.")
    view_entry = _entry(graphs, "attention_view", dict, path, "onnx.")
    view = []
    for key in ("layer", "head"):
        value = view_entry.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise CheckpointError(
                f'{path}: entry "onnx.attention_view.{key}" must be an integer or null, got '
                f"{json.dumps(value)[:40]}"
            )
        view.append(value)
    label = _entry(graphs, "attention_label", str, path, "onnx.")
    quantisation = graphs.get("quantisation", "none")
    if quantisation not in QUANTISATIONS:
        raise CheckpointError(
            f'{path}: entry "onnx.quantisation" must be one of {", ".join(QUANTISATIONS)}, '
            f"got {json.dumps(quantisation)[:40]}"
        )
    for name in GRAPHS:
        graph = folder / name
        problem = not_a_regular_file(graph) or (None if graph.exists() else "file not found")
        if problem:
            raise CheckpointError(f"{graph}: {problem} (an ONNX export holds {', '.join(GRAPHS)})")
        expected = hashes.get(name)
        if not isinstance(expected, str):
            raise CheckpointError(f'{path}: entry "onnx.graphs.{name}" must be the graph\'s sha256')
        if _sha256(graph) != expected:
            raise CheckpointError(
                f"{graph}: not the graph {CONFIG} names (its sha256 differs): the export was changed "
                "after it was written; export the model again"
            )
    layout = StepLayout(counts[0], counts[1], beta)
    return ExportDescription(layout, AttentionView(*view), label, quantisation, dict(hashes))


def _read_json(path: Path) -> Any:
    problem = not_a_regular_file(path) or (None if path.exists() else "file not found")
    if problem:
        raise CheckpointError(
            f"{path}: {problem} (an ONNX export holds {', '.join(EXPORT_FILES)}; "
            "model.export(folder, format='onnx') writes them)"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None


__all__ = ["ExportDescription", "check_export_target", "export_onnx", "read_export", "require"]
