"""Writing a portable model folder (``model.save_pretrained``): the layout that
``captioning.hub.model_folder`` reads, with the model card and the test scores known for the checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from captioning.config import to_dict
from captioning.hub.identity import CARD, is_model_folder
from captioning.hub.model_card import model_card
from captioning.hub.model_folder import (
    CONFIG,
    FORMAT,
    SECTIONS,
    VERSION,
    VOCAB,
    WEIGHTS,
    encoder_weights_needed,
)
from captioning.utils.files import atomic_write, not_a_regular_file, replace_folder
from captioning.utils.json_files import read_json_file
from captioning.utils.output_paths import check_output_folder
from captioning.utils.run_folder import CHECKPOINTS, LOCK_NAME, RunFolderError, run_folder_of

if TYPE_CHECKING:
    from captioning.config import Config
    from captioning.data.vocab import Vocabulary
    from captioning.models.captioner import Captioner


class SavableModel(Protocol):
    """What a model folder is written from (``captioning.CaptioningModel`` is one)."""

    captioner: Captioner
    config: Config
    source: Path
    stage: str  # xe, or scst after self-critical epochs

    @property
    def vocab(self) -> Vocabulary: ...

    @property
    def grid(self) -> tuple[int, int]: ...


MODEL_FILES = (WEIGHTS, CONFIG, VOCAB, CARD)


def check_save_target(folder: Path, overwrite: bool = False) -> list[str]:
    """Refuse, before anything is written, a folder ``save_pretrained`` must not replace; return the
    names of the other entries that ``overwrite`` keeps in the new folder.

    Accepted: a new or empty folder, or a model folder holding nothing else. Refused always: a run
    folder or its ``checkpoints/`` (the run's ``vocab.json`` and checkpoints are not a model folder's
    to replace), and a model file's name held by anything but a regular file (a FIFO, a device, a
    folder). Refused unless ``overwrite``: other files beside the model's, or a ``config.json`` that
    is not a model folder's.
    """
    check_output_folder(folder, "save_pretrained")
    if not folder.is_dir():
        return []
    names = sorted(os.listdir(folder))
    run_marks = [n for n in (CHECKPOINTS, "config.yaml", "history.json", LOCK_NAME) if n in names]
    if run_marks or folder.resolve().name == CHECKPOINTS:
        what = f"holds {', '.join(run_marks)}" if run_marks else "is a run's checkpoints folder"
        raise RunFolderError(
            f"{folder}: a run folder ({what}); save_pretrained writes a model folder of its own: "
            f"give a new folder, e.g. {folder / 'model'}"
        )
    for name in MODEL_FILES:
        problem = not_a_regular_file(folder / name)
        if problem:
            raise RunFolderError(f"{folder / name}: {problem}; a model folder's files are regular files")
    others = [name for name in names if name not in MODEL_FILES]
    foreign_config = (folder / CONFIG).exists() and not _is_model_config(folder / CONFIG)
    if (others or foreign_config or (names and CONFIG not in names)) and not overwrite:
        listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        why = (
            f"holds {listed} beside a model folder's files"
            if others
            else f"its {CONFIG} is not a model folder's"
            if foreign_config
            else f"holds {', '.join(names)} but no model folder's {CONFIG}"
        )
        raise RunFolderError(
            f"{folder}: not a model folder ({why}); save_pretrained would replace "
            f"{', '.join(n for n in MODEL_FILES if n in names) or 'nothing there but adds its files'}: "
            "give a new folder, or pass overwrite=True to replace the model's files and keep the rest"
        )
    return others


def _is_model_config(path: Path) -> bool:
    try:
        description = read_json_file(path)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(description, dict) and description.get("format") == FORMAT


def save_pretrained(model: SavableModel, folder: str | Path, overwrite: bool = False) -> Path:
    """Write ``model`` as a model folder (see the module docstring), as one unit: the files are written
    into a new folder that takes the old one's place in one step (``replace_folder``), so a reader
    sees the old model or the new one, never the weights of one with the configuration of another.

    Args:
        overwrite: write into a folder that holds other files or another tool's ``config.json``
            (those of the four model files there are replaced; the other files are kept).
    Raises:
        RunFolderError: ``folder`` is a file, a run folder, cannot be written, or holds files that are
            not a model folder's (see ``check_save_target``), before anything is written.
    """
    from safetensors.torch import save

    folder = Path(folder).expanduser()  # "~/models/x" is the user's folder, never one named "~"
    others = check_save_target(folder, overwrite)
    config = model.config
    tensors = {f"decoder.{name}": value for name, value in model.captioner.decoder.state_dict().items()}
    if encoder_weights_needed(config):
        tensors.update(
            {f"encoder.{name}": value for name, value in model.captioner.encoder.state_dict().items()}
        )
    # safetensors stores no shared memory (tied embeddings): one contiguous CPU copy per name.
    tensors = {name: value.detach().to("cpu", copy=True).contiguous() for name, value in tensors.items()}
    description = model_description(model)
    scores = description["scores"]
    # The bytes are written by atomic_write itself (safetensors' save_file would rename a file of its
    # own into place, with its own permissions).
    weights = save(tensors, metadata={"format": FORMAT})
    parameters = {
        section: sum(v.numel() for k, v in tensors.items() if k.startswith(section + "."))
        for section in SECTIONS
    }
    card = model_card(
        folder.name,
        config,
        len(model.vocab),
        model.grid,
        model.captioner.encoder.channels,
        parameters,
        scores,
        model.stage,
    )

    def write(staging: Path) -> None:
        atomic_write(staging / WEIGHTS, lambda path: path.write_bytes(weights))
        write_text(staging / VOCAB, json.dumps(model.vocab.to_dict(), ensure_ascii=False))
        write_text(staging / CARD, card)
        write_text(staging / CONFIG, json.dumps(description, indent=2))

    replace_folder(folder, write, carry=others)
    return folder


def model_description(
    model: SavableModel, format_name: str = FORMAT, version: int = VERSION
) -> dict[str, Any]:
    """What a model folder's ``config.json`` holds (also the start of an ONNX export's): the format and
    its version, the full configuration, the encoder's fingerprint, the training stage and the test
    scores known for ``model.source`` (``known_scores``)."""
    return {
        "format": format_name,
        "version": version,
        "config": to_dict(model.config),
        "encoder_fingerprint": model.captioner.encoder.fingerprint(),
        "stage": model.stage,
        "scores": known_scores(model.source),
    }


def write_text(path: Path, text: str) -> None:
    """Write ``text`` and a final newline to ``path`` (UTF-8), atomically."""

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
            return read_json_file(source / CONFIG).get("scores")
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
            scores = read_json_file(candidate)
        except (OSError, ValueError):
            continue
        if not isinstance(scores, dict) or not isinstance(scores.get("signature"), str):
            continue
        digest = digest or file_hash(source)
        if parse_signature(scores["signature"]).get("ckpt") == digest:
            return {"file": candidate.name, **{k: v for k, v in scores.items() if k != "per_image"}}
    return None
