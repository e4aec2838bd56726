"""``--resume auto``: rank 0 looks at the output folder, every rank follows its answer
(``run_folder.auto_resume_choice``), and a launch's ``config.yaml`` to start over from must hold this
run's configuration (``resume_state.check_resumable``)."""

from __future__ import annotations

from pathlib import Path

from captioning.config import Config
from captioning.config.loading import load_config
from captioning.training.resume_state import check_resumable
from captioning.utils import distributed
from captioning.utils.errors import RunError
from captioning.utils.run_folder import auto_resume_choice, look_for_resume


def auto_resume_point(
    config: Config, output_dir: Path, group: distributed.ProcessGroup
) -> tuple[Path | None, bool]:
    """``--resume auto``: the folder's ``last.pt`` when there is one, else None (a new run).

    Returns:
        (the checkpoint to resume or None, whether an earlier launch's outputs are to be cleared).
    Raises:
        RunFolderError: ``last.pt`` is not a file, or the folder holds more than leftovers.
        CheckpointError: the folder's ``config.yaml`` holds another configuration.
    """
    looked = look_for_resume(output_dir) if group.is_main else None
    answer = distributed.broadcast_object(looked)
    if answer is None:
        raise RunError(f"{output_dir}: --resume auto: rank 0 sent no answer about the folder")
    resume, start_over = auto_resume_choice(output_dir, answer, config.train.overwrite)
    if start_over:
        stored = output_dir / "config.yaml"
        check_resumable(load_config(stored, stored=True), config, "xe", stored)
    return resume, start_over
