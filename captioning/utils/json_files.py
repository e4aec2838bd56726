"""The one JSON reader of the project: every JSON file it reads (annotations, results, listings, indexes,
model folders, run files) and every JSON text inside a data file goes through ``parse_json`` or
``read_json_file``, with the same bounds.

Bounds, each refused with one line naming the file (and the caller's entry), before the value is used:

- the file is a regular file (a FIFO would block the reader, a device read without end), checked
  before it is opened; at most ``max_bytes`` (``MAX_JSON_BYTES`` unless the caller says less);
- UTF-8 text;
- integers of at most ``MAX_INT_DIGITS`` digits (Python's limit, 4,300, past which it raises a
  ``ValueError`` with a traceback; each reader then bounds the numbers it takes);
- nesting of at most ``MAX_DEPTH`` arrays and objects (deeper JSON ends Python's parser, and every
  function that walks the value, in a ``RecursionError``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import numpy as np

from captioning.utils.errors import CaptioningError
from captioning.utils.files import kind_of

MAX_JSON_BYTES = 4 * 2**30  # COCO's largest annotations file is 0.45 GB
MAX_INT_DIGITS = sys.get_int_max_str_digits() or 4300  # Python's own limit, read without a traceback
MAX_DEPTH = 200
_NOT_KEPT = bytes(byte for byte in range(256) if byte not in b'[]{}"')
_QUOTE = ord('"')
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[[ord("["), ord("{")]] = 1
_BRACKET_STEP[[ord("]"), ord("}")]] = -1


class JsonError(CaptioningError, json.JSONDecodeError):
    """A JSON text or file the project cannot take: not JSON, or beyond a bound; the message is one
    line. A ``json.JSONDecodeError`` (so a ``ValueError``) for callers that catch those."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "", 0)

    def __str__(self) -> str:
        return self.msg


def _too_deep(data: bytes) -> bool:
    """Whether arrays and objects nest more than ``MAX_DEPTH`` deep in JSON ``data``.

    Escapes go first where a backslash stands before a quote (an escaped quote ends no string),
    then every byte but quotes and brackets; quotes then alternate, so a bracket after an odd number
    of them is inside a string. The depth is the running sum of +1 per opening and -1 per closing
    bracket outside strings: a few vectorised passes over what is left, a small share of the parse
    (``benchmarks/json_bound.py``).
    """
    if b'\\"' in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = np.frombuffer(data.translate(None, _NOT_KEPT), dtype=np.uint8)
    if kept.size <= MAX_DEPTH:
        return False
    steps = _BRACKET_STEP[kept]
    steps[(np.cumsum(kept == _QUOTE, dtype=np.int64) & 1).astype(bool)] = 0  # inside a string
    # Unmatched brackets may read deep or shallow here: the parser names that error.
    return int(np.cumsum(steps, dtype=np.int32).max()) > MAX_DEPTH


def parse_json(text: str | bytes) -> Any:
    """The JSON value of ``text``.

    Raises:
        JsonError: not UTF-8, not JSON, an integer beyond ``MAX_INT_DIGITS`` digits, or nesting
            beyond ``MAX_DEPTH``; the message says which, without naming the text (the caller does).
    """
    if isinstance(text, bytes):
        data = text
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise JsonError(f"not UTF-8 text (byte {error.start})") from None
    else:
        data = text.encode("utf-8", "surrogatepass")
    if _too_deep(data):
        raise JsonError(f"JSON nested too deeply (arrays and objects more than {MAX_DEPTH} deep)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise JsonError(f"not valid JSON ({error.msg} at line {error.lineno})") from None
    except RecursionError:  # not reached below MAX_DEPTH; kept for an interpreter with a tiny stack
        raise JsonError(f"JSON nested too deeply (arrays and objects more than {MAX_DEPTH} deep)") from None
    except ValueError:  # Python's int() past its limit
        raise JsonError(f"an integer of more than {MAX_INT_DIGITS} digits") from None


def read_json_file(path: str | Path, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of the file ``path``, within the module's bounds.

    Raises:
        FileNotFoundError: nothing at ``path`` (the caller says what it needed).
        JsonError: one line ``<path>: <what>``: not a regular file (checked before opening), larger
            than ``max_bytes``, unreadable, not UTF-8, not JSON, or beyond a bound.
    """
    try:
        state = os.stat(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as error:  # a NUL in the name is a ValueError
        raise JsonError(f"{path}: cannot read ({getattr(error, 'strerror', None) or error})") from None
    if not stat.S_ISREG(state.st_mode):
        raise JsonError(f"{path}: not a regular file ({kind_of(state.st_mode)})")
    if state.st_size > max_bytes:
        raise JsonError(f"{path}: {state.st_size} bytes, more than the {max_bytes} this file may have")
    try:
        with open(path, "rb") as handle:
            # read(n) reserves n bytes first: asking for the bound would take 4 GiB of address space
            # for a file of a few bytes (a MemoryError under ulimit -v). Its size, then what it grew.
            chunks = [handle.read(min(state.st_size, max_bytes) + 1)]
            size = len(chunks[0])
            while size <= max_bytes and (chunk := handle.read(min(2**24, max_bytes + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    except OSError as error:
        raise JsonError(f"{path}: cannot read ({error.strerror or error})") from None
    if len(data) > max_bytes:
        raise JsonError(f"{path}: more than the {max_bytes} bytes this file may have")
    try:
        return parse_json(data)
    except JsonError as error:
        raise JsonError(f"{path}: {error}") from None
