"""Writing a portable model folder (``model.save_pretrained``): the layout that
``captioning.hub.model_folder`` reads, with the model card and the test scores known for the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from captioning.config import to_dict
from captioning.hub.model_card import model_card
from captioning.hub.model_folder import (
    CARD,
    CONFIG,
    FORMAT,
    SECTIONS,
    VERSION,
    VOCAB,
    WEIGHTS,
    encoder_weights_needed,
    is_model_folder,
)
from captioning.utils.files import atomic_write
from captioning.utils.output_paths import check_output_folder
from captioning.utils.run_folder import CHECKPOINTS, run_folder_of

if TYPE_CHECKING:
    from captioning.config import Config
    from captioning.data.vocab import Vocabulary
    from captioning.models.captioner import Captioner


class SavableModel(Protocol):
    """What a model folder is written from (``captioning.CaptioningModel`` is one)."""

    captioner: Captioner
    config: Config
    source: Path

    @property
    def vocab(self) -> Vocabulary: ...

    @property
    def grid(self) -> tuple[int, int]: ...


def save_pretrained(model: SavableModel, folder: str | Path) -> Path:
    """Write ``model`` as a model folder (see the module docstring); files are replaced atomically.

    Raises:
        RunFolderError: ``folder`` is a file or cannot be written (before anything is written).
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    check_output_folder(folder, "save_pretrained")
    config = model.config
    tensors = {f"decoder.{name}": value for name, value in model.captioner.decoder.state_dict().items()}
    if encoder_weights_needed(config):
        tensors.update(
            {f"encoder.{name}": value for name, value in model.captioner.encoder.state_dict().items()}
        )
    # safetensors stores no shared memory (tied embeddings): one contiguous CPU copy per name.
    tensors = {name: value.detach().to("cpu", copy=True).contiguous() for name, value in tensors.items()}
    scores = known_scores(model.source)
    description = {
        "format": FORMAT,
        "version": VERSION,
        "config": to_dict(config),
        "encoder_fingerprint": model.captioner.encoder.fingerprint(),
        "scores": scores,
    }
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / WEIGHTS, lambda path: save_file(tensors, str(path), metadata={"format": FORMAT}))
    _write_text(folder / CONFIG, json.dumps(description, indent=2))
    _write_text(folder / VOCAB, json.dumps(model.vocab.to_dict(), ensure_ascii=False))
    parameters = {
        section: sum(v.numel() for k, v in tensors.items() if k.startswith(section + "."))
        for section in SECTIONS
    }
    _write_text(
        folder / CARD,
        model_card(
            folder.name,
            config,
            len(model.vocab),
            model.grid,
            model.captioner.encoder.channels,
            parameters,
            scores,
        ),
    )
    return folder


def _write_text(path: Path, text: str) -> None:
    def write(temporary: Path) -> None:
        temporary.write_text(text + "\n", encoding="utf-8")

    atomic_write(path, write)


def known_scores(source: str | Path) -> dict[str, Any] | None:
    """The test scores of ``source`` with their signature, when known: a model folder's own, or the
    ``test_scores.json`` / ``eval_<stem>_test_scores.json`` of the run folder a checkpoint sits in
    whose signature names this very checkpoint file (``ckpt`` field); else None."""
    from captioning.hub.identity import file_hash, parse_signature

    source = Path(source)
    if is_model_folder(source):
        try:
            return json.loads((source / CONFIG).read_text(encoding="utf-8")).get("scores")
        except (OSError, ValueError, AttributeError):
            return None
    if source.resolve().parent.name != CHECKPOINTS:
        return None
    run = run_folder_of(source)
    digest = None
    for candidate in (run / "test_scores.json", run / f"eval_{source.stem}_test_scores.json"):
        if not candidate.is_file():
            continue
        try:
            scores = json.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(scores, dict) or not isinstance(scores.get("signature"), str):
            continue
        digest = digest or file_hash(source)
        if parse_signature(scores["signature"]).get("ckpt") == digest:
            return {"file": candidate.name, **{k: v for k, v in scores.items() if k != "per_image"}}
    return None
