"""Checkpoints: one file with weights, configuration, vocabulary and training state.

Only tensors and plain Python types go in, so every checkpoint loads with
``torch.load(weights_only=True)``: a checkpoint from a stranger cannot run code. Writes are
atomic (temporary file, fsync, rename), so a crash or a full disk while writing leaves the
previous checkpoint whole.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import re
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.config import Config, ConfigError, from_dict, to_dict
from captioning.data.vocab import Vocabulary, VocabularyError

FORMAT = "captioning-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint cannot be written or used; the message is one line naming the file."""


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary_path)`` then move the result over ``path`` in one rename.

    On any error (ENOSPC included) the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):  # from a writer killed mid-write
        leftover.unlink(missing_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        write(Path(temporary))
        with open(temporary, "rb") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise CheckpointError(f"{path}: no space left on device while writing; "
                                  "the previous file is intact") from error
        raise
    try:  # make the rename itself durable
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:
        pass


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch random states as checkpoint-safe values."""
    numpy_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` saved."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | Path, *, config: Config, vocab: Vocabulary, decoder_state: dict,
                    encoder_state: dict | None = None, encoder_fingerprint: dict | None = None,
                    training: dict | None = None) -> None:
    """Write a checkpoint atomically.

    Args:
        config: the run's full configuration (rebuilds the model).
        vocab: the vocabulary the decoder's ids refer to.
        decoder_state: ``decoder.state_dict()``.
        encoder_state: the encoder's weights when they were fine-tuned (else rebuilt from config).
        encoder_fingerprint: ``encoder.fingerprint()``, to check features match at load time.
        training: optimizer/scheduler/epoch/step/RNG state for ``--resume``.
    """
    payload = {
        "format": FORMAT, "version": VERSION, "config": to_dict(config), "vocab": vocab.to_dict(),
        "decoder": decoder_state, "encoder": encoder_state, "encoder_fingerprint": encoder_fingerprint,
        "training": training,
    }
    atomic_write(path, lambda temporary: torch.save(payload, temporary))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True`` and check its layout.

    Raises:
        CheckpointError: missing, truncated, not a checkpoint of this project, or containing
            pickled objects other than tensors and plain types (refused, never executed).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"{path}: refused: the checkpoint holds objects other than tensors and plain "
                              f"types ({_unpickling_detail(error)})") from None
    except (EOFError, RuntimeError, zipfile.BadZipFile, OSError, ValueError) as error:
        detail = _first_sentence(str(error)) or type(error).__name__
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({detail})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a captioning checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {payload.get('version')} is not supported "
                              f"(this code reads version {VERSION})")
    for key in ("config", "vocab", "decoder"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{path}: checkpoint has no '{key}' section")
    return payload


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _first_sentence(text: str, limit: int = 160) -> str:
    """The first sentence of an error message, on one line, without terminal colour codes."""
    text = " ".join(_ANSI_ESCAPE.sub("", text).split())
    return text.split(". ")[0].rstrip(".")[:limit]


def _unpickling_detail(error: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler refused (``Unsupported global: GLOBAL os.system ...``).

    torch's message starts with advice to load the file with ``weights_only=False``; for a file from
    a stranger that is exactly what must not happen, so only the refused object is reported.
    """
    text = _ANSI_ESCAPE.sub("", str(error))
    match = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    return _first_sentence(match.group(1) if match else text) or "unsupported object"


def checkpoint_config(payload: dict[str, Any], path: str | Path = "checkpoint") -> tuple[Config, Vocabulary]:
    """The configuration and vocabulary stored in a loaded checkpoint."""
    try:
        return from_dict(payload["config"]), Vocabulary.from_dict(payload["vocab"])
    except (ConfigError, VocabularyError) as error:
        raise CheckpointError(f"{path}: invalid stored configuration or vocabulary ({error})") from None


def load_state_checked(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str, path: str | Path) -> None:
    """``load_state_dict(strict=True)`` with a one-line message saying what differs."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
                  for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else ""))
    if unexpected:
        problems.append(f"unexpected {', '.join(unexpected[:3])}" + (" ..." if len(unexpected) > 3 else ""))
    if mismatched:
        problems.append(f"shape {', '.join(mismatched[:3])}" + (" ..." if len(mismatched) > 3 else ""))
    if problems:
        raise CheckpointError(f"{path}: {what} weights do not fit the model configuration: {'; '.join(problems)}")
    module.load_state_dict(state, strict=True)
