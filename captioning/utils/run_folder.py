"""The run folder contract: what a run folder holds, which tool writes what there, one run at a time,
and how a run takes it (a new run, ``train.overwrite``, ``--resume auto``) and which checkpoint is scored.

A run folder (``train.output_dir``) holds only files named here. ``train.py`` writes the run's
own files; ``evaluate.py`` adds files whose names start with ``eval_`` and so never collide with
the main job's; ``train.overwrite`` removes exactly the files matched by ``RUN_OUTPUTS`` and
nothing else. A training run holds an ``flock`` on ``.train.lock`` for as long as it runs, so two
runs never write into one folder at the same time; the kernel drops the lock when the process dies,
however it dies, so a killed run never leaves the folder locked.
"""

from __future__ import annotations

import errno
import fnmatch
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from captioning.utils.errors import CaptioningError, RunError
from captioning.utils.files import NoSpaceError, path_kind, refuse_links

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no lock, as for a filesystem without flock
    fcntl = None

LOCK_NAME = ".train.lock"
CHECKPOINTS = "checkpoints"
MAIN_PREFIX = "test"  # the main job scores the test split: test_results.json, test_scores.json
EVAL_PREFIX = "eval_"  # evaluate.py: eval_<checkpoint>_<split>_results.json, ...

# Everything the project writes in a run folder, as patterns of paths relative to it (``fnmatch``,
# where ``*`` also matches a ``/``): the run's own names only, so that ``train.overwrite`` leaves a
# user's ``notes.pt`` or ``figures/plot.png`` alone. The main job's figures are ``<image id>.png``.
MAIN_JOB_OUTPUTS = (
    "checkpoints/last.pt",
    "checkpoints/best.pt",
    "checkpoints/best_scst.pt",
    "config.yaml",
    "vocab.json",
    "data_summary.json",
    "steps.jsonl",
    "history.json",
    "tensorboard/events.out.tfevents.*",
    f"{MAIN_PREFIX}_results.json",
    f"{MAIN_PREFIX}_scores.json",
    f"{MAIN_PREFIX}_scores.per_image.json",
    f"{MAIN_PREFIX}_faithfulness.html",
    "figures/[0-9]*.png",
    "report.html",
)
RUN_OUTPUTS = (
    *MAIN_JOB_OUTPUTS,
    f"{EVAL_PREFIX}*_results.json",
    f"{EVAL_PREFIX}*_scores.json",
    f"{EVAL_PREFIX}*_scores.per_image.json",
    f"{EVAL_PREFIX}*_files.json",
    f"{EVAL_PREFIX}*_faithfulness.html",
    f"{EVAL_PREFIX}*_ranked.json",
    "train_mean_feature.json",  # the explanations' baseline, computed once (captioning.explain.baselines)
)
_SUBFOLDERS = ("figures", "tensorboard", CHECKPOINTS)
# What a launch that died before its first checkpoint leaves: ``--resume auto`` may start over on these only.
LAUNCH_LEFTOVERS = (
    "config.yaml",
    "vocab.json",
    "data_summary.json",
    "steps.jsonl",
    "tensorboard/events.out.tfevents.*",
)


def _is_run_output(relative: str, patterns: tuple[str, ...] = RUN_OUTPUTS) -> bool:
    """Whether ``relative`` (``figures/7.png``) is one of ``patterns``; a figure's stem is digits only."""
    if (
        relative.startswith("figures/")
        and not relative.removeprefix("figures/").removesuffix(".png").isdigit()
    ):
        return False
    return any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns)


class RunFolderError(CaptioningError, OSError):
    """A run folder is in use, holds what a run may not take over, or an output path cannot be written;
    the message is one line naming it."""


def is_run_config(path: str | Path) -> bool:
    """Whether ``path`` is the ``config.yaml`` a run wrote in its run folder (beside its checkpoints,
    history, vocabulary or data summary), not a configuration file of the user's own."""
    path = Path(path)
    return path.name == "config.yaml" and any(
        (path.parent / name).exists()
        for name in (CHECKPOINTS, "history.json", "vocab.json", "data_summary.json")
    )


def run_folder_of(checkpoint: str | Path) -> Path:
    """Where a tool's outputs go by default: ``<run>`` for ``<run>/checkpoints/x.pt``, else the current
    folder.

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
    """The files in ``output_dir`` that the project wrote (``RUN_OUTPUTS``), sorted.

    Only the folder itself and its real sub-folders are looked in: a ``figures/`` or ``checkpoints/``
    that is a symbolic link leads out of the run folder, and nothing there is the run's.
    """
    output_dir = Path(output_dir)
    folders = [
        output_dir,
        *(
            output_dir / name
            for name in _SUBFOLDERS
            if (output_dir / name).is_dir() and not (output_dir / name).is_symlink()
        ),
    ]
    found = []
    for folder in folders:
        for entry in folder.iterdir() if folder.is_dir() else ():
            relative = entry.relative_to(output_dir).as_posix()
            if _is_run_output(relative) and (entry.is_symlink() or entry.is_file()):
                found.append(entry)  # a link is removed, never what it points to
    return sorted(found)


def check_run_subfolders(output_dir: str | Path) -> None:
    """Refuse, before any work, a run folder whose ``figures/``, ``tensorboard/`` or ``checkpoints/`` is
    a symbolic link or not a folder: what stands behind a link is not the run's (``project_outputs``),
    so the run writes nothing there either (a linked ``figures/`` would have the run's ``41.png``
    replace a user's).

    Raises:
        LinkedPathError: naming the sub-folder and where it leads, or what it is when not a folder.
    """
    for name in _SUBFOLDERS:
        refuse_links(
            Path(output_dir) / name,
            output_dir,
            folder=True,
            instead="put the whole run folder, train.output_dir, where you want the files",
        )


def remove_project_outputs(output_dir: str | Path) -> list[Path]:
    """Delete ``project_outputs(output_dir)`` (and the project's sub-folders left empty); return them."""
    removed = project_outputs(output_dir)
    for path in removed:
        path.unlink(missing_ok=True)
    for folder in _SUBFOLDERS:
        if not (Path(output_dir) / folder).is_symlink():
            try:
                (Path(output_dir) / folder).rmdir()  # only when empty: a user's own files stay
            except OSError:
                pass
    return removed


def beyond_leftovers(output_dir: str | Path) -> list[str]:
    """What ``output_dir`` holds of a run beyond ``LAUNCH_LEFTOVERS``: its outputs (scores, figures,
    history, ...) and any checkpoint, the user's included, as paths relative to it, sorted."""
    output_dir = Path(output_dir)
    found = {path.relative_to(output_dir).as_posix() for path in project_outputs(output_dir)}
    if (output_dir / CHECKPOINTS).is_dir():
        found |= {f"{CHECKPOINTS}/{path.name}" for path in (output_dir / CHECKPOINTS).glob("*.pt")}
    return sorted(name for name in found if not any(fnmatch.fnmatchcase(name, p) for p in LAUNCH_LEFTOVERS))


def main_job_file(path: str | Path) -> Path | None:
    """The run folder when ``path`` is one of the main job's own files there (``MAIN_JOB_OUTPUTS``:
    its checkpoints, configuration, ``test_*`` results and scores, figures, report), else None.

    A run folder is one holding ``config.yaml``, ``checkpoints/`` or ``.train.lock``; links are followed.
    """
    path = Path(os.path.realpath(path))
    for folder, relative in (
        (path.parent, path.name),
        (path.parent.parent, f"{path.parent.name}/{path.name}"),
    ):
        is_run = any((folder / name).exists() for name in ("config.yaml", CHECKPOINTS, LOCK_NAME))
        if is_run and (
            _is_run_output(relative, MAIN_JOB_OUTPUTS) or fnmatch.fnmatchcase(relative, "checkpoints/*.pt")
        ):
            return folder
    return None


class RunLock:
    """An exclusive ``flock`` on ``<output_dir>/.train.lock``, held until ``release`` or process exit.

    ``fcntl.flock`` itself rather than the ``filelock`` package, whose ``UnixFileLock`` makes the same
    call: the refusal names the holder (its pid and command, written into the file after the lock is
    taken), a failed run removes a lock file only it made, and the descriptor is checked against the
    path's inode so that two runs never lock two different files of one name; the kernel drops the
    lock when the process dies, even by SIGKILL. Off POSIX there is no lock, as on a file system
    without ``flock``.
    """

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / LOCK_NAME
        self._descriptor: int | None = None
        self._created = (
            False  # this lock made the file: a run that fails removes it (``release(failed=True)``)
        )

    def acquire(self) -> RunLock:
        """Take the lock or refuse at once.

        A lock file removed by a failed run while this one waited to open it is opened again, so two
        runs never hold locks on two different files of one name.

        Raises:
            RunFolderError: another live process holds it (its pid is named when known).
            NoSpaceError: the disk is full (the lock file is not left behind).
        """
        if fcntl is None:
            return self
        while True:
            try:
                descriptor, self._created = (
                    os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666),
                    True,
                )
            except FileExistsError:
                descriptor, self._created = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666), False
            try:
                locked = self._locked(descriptor, fcntl.LOCK_EX)
            except BaseException:
                os.close(descriptor)
                raise
            if not locked:
                os.close(descriptor)
                return self  # no locks on this filesystem: runs are not kept apart, as without fcntl
            if _same_inode(descriptor, self.path):
                break
            os.close(descriptor)  # locked a file a failed run had just removed: take the new one
        self._descriptor = descriptor
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError as error:
            self.release(failed=True)
            if error.errno == errno.ENOSPC:
                raise NoSpaceError(f"{self.path}: no space left on device while writing") from None
            raise
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
        if fcntl is None:  # acquire and check_free return before any lock without fcntl
            raise RunError(f"{self.path}: flock without the fcntl module")
        try:
            fcntl.flock(descriptor, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()
            raise RunFolderError(
                f"{self.path.parent}: another train.py run is using this folder"
                + (f" (pid {holder})" if holder else "")
                + "; wait for it to end or choose another --output-dir"
            ) from None
        except OSError as error:
            if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                return False
            raise
        return True

    def release(self, failed: bool = False) -> None:
        """Drop the lock. The file stays, except after a ``failed`` run that created it: it is removed
        while still locked, and a run that opened it meanwhile opens the new one (``acquire``)."""
        if self._descriptor is not None and fcntl is not None:  # a descriptor is only held with fcntl
            if failed and self._created:
                self.path.unlink(missing_ok=True)
            fcntl.flock(self._descriptor, fcntl.LOCK_UN)
            os.close(self._descriptor)
            self._descriptor = None


def _same_inode(descriptor: int, path: Path) -> bool:
    """Whether ``descriptor`` is still the file at ``path`` (not one removed since it was opened)."""
    try:
        return os.path.samestat(os.fstat(descriptor), os.stat(path))
    except FileNotFoundError:
        return False


def claim_output_dir(output_dir: Path, overwrite: bool) -> None:
    """A new run must not mix with an earlier run's outputs in the same folder (rank 0, holding the lock).

    Without ``train.overwrite`` a folder holding an earlier run's checkpoints is refused (its best
    checkpoint would otherwise be scored as this run's); with it, or when there are no checkpoints,
    every file the project writes in a run folder (``RUN_OUTPUTS``) is deleted first: scores,
    results, figures and the report of the earlier run go too, the user's own files stay.

    Raises:
        RunFolderError: the folder holds an earlier run's checkpoints and ``overwrite`` is false.
    """
    earlier = sorted((output_dir / CHECKPOINTS).glob("*.pt"))
    if earlier and not overwrite:
        raise RunFolderError(
            f"{output_dir}: holds an earlier run's checkpoints ({', '.join(p.name for p in earlier)}); "
            "continue it with --resume, replace it with --set train.overwrite=true, or choose "
            "another --output-dir"
        )
    remove_outputs(output_dir, "overwrite: deleted the earlier run's {count} files in " + str(output_dir))


def remove_outputs(output_dir: Path, message: str) -> None:
    """Delete every file the project writes in a run folder (rank 0, holding the lock) and print
    ``message`` (``{count}`` replaced by their number) when there were any."""
    removed = remove_project_outputs(output_dir)
    if removed:
        print(message.replace("{count}", str(len(removed))), flush=True)


ResumeLook = tuple[
    str | None, bool, list[str]
]  # last.pt's kind, whether config.yaml is a file, beyond_leftovers


def look_for_resume(output_dir: Path) -> ResumeLook:
    """What ``--resume auto`` decides on (rank 0 looks, every rank decides with ``auto_resume_choice``):
    what ``checkpoints/last.pt`` is (``files.path_kind``), whether ``config.yaml`` is a file, and what
    the folder holds beyond a died launch's leftovers (``beyond_leftovers``)."""
    last = output_dir / CHECKPOINTS / "last.pt"
    return path_kind(last), (output_dir / "config.yaml").is_file(), beyond_leftovers(output_dir)


def auto_resume_choice(output_dir: Path, looked: ResumeLook, overwrite: bool) -> tuple[Path | None, bool]:
    """``--resume auto``: the folder's ``last.pt`` when there is one, else None (a new run).

    Under ``torchrun --max-restarts`` or a requeueing scheduler the same command runs again after a
    failure or a preemption: it continues from the last checkpoint, or starts over when the launch
    before wrote none. What such a launch left behind (``LAUNCH_LEFTOVERS``: its config.yaml, step
    log, TensorBoard events) is to be cleared then, provided its config.yaml holds this
    configuration (the caller checks that). A folder holding more (a checkpoint other than last.pt,
    scores, figures: a finished run that kept only best.pt) or a ``last.pt`` that is not a file is
    refused, unless ``overwrite`` (``train.overwrite``) asks to replace it. Nothing is written here.

    Args:
        looked: ``look_for_resume(output_dir)``, as rank 0 saw it.
    Returns:
        (the checkpoint to resume or None, whether an earlier launch's outputs are to be cleared:
        then ``config.yaml`` must hold this run's configuration).
    Raises:
        RunFolderError: ``last.pt`` is not a file, or the folder holds more than leftovers.
    """
    last = output_dir / CHECKPOINTS / "last.pt"
    last_kind, has_config, beyond = looked
    if last_kind == "a file":
        return last, False
    if last_kind is not None:
        raise RunFolderError(
            f"{last}: is {last_kind}, not a checkpoint; --resume auto neither continues nor "
            "replaces the run: move it away, or choose another --output-dir"
        )
    if beyond and not overwrite:
        shown = ", ".join(beyond[:4]) + (f" and {len(beyond) - 4} more" if len(beyond) > 4 else "")
        raise RunFolderError(
            f"{output_dir}: --resume auto: no checkpoints/last.pt to continue, and the folder "
            f"holds more than a launch that died before its first checkpoint leaves ({shown}); "
            "replace that run with --set train.overwrite=true, or choose another --output-dir"
        )
    if not has_config or beyond:  # nothing to start over from, or a run train.overwrite replaces
        return None, False
    return None, True


def best_checkpoint(output_dir: Path, best_metric: Callable[[Path], float]) -> Path:
    """The checkpoint to evaluate: of ``best_scst.pt`` and ``best.pt``, the one with the higher
    validation metric (``best_metric(path)``; self-critical epochs need not beat the cross-entropy
    model they start from; a tie goes to the self-critical one), else ``last.pt``.

    Raises:
        RunFolderError: ``checkpoints/`` holds none of the three.
    """
    scored = []
    for order, name in enumerate(("best_scst", "best")):
        path = output_dir / CHECKPOINTS / f"{name}.pt"
        if path.exists():
            scored.append((best_metric(path), -order, path))
    if scored:
        return max(scored)[2]
    last = output_dir / CHECKPOINTS / "last.pt"
    if last.exists():
        return last
    raise RunFolderError(f"{output_dir / CHECKPOINTS}: no checkpoint found")
