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

from captioning.utils.errors import CaptioningError

_KINDS = {
    stat.S_IFREG: "a file",
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


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


def same_file(first: str | Path, second: str | Path) -> bool:
    """Whether two paths name one existing file, however they are spelled (``a/../b``, a link, relative
    and absolute); a path where nothing is yet names no file."""
    try:
        return os.path.samefile(first, second)
    except (OSError, ValueError):
        return False


class NoSpaceError(CaptioningError, ValueError):
    """The disk filled up while writing; the message is one line naming the file."""


class NotReplacedError(CaptioningError, OSError):
    """An output path holds something no file may replace (a folder, a socket, a block device)."""


# Written into where they stand, never replaced by a file: /dev/null, /dev/full, a terminal, a pipe
# (``--out /dev/stdout``, ``--out >(jq .)``), a FIFO the user made.
IN_PLACE_KINDS = ("a character device", "a FIFO")
# Paths that name a file descriptor the shell opened: written in place even when it is a regular file
# (``--out /dev/stdout > scores.json``), since renaming over them would replace the link, not the output.
_DESCRIPTOR_PREFIXES = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/")


def user_umask() -> int:
    """The process's umask (read without changing it where ``/proc`` says it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: the classic read-and-restore
    os.umask(mask)
    return mask


def writes_in_place(path: str | Path) -> bool:
    """Whether ``atomic_write`` writes into ``path`` where it stands: a character device, a FIFO, or a
    shell's descriptor (``/dev/stdout``, ``/dev/fd/N``); no second file belongs beside such a path."""
    kind = path_kind(path)
    return kind in IN_PLACE_KINDS or (
        kind is not None and os.path.abspath(path).startswith(_DESCRIPTOR_PREFIXES)
    )


def output_kind(path: str | Path) -> str | None:
    """How ``atomic_write`` writes ``path``: None (a new file), "replaced" (a regular file, renamed over),
    "in place" (a character device, a FIFO or a shell's descriptor, written into).

    Raises:
        NotReplacedError: ``path`` is a folder, a socket or a block device.
    """
    if writes_in_place(path):
        return "in place"
    kind = path_kind(path)
    if kind not in (None, "a file"):
        raise NotReplacedError(f"{path}: is {kind}; an output is never written over one, give a file name")
    return "replaced" if kind == "a file" else None


def output_note(path: str | Path) -> str:
    """What writing ``path`` now does to what stands there, for a tool's summary: ``""`` for a new file."""
    kind = output_kind(path)
    if kind == "replaced":
        return "  (replaced the earlier file)"
    return f"  (written into {path_kind(path)})" if kind == "in place" else ""


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> None:
    """Call ``write(temporary_path)`` (its return value is ignored) then move the result over ``path``
    in one rename.

    On any error (ENOSPC included) the temporary file is removed and ``path`` is untouched. The file
    gets the permissions of a file the user creates (0666 less the umask), not the temporary file's 0600.
    Nothing but a regular file is ever renamed over (``output_kind``): a character device or a FIFO
    (/dev/null, a pipe) is written in place, a folder, socket or block device refused; a symbolic
    link to a file keeps pointing there, and its target is replaced.

    Raises:
        NoSpaceError: the disk (or /dev/full) is full; one line naming the file.
        NotReplacedError: ``path`` is a folder, a socket or a block device.
    """
    path = Path(path)
    if output_kind(path) == "in place":
        try:
            write(path)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise NoSpaceError(f"{path}: no space left on device while writing") from error
            raise
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    # A writer killed mid-write leaves ".<name>.<8 random characters>.tmp" (mkstemp's names): remove
    # exactly those, matching the name literally (a name may hold glob characters such as '*').
    leftover_name = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        if leftover_name.fullmatch(leftover.name):
            leftover.unlink(missing_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(handle, 0o666 & ~user_umask())
    finally:
        os.close(handle)
    try:
        write(Path(temporary))
        # A writer may have replaced the temporary file with one of its own (safetensors' save_file
        # renames its own 0600 file over it): the result still gets the umask's permissions.
        os.chmod(temporary, 0o666 & ~user_umask())
        with open(temporary, "rb") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise NoSpaceError(
                f"{path}: no space left on device while writing; the previous file is intact"
            ) from error
        raise
    try:  # make the rename itself durable
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:
        pass
