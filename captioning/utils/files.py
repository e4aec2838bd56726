"""Reading and writing files: every file the project writes goes through ``atomic_write``, and
every file it reads is first checked by ``not_a_regular_file`` (opening a FIFO would wait forever)."""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
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


class FileSizeLimitError(CaptioningError, OSError):
    """A file outgrew the process's file size limit (``ulimit -f``); one line naming the file."""


def _full(path: Path, error: OSError, intact: str) -> CaptioningError:
    """The one-line error of a write that ran out of room: the disk (ENOSPC) or ``ulimit -f`` (EFBIG)."""
    if error.errno == errno.EFBIG:
        return FileSizeLimitError(
            f"{path}: file too large for this process's file size limit (ulimit -f) while writing; {intact}"
        )
    return NoSpaceError(f"{path}: no space left on device while writing; {intact}")


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


class LinkedPathError(CaptioningError, OSError):
    """A file or folder the project writes under a data or cache folder is a symbolic link, or is there
    and is not a regular file (a folder); the message names it and where it leads."""


def refuse_links(
    path: str | Path,
    under: str | Path,
    folder: bool = False,
    instead: str = "set data.cache_dir to another folder",
) -> None:
    """Refuse, before a write, a symbolic link at ``path`` or at any folder between ``under`` (the folder
    the user named, itself not checked) and ``path``, and a ``path`` that is there but is not a regular
    file: what a data, cache or run folder holds is written in place by the project only, never through
    a link a data file or another user planted, and never into a FIFO (which would block the writer).
    With ``folder``, ``path`` is a folder the project writes into, and must be one where it exists.
    ``instead`` is what the message offers besides removing the link.

    Raises:
        LinkedPathError: one line naming the link (and its target) or the odd file.
    """
    path, under = Path(path), Path(under)
    try:
        parts = path.relative_to(under).parts
    except ValueError:  # not below the folder: only the path itself is checked
        parts = ()
    chain = [under.joinpath(*parts[: depth + 1]) for depth in range(len(parts))] or [path]
    for current in chain:
        try:
            state = os.lstat(current)
        except FileNotFoundError:
            return  # nothing further down exists yet
        except (OSError, ValueError):
            return  # unreadable, or a NUL in the name: the write itself says so
        last = current is chain[-1]
        if stat.S_ISLNK(state.st_mode):
            try:
                target = os.readlink(current)
            except OSError:
                target = "?"
            raise LinkedPathError(
                f"{current}: a symbolic link (to {target}); the project writes its files under {under} "
                f"itself and never through a link: remove the link (or {instead})"
            )
        if (not last or folder) and not stat.S_ISDIR(state.st_mode):
            raise LinkedPathError(f"{current}: is {kind_of(state.st_mode)}, not a folder; remove it")
        if last and not folder and not stat.S_ISREG(state.st_mode):
            raise LinkedPathError(
                f"{current}: is {kind_of(state.st_mode)}, not a regular file; the project writes a file "
                "there: remove it"
            )


def atomic_write(path: str | Path, write: Callable[[Path], object], under: str | Path | None = None) -> None:
    """Call ``write(temporary_path)`` (its return value is ignored) then move the result over ``path``
    in one rename.

    On any error (ENOSPC included) the temporary file is removed and ``path`` is untouched. The file
    gets the permissions of a file the user creates (0666 less the umask), not the temporary file's 0600.
    Nothing but a regular file is ever renamed over (``output_kind``): a character device or a FIFO
    (/dev/null, a pipe) is written in place, a folder, socket or block device refused; a symbolic
    link to a file keeps pointing there, and its target is replaced.

    With ``under`` (a data or cache folder holding ``path``), ``refuse_links(path, under)`` holds first:
    no link at ``path`` or between, nothing but a regular file replaced, nothing written in place.

    Raises:
        NoSpaceError: the disk (or /dev/full) is full; one line naming the file.
        NotReplacedError: ``path`` is a folder, a socket or a block device.
        LinkedPathError: with ``under``, a link or an odd file on the way (``refuse_links``).
    """
    path = Path(path)
    if under is not None:
        refuse_links(path, under)
    elif output_kind(path) == "in place":
        try:
            write(path)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise NoSpaceError(f"{path}: no space left on device while writing") from error
            if error.errno == errno.EFBIG:
                raise _full(path, error, "written in place, it may be incomplete") from error
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
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG):
            raise _full(path, error, "the previous file is intact") from error
        raise
    try:  # make the rename itself durable
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:
        pass


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step (Linux's ``renameat2(RENAME_EXCHANGE)``); False where the system or
    the file system cannot."""
    try:
        rename2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if rename2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(second))


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError:
        pass


def replace_folder(folder: str | Path, write: Callable[[Path], object], carry: Sequence[str] = ()) -> Path:
    """Write a folder as one unit: ``write(staging)`` fills a new hidden folder beside ``folder``, which
    then takes ``folder``'s place in one step, so that a reader (or a kill at any moment) sees the old
    folder or the new one, never a mix of their files.

    Where the system swaps two folders in one call (Linux, ``renameat2``) the swap is atomic; elsewhere
    the old folder is renamed aside first (a kill between the two renames leaves it as
    ``.<name>.<8 characters>.new`` beside the missing folder). The new folder keeps the old one's
    permissions (a new one gets the umask's); a symbolic link to a folder keeps pointing there.

    Args:
        folder: the folder to write (created with its parents when missing).
        write: fills the staging folder it is given (its files written with ``atomic_write``).
        carry: names of entries of the old folder moved into the new one before the swap (kept).
    Returns:
        The folder written (a link's target).
    """
    folder = Path(os.path.realpath(folder)) if Path(folder).is_symlink() else Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    leftover_name = re.compile(rf"\.{re.escape(folder.name)}\.[a-z0-9_]{{8}}\.new")
    for leftover in folder.parent.glob(f".{glob.escape(folder.name)}.*.new"):
        if leftover_name.fullmatch(leftover.name) and leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)  # an earlier write killed before its swap
    existed = folder.is_dir()
    mode = stat.S_IMODE(os.stat(folder).st_mode) if existed else 0o777 & ~user_umask()
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".new", dir=folder.parent))
    try:
        write(staging)
        os.chmod(staging, mode)
        for name in carry:
            os.rename(folder / name, staging / name)
        _fsync_folder(staging)
        if not existed:
            os.rename(staging, folder)
        elif _exchange(staging, folder):
            shutil.rmtree(staging, ignore_errors=True)  # it holds the old folder now
        else:
            aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".new", dir=folder.parent))
            os.rename(folder, aside / folder.name)
            os.rename(staging, folder)
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException as error:
        if staging.exists():  # not swapped: the old folder stands; give back what was carried over
            for name in carry:
                if os.path.lexists(staging / name) and not os.path.lexists(folder / name):
                    os.rename(staging / name, folder / name)
            shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, FileSizeLimitError) or (
            isinstance(error, OSError) and error.errno == errno.EFBIG
        ):
            raise _full(folder, OSError(errno.EFBIG, ""), "the previous folder is intact") from error
        if isinstance(error, NoSpaceError) or (isinstance(error, OSError) and error.errno == errno.ENOSPC):
            raise _full(folder, OSError(errno.ENOSPC, ""), "the previous folder is intact") from error
        raise
    _fsync_folder(folder.parent)
    return folder
