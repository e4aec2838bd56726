"""Reading tensors from a file without running code: every checkpoint, model folder and encoder
weights file is read here.

A ``.safetensors`` file is read with safetensors (no pickle at all); any other file is a
``torch.save`` file, read with ``torch.load(weights_only=True)``, so that a file from a stranger
holding other pickled objects is refused, never executed. A file that cannot be read is one line
naming it: refused objects, a failed CRC check of a zip member (``torch.load`` does not look), a
truncated or corrupt file.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from captioning.utils.errors import CaptioningError

__all__ = ["StateFileError", "read_state_file"]


class StateFileError(CaptioningError, ValueError):
    """A file of tensors cannot be read; the message is one line naming the file."""


def read_state_file(path: str | Path, what: str, map_location: str | torch.device = "cpu") -> Any:
    """What ``path`` holds: a safetensors file's ``{name: tensor}``, or a ``torch.save`` file's
    payload of tensors and plain types (a state dict, a checkpoint).

    Args:
        path: an existing regular file (callers check that first, with their own wording).
        what: what the file is, for the messages (``checkpoint``, ``safetensors file``).
        map_location: where the tensors are put.
    Raises:
        StateFileError: ``<path>: refused: the <what> holds objects other than tensors and plain
            types (...)``, ``<path>: corrupt <what>: <member> fails its CRC check`` or
            ``<path>: truncated or corrupt <what> (...)``.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device=str(map_location))
        except (SafetensorError, OSError, ValueError) as error:
            raise StateFileError(f"{path}: truncated or corrupt {what} ({error})") from None
    _check_crc(path, what)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise StateFileError(
            f"{path}: refused: the {what} holds objects other than tensors and plain "
            f"types ({_unpickling_detail(error)})"
        ) from None
    except Exception as error:  # zip, IO and unpickling errors alike (a text file: KeyError)
        # a KeyError's text is the bare key (``101``): its name says more
        detail = (not isinstance(error, LookupError) and _first_sentence(str(error))) or type(error).__name__
        raise StateFileError(f"{path}: truncated or corrupt {what} ({detail})") from None


def _check_crc(path: Path, what: str) -> None:
    """Refuse a ``torch.save`` file whose zip members fail their CRC check (torch.load does not look)."""
    if not zipfile.is_zipfile(path):
        return  # not a zip at all: torch.load says so
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise StateFileError(f"{path}: truncated or corrupt {what} ({_first_sentence(str(error))})") from None
    if damaged is not None:
        raise StateFileError(f"{path}: corrupt {what}: {damaged} fails its CRC check")


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
