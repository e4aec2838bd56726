"""Output paths checked before any work: a file or folder a tool is asked to write must be writable,
must not be one of the command's inputs, another of its outputs, or a main job's own file.

Every tool calls these with the option that named the path, so a refusal is one line naming both
(``<path>: <option>: <what is wrong>``); devices and FIFOs (/dev/null, a pipe) are written in place.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from captioning.utils.files import NotReplacedError, output_kind
from captioning.utils.run_folder import RunFolderError, main_job_file


def check_output_file(path: str | Path, option: str) -> None:
    """Refuse, before any work, an output file that cannot be written: a folder, a socket or block
    device (``files.output_kind``), or under a non-folder or unwritable folder. A character device or
    a FIFO (/dev/null, a pipe) is accepted: it is written in place.

    Raises:
        RunFolderError: ``<path>: <option>: <what is wrong>``.
    """
    path = Path(path)
    if path.is_dir():
        raise RunFolderError(f"{path}: {option}: is a folder; give a file name")
    try:
        if output_kind(path) == "in place":
            return
    except NotReplacedError as error:
        raise RunFolderError(f"{path}: {option}: {str(error).removeprefix(f'{path}: ')}") from None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:  # the nearest existing ancestor gets created into
        parent = parent.parent
    if not parent.is_dir():
        raise RunFolderError(f"{path}: {option}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunFolderError(f"{path}: {option}: cannot write in {parent} ({_why_not_writable(parent)})")


def _why_not_writable(folder: Path) -> str:
    """``read-only file system`` or ``permission denied``, as the kernel would answer a write there."""
    try:
        return "read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else "permission denied"
    except OSError:
        return "permission denied"


def check_outputs(
    outputs: Iterable[tuple[str, str | Path]],
    inputs: Iterable[tuple[str, str | Path | None]],
    keep_main_job: bool = True,
) -> None:
    """Refuse, before any work, outputs that would destroy what they replace: each is checked by
    ``check_output_file``; none may be one of the command's ``inputs`` (links followed), two outputs
    may not be one file, and with ``keep_main_job`` none may be a main job's own file (``main_job_file``).

    Args:
        outputs: (option, path) of every file the command will write.
        inputs: (option, path) of every file or folder it reads; None entries are skipped.
    Raises:
        RunFolderError: ``<path>: <option>: <what is wrong>``.
    """
    outputs = list(outputs)
    present = [(option, path) for option, path in inputs if path is not None]
    # (device, inode) of every input: one stat each
    identities: dict[tuple[int, int], tuple[str, str | Path]] = {}
    for input_option, source in present:
        with contextlib.suppress(OSError, ValueError):
            status = os.stat(source)
            identities.setdefault((status.st_dev, status.st_ino), (input_option, source))
    for index, (option, path) in enumerate(outputs):
        check_output_file(path, option)
        in_place = output_kind(path) == "in place"
        try:
            status = os.stat(path)
            input_of = identities.get((status.st_dev, status.st_ino))
        except (OSError, ValueError):  # nothing there yet: no input
            input_of = None
        if input_of is not None and not in_place:
            raise RunFolderError(
                f"{path}: {option}: is an input of this command ({input_of[0]} {input_of[1]}); "
                "give another file name"
            )
        for other_option, other in outputs[:index]:
            if not in_place and os.path.realpath(path) == os.path.realpath(other):
                raise RunFolderError(
                    f"{path}: {option}: is also {other_option}; give two different file names"
                )
        run = main_job_file(path) if keep_main_job else None
        if run is not None:
            raise RunFolderError(
                f"{path}: {option}: is the main job's own file in the run folder {run}; only "
                "train.py writes it, give another file name"
            )


def check_output_folder(path: str | Path, option: str) -> None:
    """Refuse, before any work, an output folder that exists as a file or cannot be created or written."""
    path = Path(path)
    resolved = path.resolve()
    if resolved == Path(resolved.anchor):  # a run's files and clean-up would be spread over the system
        raise RunFolderError(f"{path}: {option}: the root of the file system; give a folder of its own")
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{path}: {option}: exists and is not a folder")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunFolderError(f"{path}: {option}: cannot write in it ({_why_not_writable(path)})")
    else:
        check_output_file(path, option)  # its nearest existing parent must take a new folder
