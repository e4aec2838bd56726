"""How a run takes its output folder: a new run, one that replaces another (``train.overwrite``), or
``--resume auto`` after a launch that died (rank 0 decides, holding the folder's lock, and writes nothing
before it has)."""

from __future__ import annotations

from pathlib import Path

from captioning.config import Config
from captioning.config_files import load_config
from captioning.files import path_kind
from captioning.run_folder import CHECKPOINTS, beyond_leftovers, remove_project_outputs
from captioning.runtime import distributed
from captioning.runtime.checkpoint import CheckpointError
from captioning.training.resume_state import check_resumable


def claim_output_dir(output_dir: Path, overwrite: bool) -> None:
    """A new run must not mix with an earlier run's outputs in the same folder (rank 0, holding the lock).

    Without ``train.overwrite`` a folder holding an earlier run's checkpoints is refused (its best
    checkpoint would otherwise be scored as this run's); with it, or when there are no checkpoints,
    every file the project writes in a run folder (``run_folder.RUN_OUTPUTS``) is deleted first:
    scores, results, figures and the report of the earlier run go too, the user's own files stay.
    """
    earlier = sorted((output_dir / CHECKPOINTS).glob("*.pt"))
    if earlier and not overwrite:
        raise CheckpointError(
            f"{output_dir}: holds an earlier run's checkpoints ({', '.join(p.name for p in earlier)}); "
            "continue it with --resume, replace it with --set train.overwrite=true, or choose "
            "another --output-dir"
        )
    remove_outputs(output_dir, "overwrite: deleted the earlier run's {count} files in " + str(output_dir))


def remove_outputs(output_dir: Path, message: str) -> None:
    """Delete every file the project writes in a run folder (rank 0, holding the lock)."""
    removed = remove_project_outputs(output_dir)
    if removed:
        print(message.replace("{count}", str(len(removed))), flush=True)


def auto_resume_point(
    config: Config, output_dir: Path, group: distributed.ProcessGroup
) -> tuple[Path | None, bool]:
    """``--resume auto``: the folder's ``last.pt`` when there is one, else None (a new run).

    Under ``torchrun --max-restarts`` or a requeueing scheduler the same command runs again after a
    failure or a preemption: it continues from the last checkpoint, or starts over when the launch
    before wrote none. What such a launch left behind (``run_folder.LAUNCH_LEFTOVERS``: its
    config.yaml, step log, TensorBoard events) is to be cleared then, provided its config.yaml holds
    this configuration; a different one is refused as ``--resume`` refuses a changed configuration.
    A folder holding more (a checkpoint other than last.pt, scores, figures: a finished run that kept
    only best.pt) or a ``last.pt`` that is not a file is refused, unless ``train.overwrite`` asks to
    replace it. Rank 0 looks and every rank follows its answer. Nothing is written here.

    Returns:
        (the checkpoint to resume or None, whether an earlier launch's outputs are to be cleared).
    Raises:
        CheckpointError: the folder's configuration differs, or it holds more than leftovers.
    """
    last, stored = output_dir / CHECKPOINTS / "last.pt", output_dir / "config.yaml"
    looked = (path_kind(last), stored.is_file(), beyond_leftovers(output_dir)) if group.is_main else None
    answer: tuple[str | None, bool, list[str]] = distributed.broadcast_object(looked)  # type: ignore[assignment]
    last_kind, has_config, beyond = answer
    if last_kind == "a file":
        return last, False
    if last_kind is not None:
        raise CheckpointError(
            f"{last}: is {last_kind}, not a checkpoint; --resume auto neither continues nor "
            "replaces the run: move it away, or choose another --output-dir"
        )
    if beyond and not config.train.overwrite:
        shown = ", ".join(beyond[:4]) + (f" and {len(beyond) - 4} more" if len(beyond) > 4 else "")
        raise CheckpointError(
            f"{output_dir}: --resume auto: no checkpoints/last.pt to continue, and the folder "
            f"holds more than a launch that died before its first checkpoint leaves ({shown}); "
            "replace that run with --set train.overwrite=true, or choose another --output-dir"
        )
    if not has_config or beyond:  # nothing to start over from, or a run train.overwrite replaces
        return None, False
    check_resumable(load_config(stored), config, "xe", stored)
    return None, True
