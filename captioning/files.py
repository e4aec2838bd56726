"""Reading and writing files: every file the project writes goes through ``atomic_write``, and
every file it reads is first checked by ``not_a_regular_file`` (opening a FIFO would wait forever)."""

from __future__ import annotations

import errno
import glob
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

_KINDS = {stat.S_IFREG: "a file", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def kind_of(mode: int) -> str:
    """What an ``st_mode`` is, in words: "a file", "a folder", "a FIFO", ..."""
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


def path_kind(path: str | Path) -> str | None:
    """What ``path`` is (symbolic links followed), in words; None when there is nothing there."""
    try:
        return kind_of(os.stat(path).st_mode)
    except (OSError, ValueError):  # missing, unreadable, or a name no file can have (a NUL in it)
        return None


def not_a_regular_file(path: str | Path) -> str | None:
    """``"not a regular file (a FIFO)"`` (or a folder, a socket, ...) when ``path`` exists but is not a
    regular file; None for a regular file or when nothing is there, which the caller reports its own way.

    Checked before any file the project reads is opened: opening a FIFO waits for a writer forever,
    and a device reads without end.
    """
    kind = path_kind(path)
    return None if kind in (None, "a file") else f"not a regular file ({kind})"


class NoSpaceError(ValueError):
    """The disk filled up while writing; the message is one line naming the file."""


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary_path)`` then move the result over ``path`` in one rename.

    On any error (ENOSPC included) the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A writer killed mid-write leaves ".<name>.<8 random characters>.tmp" (mkstemp's names): remove
    # exactly those, matching the name literally (a name may hold glob characters such as '*').
    leftover_name = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        if leftover_name.fullmatch(leftover.name):
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
            raise NoSpaceError(f"{path}: no space left on device while writing; "
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
