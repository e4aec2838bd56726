"""The files of one feature cache and their checks: index, features array, row states, build lock.

Layout of the folder of one cache::

    features.npy   float16 (R, P, C), R rows allocated; a row holds the grid of one image
    state.bin      one byte per row: 0 not computed yet, 1 computed, 2 unreadable image (zeros)
    index.json     the key, R, which image (id and content identity) owns which row, the stat
                   of every file already hashed, and the messages of unreadable images
    build.lock     advisory lock held while a process adds rows

Rows are only ever appended. Every change reaches the disk in this order: the features file
grows (header rewritten, blocks reserved), then ``index.json`` is atomically replaced; computed
rows are flushed before their state bytes. So a kill at any point leaves files that the next
open either uses as they are or repairs by recomputing the rows it cannot trust.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from captioning.utils.errors import CaptioningError
from captioning.utils.files import not_a_regular_file
from captioning.utils.json_files import JsonError, parse_json

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # not POSIX: concurrent builds of one cache are not guarded
    fcntl = None

logger = logging.getLogger("captioning.data.feature_cache")

INDEX_VERSION = 2
DTYPE = np.float16
NOT_COMPUTED, COMPUTED, UNREADABLE = 0, 1, 2
_LOCK_NAME = "build.lock"
# Every file a cache's folder holds; each is opened without following a link (O_NOFOLLOW).
CACHE_FILES = ("features.npy", "state.bin", "index.json", "index.json.tmp", _LOCK_NAME)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_INDEX_FIELDS = {"version": int, "key": dict, "capacity": int, "rows": dict, "files": dict, "bad": dict}


class FeatureCacheError(CaptioningError, ValueError):
    """A feature cache's index cannot be trusted; the message names the file and says how to clear it."""


def no_space(what: Path, needed: str = "") -> OSError:
    return OSError(
        errno.ENOSPC,
        f"no space left on device writing the feature cache {what}{needed}; "
        "free space or set data.cache_dir to another disk (the previous "
        "index is intact and the build resumes from it)",
    )


def _size_text(size: int) -> str:
    """``size`` bytes for a message, in the unit that shows it (never "0.0 GiB")."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def write_json_atomic(path: Path, value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON: a crash or a full disk leaves the old file intact."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.unlink(missing_ok=True)  # a link planted there is removed, never written through
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)
        with open(descriptor, "w", encoding="utf-8") as handle:
            json.dump(value, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if error.errno == errno.ENOSPC:
            raise no_space(path) from error
        raise
    if os.name == "posix":
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # make the rename itself durable
        finally:
            os.close(directory)


def new_index(key: dict[str, Any]) -> dict[str, Any]:
    return {"version": INDEX_VERSION, "key": key, "capacity": 0, "rows": {}, "files": {}, "bad": {}}


def read_index(folder: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The validated ``index.json`` of ``folder``, or None when there is none yet.

    Raises:
        FeatureCacheError: not JSON, a missing or mistyped field, another version or key, rows
            outside the allocated range, or a capacity other than the last row + 1; the message says
            to delete the folder.
    """
    path = folder / "index.json"
    not_regular = not_a_regular_file(path)
    if not_regular is not None:
        raise _damaged(path, not_regular)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise _damaged(path, f"cannot read it ({error})") from None
    try:
        index = parse_json(text)
    except JsonError as error:
        raise _damaged(path, str(error)) from None
    if not isinstance(index, dict):
        raise _damaged(path, f"expected a JSON object, got {type(index).__name__}")
    for name, kind in _INDEX_FIELDS.items():
        if name not in index:
            raise _damaged(path, f"missing field {name!r}")
        if not isinstance(index[name], kind) or isinstance(index[name], bool):
            raise _damaged(path, f"field {name!r} must be {kind.__name__}, got {index[name]!r:.40}")
    if index["version"] != INDEX_VERSION:
        raise _damaged(path, f"written by index version {index['version']}, this code reads {INDEX_VERSION}")
    if index["key"] != key:
        raise _damaged(path, "its key is not this cache's (encoder, weights, image size, grid)")
    capacity, rows = index["capacity"], index["rows"]
    bad_rows = [
        f"{name} -> {row!r}"
        for name, row in rows.items()
        if not isinstance(row, int) or isinstance(row, bool) or not 0 <= row < capacity
    ]
    if capacity < 0 or bad_rows:
        raise _damaged(
            path, f"rows outside the {capacity} allocated ones ({bad_rows[0] if bad_rows else capacity})"
        )
    if len(set(rows.values())) != len(rows):
        raise _damaged(path, "two images own the same row")
    # Rows are handed out in order, so the last one ends the allocation: a larger capacity is not
    # one this code wrote, and acting on it would try to reserve that many rows on disk.
    if capacity != max(rows.values(), default=-1) + 1:
        raise _damaged(
            path,
            f"capacity {capacity} does not match its rows (the last is row {max(rows.values(), default=-1)})",
        )
    malformed = [
        name for name, entry in index["files"].items() if not (isinstance(entry, list) and len(entry) == 5)
    ]
    if malformed:
        raise _damaged(path, f"file entry {malformed[0]!r} is not [image id, size, mtime, ctime, identity]")
    if not all(isinstance(message, str) for message in index["bad"].values()):
        raise _damaged(path, "field 'bad' must map row keys to messages")
    return index


def _damaged(path: Path, what: str) -> FeatureCacheError:
    return FeatureCacheError(
        f"{path}: damaged feature cache index: {what}; delete the folder {path.parent} to rebuild this cache"
    )


def _npy_header(capacity: int, positions: int, channels: int) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer,
        {
            "descr": np.lib.format.dtype_to_descr(np.dtype(DTYPE)),
            "fortran_order": False,
            "shape": (capacity, positions, channels),
        },
    )
    return buffer.getvalue()


def _row_bytes(positions: int, channels: int) -> int:
    return positions * channels * np.dtype(DTYPE).itemsize


def cache_bytes(grid: tuple[int, int], channels: int, images: int) -> int:
    """The bytes of the feature rows of ``images`` images of an encoder's (gh, gw) ``grid`` and
    ``channels``: the size of a full cache's ``features.npy`` less its header."""
    return images * _row_bytes(grid[0] * grid[1], channels)


def intact_rows(folder: Path, capacity: int, positions: int, channels: int) -> tuple[int, str]:
    """How many leading rows of ``features.npy`` and ``state.bin`` can be trusted, and what is wrong.

    Returns:
        (rows, problem): ``rows`` is ``capacity`` and ``problem`` empty for an intact cache; else
        ``problem`` is one line naming the file and what is wrong with it.
    """
    for name in ("features.npy", "state.bin"):  # opening a FIFO would wait for a writer forever
        kind = not_a_regular_file(folder / name)
        if kind is not None:
            raise FeatureCacheError(
                f"{folder / name}: {kind}; delete the folder {folder} to rebuild this cache"
            )
    path = folder / "features.npy"
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran_order, dtype = read_header(handle)
            offset = handle.tell()
            size = os.fstat(handle.fileno()).st_size
    except FileNotFoundError:
        return 0, f"{path}: missing" if capacity else ""
    except (OSError, ValueError) as error:
        return 0, f"{path}: unreadable header ({error})"
    if (
        dtype != np.dtype(DTYPE)
        or fortran_order
        or len(shape) != 3
        or tuple(shape[1:]) != (positions, channels)
    ):
        return 0, f"{path}: holds {dtype} {tuple(shape)}, expected float16 (rows, {positions}, {channels})"
    if offset != len(_npy_header(capacity, positions, channels)):
        return 0, f"{path}: unexpected header length {offset}"
    whole_rows = (size - offset) // _row_bytes(positions, channels)
    rows = min(shape[0], whole_rows, capacity)
    problem = ""
    if rows < capacity:
        problem = f"{path}: " + (
            f"truncated: {size} bytes, "
            f"{capacity} rows need {offset + capacity * _row_bytes(positions, channels)}"
            if whole_rows < min(shape[0], capacity)
            else f"holds {shape[0]} rows, the index describes {capacity}"
        )
    state_path = folder / "state.bin"
    state_size = state_path.stat().st_size if state_path.exists() else 0
    if state_size < capacity and not problem:
        problem = f"{state_path}: {state_size} bytes, the index describes {capacity} rows"
    return min(rows, state_size), problem


def resize(
    folder: Path, old_capacity: int, capacity: int, positions: int, channels: int, intact: int | None = None
) -> None:
    """Make ``features.npy`` and ``state.bin`` hold ``capacity`` rows, reserving the disk space now.

    Rows from ``intact`` on (default: ``old_capacity``) are marked not computed. Writing through a
    memory map into a sparse file on a full disk kills the process with SIGBUS; reserving the
    blocks up front turns that into an ENOSPC error here, before any work is done.
    """
    intact = old_capacity if intact is None else intact
    path = folder / "features.npy"
    header = _npy_header(capacity, positions, channels)
    size = len(header) + capacity * _row_bytes(positions, channels)
    mode = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if intact == 0 else 0)
    descriptor = os.open(path, mode | _NOFOLLOW, 0o666)
    try:
        os.pwrite(descriptor, header, 0)  # same length whatever the row count: the data does not move
        try:
            os.posix_fallocate(descriptor, 0, size)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise no_space(path, f" (needs {_size_text(size)})") from error
            if error.errno == errno.EFBIG:  # beyond the file system's (or ulimit -f's) largest file
                raise FeatureCacheError(
                    f"{path}: cannot hold {capacity} rows ({size} bytes: {error.strerror})"
                ) from None
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate on this filesystem
                raise
            os.ftruncate(descriptor, max(size, os.fstat(descriptor).st_size))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    state_path = folder / "state.bin"
    descriptor = os.open(state_path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o666)
    try:
        os.ftruncate(descriptor, intact)  # drops the states of rows that cannot be trusted
        os.ftruncate(descriptor, capacity)  # new bytes read as zeros: not computed
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_states(folder: Path, capacity: int) -> np.ndarray:
    """(R,) uint8 row states (a copy); rows past the end of ``state.bin`` (or all of them, when a build
    was killed before it created the file) read as not computed."""
    states = np.zeros(capacity, dtype=np.uint8)
    if capacity and (folder / "state.bin").is_file():
        stored = np.fromfile(folder / "state.bin", dtype=np.uint8, count=capacity)
        states[: len(stored)] = stored
    return states


def mark_not_computed(folder: Path, rows: list[int]) -> None:
    """Set the state of ``rows`` to not computed (their features are computed again), durably."""
    states = np.memmap(folder / "state.bin", dtype=np.uint8, mode="r+")
    try:
        states[rows] = NOT_COMPUTED
        states.flush()
    finally:
        del states


@contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path/build.lock``, waiting (with one INFO line) if it is taken.

    ``flock`` locks die with their process, so a crashed builder never leaves the cache locked.
    """
    if fcntl is None:
        yield
        return
    descriptor = os.open(path / _LOCK_NAME, os.O_RDWR | os.O_CREAT | _NOFOLLOW | os.O_NONBLOCK, 0o666)
    locked = False
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process building the same feature cache in %s", path)
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        locked = True
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(descriptor)
            raise
        logger.warning(
            "cannot lock %s (%s): processes building this feature cache at the same time are not kept apart",
            path / _LOCK_NAME,
            error.strerror,
        )
    try:
        yield
    finally:
        if locked:  # unlock explicitly: forked DataLoader workers may still hold a copy of the descriptor
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)
