"""The run folder contract: what a run folder holds, which tool writes what there, one run at a time.

A run folder (``train.output_dir``) holds only files named here. ``train.py`` writes the run's
own files; ``evaluate.py`` adds files whose names start with ``eval_`` and so never collide with
the main job's; ``train.overwrite`` removes exactly the files matched by ``RUN_OUTPUTS`` and
nothing else. A training run holds an ``flock`` on ``.train.lock`` for as long as it runs, so two
runs never write into one folder at the same time; the kernel drops the lock when the process dies,
however it dies, so a killed run never leaves the folder locked.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no lock, as for a filesystem without flock
    fcntl = None

LOCK_NAME = ".train.lock"
CHECKPOINTS = "checkpoints"
MAIN_PREFIX = "test"  # the main job scores the test split: test_results.json, test_scores.json
EVAL_PREFIX = "eval_"  # evaluate.py: eval_<checkpoint>_<split>_results.json, ...

# Everything the project writes in a run folder, as glob patterns relative to it.
RUN_OUTPUTS = (
    "checkpoints/*.pt", "config.yaml", "vocab.json", "data_summary.json", "steps.jsonl", "history.json",
    "tensorboard/events.out.tfevents.*",
    f"{MAIN_PREFIX}_results.json", f"{MAIN_PREFIX}_scores.json", f"{MAIN_PREFIX}_scores.per_image.json",
    "figures/*.png", "report.html",
    f"{EVAL_PREFIX}*_results.json", f"{EVAL_PREFIX}*_scores.json", f"{EVAL_PREFIX}*_scores.per_image.json",
    f"{EVAL_PREFIX}*_files.json",
)


class RunFolderError(OSError):
    """A run folder is in use or an output path cannot be written; the message is one line naming it."""


def run_folder_of(checkpoint: str | Path) -> Path:
    """Where a tool's outputs go by default: ``<run>`` for ``<run>/checkpoints/x.pt``, else the current folder.

    The checkpoint's location, not any path stored inside it, decides; a checkpoint anywhere else
    (``/tmp/x.pt``) sends outputs to the current directory, never to its parent folder.
    """
    location = Path(os.path.abspath(checkpoint))
    return location.parent.parent if location.parent.name == CHECKPOINTS else Path.cwd()


def evaluation_prefix(checkpoint: str | Path, what: str) -> str:
    """``eval_<checkpoint stem>_<what>``: the start of every file ``evaluate.py`` writes by default."""
    return f"{EVAL_PREFIX}{Path(checkpoint).stem}_{what}"


def scores_path_for(results: str | Path) -> Path:
    """``x_results.json`` -> ``x_scores.json``; any other ``y.json`` -> ``y_scores.json``."""
    results = Path(results)
    stem = results.stem.removesuffix("_results")
    return results.with_name(f"{stem}_scores.json")


def project_outputs(output_dir: str | Path) -> list[Path]:
    """The files in ``output_dir`` that the project wrote (``RUN_OUTPUTS``), sorted."""
    output_dir = Path(output_dir)
    found = {path for pattern in RUN_OUTPUTS for path in output_dir.glob(pattern) if path.is_file()}
    return sorted(found)


def remove_project_outputs(output_dir: str | Path) -> list[Path]:
    """Delete ``project_outputs(output_dir)`` (and the project's sub-folders left empty); return them."""
    removed = project_outputs(output_dir)
    for path in removed:
        path.unlink(missing_ok=True)
    for folder in ("figures", "tensorboard", CHECKPOINTS):
        try:
            (Path(output_dir) / folder).rmdir()  # only when empty: a user's own files stay
        except OSError:
            pass
    return removed


class RunLock:
    """An exclusive ``flock`` on ``<output_dir>/.train.lock``, held until ``release`` or process exit."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / LOCK_NAME
        self._descriptor: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or refuse at once.

        Raises:
            RunFolderError: another live process holds it (its pid is named when known).
        """
        if fcntl is None:
            return self
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            locked = self._locked(descriptor, fcntl.LOCK_EX)
        except BaseException:
            os.close(descriptor)
            raise
        if not locked:
            os.close(descriptor)
            return self  # no locks on this filesystem: runs are not kept apart, as without fcntl
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
        self._descriptor = descriptor
        return self

    def check_free(self) -> None:
        """Refuse at once when a live process holds the lock, writing nothing (not even the lock file):
        a second run stops before it reads any data, and a refused one leaves the folder as it was.

        The shared lock taken for the test conflicts only with a run's exclusive one, so ranks
        testing at the same time do not refuse each other.

        Raises:
            RunFolderError: as ``acquire``.
        """
        if fcntl is None:
            return
        try:
            descriptor = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # no lock file (or no folder): no run has used it yet
        try:
            if self._locked(descriptor, fcntl.LOCK_SH):
                fcntl.flock(descriptor, fcntl.LOCK_UN)
        finally:
            os.close(descriptor)

    def _locked(self, descriptor: int, kind: int) -> bool:
        """Take a ``flock`` of ``kind`` without waiting; False on a filesystem without locks.

        Raises:
            RunFolderError: another live process holds the lock.
        """
        try:
            fcntl.flock(descriptor, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()
            raise RunFolderError(f"{self.path.parent}: another train.py run is using this folder"
                                 + (f" (pid {holder})" if holder else "")
                                 + "; wait for it to end or choose another --output-dir") from None
        except OSError as error:
            if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                return False
            raise
        return True

    def release(self) -> None:
        """Drop the lock (the file stays: deleting it would race with a run taking it)."""
        if self._descriptor is not None:
            fcntl.flock(self._descriptor, fcntl.LOCK_UN)
            os.close(self._descriptor)
            self._descriptor = None


def check_output_file(path: str | Path, option: str) -> None:
    """Refuse, before any work, an output file that cannot be written: a folder, or under a non-folder
    or unwritable folder.

    Raises:
        RunFolderError: ``<path>: <option>: <what is wrong>``.
    """
    path = Path(path)
    if path.is_dir():
        raise RunFolderError(f"{path}: {option}: is a folder; give a file name")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:  # the nearest existing ancestor gets created into
        parent = parent.parent
    if not parent.is_dir():
        raise RunFolderError(f"{path}: {option}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunFolderError(f"{path}: {option}: cannot write in {parent} (permission denied)")


def check_output_folder(path: str | Path, option: str) -> None:
    """Refuse, before any work, an output folder that exists as a file or cannot be created or written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{path}: {option}: exists and is not a folder")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunFolderError(f"{path}: {option}: cannot write in it (permission denied)")
    else:
        check_output_file(path, option)  # its nearest existing parent must take a new folder

