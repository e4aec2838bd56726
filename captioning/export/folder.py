"""An ONNX export folder: what ``model.export(folder, format="onnx")`` writes (``writing``) and
``captioning.load(folder, runtime="onnxruntime")`` reads (here, without torch).

::

    folder/
      encoder.onnx, decoder_prepare.onnx, decoder_init.onnx, decoder_step.onnx
                       the graphs (``captioning.export.graphs``), each checked with onnx.checker
      <graph>.data     a graph's weights kept beside it (external data: a graph past
                       ``EXTERNAL_WEIGHTS_BYTES``), only when there is one
      config.json      what a model folder's config.json holds (format "captioning-onnx"), and
                       "onnx": the sha256 of the graphs and of their external data, the decoder's
                       tensors in them (``StepLayout``), the attention map ``alpha`` reports and
                       the quantisation, if any
      vocab.json       the vocabulary (the decoder's word ids)

The images' preprocessing (square resize, normalisation) is the encoder fingerprint's
(``encoder_fingerprint`` in config.json), as for the PyTorch model. Every file is read through the
project's JSON reader (``captioning.utils.json_files``: its size and depth bounds), and every file the
graphs read is checked against the sha256 config.json names before ONNX Runtime opens any of them.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from captioning.config import Config, ConfigError
from captioning.config.loading import from_dict
from captioning.data.tokenizers import TOKENIZERS
from captioning.data.vocab import Vocabulary, VocabularyError, first_non_word
from captioning.export.layout import GRAPHS, StepLayout
from captioning.hub.identity import CONFIG, FORMAT, ONNX_FORMAT, VOCAB
from captioning.models.views import AttentionView
from captioning.utils.errors import CheckpointError, InputError
from captioning.utils.extras import extra_message
from captioning.utils.files import not_a_regular_file
from captioning.utils.json_files import JsonError, read_json_file

VERSION = 1
EXPORT_FILES = (*GRAPHS, CONFIG, VOCAB)
QUANTISATIONS = ("none", "int8")
MAX_DESCRIPTION_BYTES = 16 * 2**20  # config.json and vocab.json (a 100,000-word vocabulary: ~2 MB)
MAX_EXTERNAL_FILES = 64


def require(module: str, extra: str = "onnx") -> ModuleType:
    """Import ``onnx`` or ``onnxruntime``, or stop with the one line that says how to install them."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise InputError(extra_message(extra, "ONNX export and runtime", [module])) from None


@dataclass(frozen=True)
class ExportDescription:
    """What config.json says of the graphs, checked when read.

    Attributes:
        layout: the decoder's tensors in the graphs.
        view: the attention map ``alpha`` reports (``AttentionView``: layer and head, None the mean).
        label: that map in words (``Caption.attention_label``).
        quantisation: ``none``, or ``int8`` (dynamic int8 weights of the decoder step).
        hashes: file name -> sha256 of each graph.
        external: file name -> sha256 of each file of external data the graphs read (often none).
    """

    layout: StepLayout
    view: AttentionView
    label: str
    quantisation: str
    hashes: dict[str, str]
    external: dict[str, str]


def sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_export(path: str | Path) -> bool:
    """Whether ``path`` is a folder whose config.json says it is an ONNX export (the tools then read it
    through ``captioning.export.bridge``); a folder it cannot read is not one."""
    path = Path(path)
    if not (path / CONFIG).is_file():
        return False
    try:
        description = read_json(path / CONFIG)
    except CheckpointError:
        return False
    return isinstance(description, dict) and description.get("format") == ONNX_FORMAT


def read_export(folder: str | Path) -> tuple[Config, Vocabulary, dict[str, Any], ExportDescription]:
    """Read and check an ONNX export's config.json and vocab.json, and that its graphs (and their
    external data) are the ones config.json names.

    Returns:
        The configuration, the vocabulary, config.json as read, and what it says of the graphs.
    Raises:
        CheckpointError: a folder that is not an ONNX export, a missing or unreadable file, JSON past
            the project's bounds, a word that is empty or holds whitespace, a graph or external data
            file whose bytes are not those config.json names, a file config.json does not name, an
            entry of config.json with a wrong value (one line naming the file and the entry).
    """
    folder = Path(folder)
    if not folder.is_dir():
        what = "no such folder" if not folder.exists() else "a file, not a folder"
        raise CheckpointError(
            f"{folder}: {what}; runtime='onnxruntime' loads a folder written by model.export"
        )
    path = folder / CONFIG
    description = read_json(path)
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
    words = read_json(folder / VOCAB)
    try:
        config = from_dict(description["config"], stored=True)
        vocab = Vocabulary.from_dict(words)
    except (ConfigError, VocabularyError, KeyError, TypeError, AttributeError, ValueError) as error:
        raise CheckpointError(f"{path}: invalid stored configuration or vocabulary ({error})") from None
    _check_words(folder, config, vocab)
    graphs = _entry(description, "onnx", dict, path)
    return config, vocab, description, _check_graphs(folder, graphs, path)


def _check_words(folder: Path, config: Config, vocab: Vocabulary) -> None:
    """The rules a model folder's words follow (``captioning.hub.model_folder``): a registered
    tokenizer, and words that are neither empty nor hold whitespace."""
    if config.data.tokenizer not in TOKENIZERS:
        raise CheckpointError(
            f"{folder / CONFIG}: data.tokenizer {config.data.tokenizer!r:.60} names no registered "
            f"tokenizer (registered: {', '.join(TOKENIZERS.names())})"
        )
    found = first_non_word(vocab.itos)
    if found is not None:
        raise CheckpointError(
            f"{folder / VOCAB}: words[{found[0]}] {found[1]!r:.60} is not a word (empty or holding "
            "whitespace, where a caption's words are joined by spaces)"
        )


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
        if not isinstance(hashes.get(name), str):
            raise CheckpointError(f'{path}: entry "onnx.graphs.{name}" must be the graph\'s sha256')
        _check_hash(graph, hashes[name], "graph")
        if graph.stat().st_size == 0:  # an empty file parses as an empty graph in ONNX Runtime
            raise CheckpointError(f"{graph}: an empty file, not an ONNX graph; export the model again")
    external = _check_external(folder, graphs.get("external_data", {}), path)
    layout = StepLayout(counts[0], counts[1], beta)
    return ExportDescription(layout, AttentionView(*view), label, quantisation, dict(hashes), external)


def _check_hash(file: Path, expected: str, what: str) -> None:
    if sha256(file) != expected:
        raise CheckpointError(
            f"{file}: not the {what} {CONFIG} names (its sha256 differs): the export was changed "
            "after it was written; export the model again"
        )


def _check_external(folder: Path, entry: Any, path: Path) -> dict[str, str]:
    """The graphs' external data files: each one config.json names, unchanged; any other file in the
    folder is refused (a graph reads only files beside it, so a file not named is one nobody checked)."""
    if not isinstance(entry, dict) or len(entry) > MAX_EXTERNAL_FILES:
        raise CheckpointError(
            f'{path}: entry "onnx.external_data" must map at most {MAX_EXTERNAL_FILES} file names to '
            f"their sha256, got {json.dumps(entry)[:60]}"
        )
    for name, digest in entry.items():
        if not isinstance(digest, str) or name in EXPORT_FILES or Path(name).name != name:
            raise CheckpointError(
                f'{path}: entry "onnx.external_data" must name files beside the graphs with their '
                f"sha256, got {name!r:.60}: {json.dumps(digest)[:40]}"
            )
        file = folder / name
        problem = not_a_regular_file(file) or (None if file.exists() else "file not found")
        if problem:
            raise CheckpointError(f"{file}: {problem} ({CONFIG} names it as a graph's external data)")
        _check_hash(file, digest, "external data")
    others = sorted(set(os.listdir(folder)) - set(EXPORT_FILES) - set(entry))
    if others:
        raise CheckpointError(
            f"{folder / others[0]}: a file {CONFIG} does not name (an ONNX export holds its graphs, "
            f'their external data listed in "onnx.external_data", {CONFIG} and {VOCAB}); remove it'
        )
    return dict(entry)


def read_json(path: Path) -> Any:
    """An export's JSON file, through the project's JSON reader (size, depth and integer bounds)."""
    problem = not_a_regular_file(path) or (None if path.exists() else "file not found")
    if problem:
        raise CheckpointError(
            f"{path}: {problem} (an ONNX export holds {', '.join(EXPORT_FILES)}; "
            "model.export(folder, format='onnx') writes them)"
        )
    try:
        return read_json_file(path, MAX_DESCRIPTION_BYTES)
    except JsonError as error:  # names the file and what is wrong
        raise CheckpointError(str(error)) from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read ({error.strerror or error})") from None


__all__ = ["EXPORT_FILES", "ExportDescription", "is_export", "read_export", "read_json", "require", "sha256"]
