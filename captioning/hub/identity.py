"""What identifies a saved model and the scores it earned: the hash of its weights file, and the
fields of a scores file's signature (``key:value|...``, written by ``captioning.evaluation.signature``)."""

from __future__ import annotations

from pathlib import Path

_DIGITS = 12  # hex digits of a sha256 kept in a signature field
WEIGHTS = "model.safetensors"  # a model folder's weights file (captioning.hub.model_folder)
CONFIG, VOCAB, CARD = "config.json", "vocab.json", "README.md"  # the model folder's other files
EXPORT_GRAPH = "encoder.onnx"  # a graph every ONNX export holds (captioning.export.layout.ENCODER)
FORMAT = "captioning-model"  # config.json's "format" in a model folder (captioning.hub.model_folder)
ONNX_FORMAT = "captioning-onnx"  # ... in an ONNX export (model.export(folder, format="onnx"))


def is_model_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder (``captioning.load`` then reads it as a model folder)."""
    return Path(path).is_dir()


def weights_file(path: str | Path) -> Path:
    """The file whose bytes identify a model: a checkpoint itself, a model folder's weights, or an ONNX
    export's config.json (it holds the sha256 of every graph and weights file of the export)."""
    if not is_model_folder(path):
        return Path(path)
    folder = Path(path)
    return (
        folder / CONFIG
        if (folder / EXPORT_GRAPH).exists() and not (folder / WEIGHTS).exists()
        else folder / WEIGHTS
    )


def file_hash(path: str | Path) -> str:
    """sha256 (first 12 hex digits) of a file's bytes; of a model folder's weights file for a folder."""
    from captioning.models.encoders import file_identity  # torch: not needed to read a folder's names

    return file_identity(weights_file(path))["sha256"][:_DIGITS]


def parse_signature(signature: str) -> dict[str, str]:
    """``key:value|...`` -> ``{key: value}`` (an empty signature gives ``{}``)."""
    fields = {}
    for part in filter(None, signature.split("|")):
        key, _, value = part.partition(":")
        fields[key] = value
    return fields
