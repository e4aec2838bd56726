"""A portable model folder: what ``model.save_pretrained(folder)`` writes and ``captioning.load(folder)``
reads.

::

    folder/
      model.safetensors   the weights, no pickle: ``decoder.*``, and ``encoder.*`` when the encoder's
                          weights cannot be rebuilt from their name (fine-tuned, or random)
      config.json         {"format": "captioning-model", "version": 1, "config": the full configuration,
                           "encoder_fingerprint": what the decoder was trained on, "stage": the training
                           the weights had (xe, or scst after self-critical epochs), "scores": test
                           scores with their signature, or null}
      vocab.json          the vocabulary (the decoder's word ids)
      README.md           the model card: encoder, decoder, data, test scores, how to load it

Nothing else is needed to use it: no run folder, no data root, no feature cache. Published
encoder weights (``model.encoder.weights: pretrained``) are not copied: they are resolved as
training resolves them (the efficientnet-lite0 package, the torch hub cache).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from captioning.config import Config
from captioning.data.tokenizers import TOKENIZERS
from captioning.data.vocab import first_non_word
from captioning.hub.checkpoint import FORMAT as CHECKPOINT_FORMAT
from captioning.hub.checkpoint import VERSION as CHECKPOINT_VERSION
from captioning.hub.checkpoint import CheckpointError, check_payload, scored_checkpoint
from captioning.hub.identity import CONFIG, FORMAT, ONNX_FORMAT, VOCAB, WEIGHTS
from captioning.utils.files import not_a_regular_file
from captioning.utils.json_files import read_json_file
from captioning.utils.run_folder import CHECKPOINTS
from captioning.utils.state_files import StateFileError, read_state_file

VERSION = 1
SECTIONS = ("decoder", "encoder")  # weight names are "<section>.<parameter>"


def encoder_weights_needed(config: Config) -> bool:
    """Whether the encoder's weights must travel with the model: fine-tuned or random ones cannot be
    rebuilt from their name (training saves them in checkpoints by the same rule)."""
    encoder = config.model.encoder
    return bool(encoder.fine_tune_stages) or encoder.weights == "none"


def load_folder(folder: str | Path) -> dict[str, Any]:
    """Read a model folder as the payload ``load_checkpoint`` returns for a checkpoint file (sections
    ``config``, ``vocab``, ``decoder``, ``encoder``, ``encoder_fingerprint``), checked the same way.

    Raises:
        CheckpointError: a missing or unreadable file, a folder written by another tool, or weights
            that are not finite tensors (one line naming the file).
    """
    folder = Path(folder)
    checkpoints = sorted((folder / CHECKPOINTS).glob("*.pt")) if not (folder / CONFIG).exists() else []
    if checkpoints:
        raise CheckpointError(
            f"{folder}: a run folder, not a model folder: give one of its checkpoints, e.g. "
            f"{scored_checkpoint(folder)} (the one its test scores came from, as captioning.load picks)"
        )
    description = _read_json(folder, CONFIG)
    if isinstance(description, dict) and description.get("format") == ONNX_FORMAT:
        raise CheckpointError(
            f"{folder / CONFIG}: an ONNX export, which holds no PyTorch weights: load it with "
            "captioning.load(folder, runtime='onnxruntime')"
        )
    if not isinstance(description, dict) or description.get("format") != FORMAT:
        raise CheckpointError(
            f'{folder / CONFIG}: not a captioning model folder (no "format": "{FORMAT}"; '
            "save_pretrained writes config.json, vocab.json, model.safetensors and README.md)"
        )
    if description.get("version") != VERSION:
        raise CheckpointError(
            f"{folder / CONFIG}: model folder version {description.get('version')} is not "
            f"supported (this code reads version {VERSION})"
        )
    stored = description.get("config")
    model = stored.get("model") if isinstance(stored, dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("encoder", {}), dict):
        raise CheckpointError(
            f'{folder / CONFIG}: "config" must hold the configuration\'s sections ("model" with its '
            f'"encoder" and "decoder"), got {json.dumps(stored)[:60]}'
        )
    vocab = _read_json(folder, VOCAB)
    weights = folder / WEIGHTS
    problem = not_a_regular_file(weights) or (None if weights.exists() else "file not found")
    if problem:
        raise CheckpointError(f"{weights}: {problem} (a model folder holds its weights there)")
    try:
        tensors = read_state_file(weights, "safetensors file")
    except StateFileError as error:
        raise CheckpointError(str(error)) from None
    sections: dict[str, dict[str, torch.Tensor]] = {section: {} for section in SECTIONS}
    for name, value in tensors.items():
        section, _, parameter = name.partition(".")
        if section not in sections or not parameter:
            raise CheckpointError(
                f"{weights}: weight {name!r} belongs to neither the decoder nor the encoder"
            )
        sections[section][parameter] = value
    encoder = ((description.get("config") or {}).get("model") or {}).get("encoder") or {}
    if not sections["encoder"] and (encoder.get("fine_tune_stages") or encoder.get("weights") == "none"):
        raise CheckpointError(
            f"{weights}: holds no encoder weights, but this model's encoder (fine-tuned or "
            "random) cannot be rebuilt without them"
        )
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": description.get("config"),
        "vocab": vocab,
        "decoder": sections["decoder"],
        "encoder": sections["encoder"] or None,
        "encoder_fingerprint": description.get("encoder_fingerprint"),
        "training": None,
        "stage": description.get("stage") if description.get("stage") in ("xe", "scst") else None,
    }
    check_payload(payload, weights)
    _check_words(folder, payload)
    return payload


def _check_words(folder: Path, payload: dict[str, Any]) -> None:
    """Refuse a folder whose tokenizer is not registered, or whose vocabulary holds a word that is empty
    or holds whitespace (a caption's words are joined by spaces: ``'a b'`` would read as two words
    and ``''`` as none). Checked here, where a folder is read, not where a vocabulary is built."""
    data = (payload["config"] or {}).get("data") or {}
    name = data.get("tokenizer", "ptb") if isinstance(data, dict) else "ptb"
    if isinstance(name, str) and name not in TOKENIZERS:
        raise CheckpointError(
            f"{folder / CONFIG}: data.tokenizer {name!r:.60} names no registered tokenizer (registered: "
            f"{', '.join(TOKENIZERS.names())}; one of your own: captioning.load(..., imports=[MODULE]), "
            "--import MODULE)"
        )
    words = payload["vocab"].get("words") if isinstance(payload["vocab"], dict) else None
    found = first_non_word(words if isinstance(words, list) else [])
    if found is not None:
        index, word = found
        raise CheckpointError(
            f"{folder / VOCAB}: words[{index}] {word!r:.60} is not a word (empty or holding "
            "whitespace, where a caption's words are joined by spaces)"
        )


def _read_json(folder: Path, name: str) -> Any:
    path = folder / name
    problem = not_a_regular_file(path) or (None if path.exists() else "file not found")
    if name == CONFIG and not path.exists():
        raise CheckpointError(
            f"{folder}: a folder but not a model folder: no {CONFIG} (save_pretrained writes "
            "config.json, vocab.json, model.safetensors and README.md)"
        )
    if problem:
        what = "not a captioning model folder" if name == CONFIG else "incomplete model folder"
        raise CheckpointError(
            f"{path}: {problem} ({what}: save_pretrained writes config.json, vocab.json, "
            "model.safetensors and README.md)"
        )
    try:
        return read_json_file(path)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None
