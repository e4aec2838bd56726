"""Writing files: every file the project writes goes through ``atomic_write``."""

from __future__ import annotations

import errno
import glob
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path


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
