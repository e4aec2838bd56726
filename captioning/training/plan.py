"""Before a training run does any work: check that it has every input it will need, and say what it will do."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from captioning.config import Config, ConfigError, DataConfig
from captioning.data import split_rule
from captioning.data.records import DatasetError, ImageRecord
from captioning.files import not_a_regular_file
from captioning.training.engine import steps_per_epoch

STAGE_NAMES = {"xe": "cross-entropy", "scst": "self-critical"}


def check_splits(records: Sequence[ImageRecord], dataset: str, needed: Sequence[str], source: str = "") -> Counter[str]:
    """Images per split, after checking that every split in ``needed`` has some.

    Args:
        source: the files the records were read from (``data_source``), named first in the message.
    Raises:
        DatasetError: naming the files, the empty split and the splits there are.
    """
    counts = Counter(record.split for record in records)
    for split in needed:
        if not counts[split]:
            have = ", ".join(f"{name or '(none)'} {count}" for name, count in sorted(counts.items())) or "no images"
            hint = ("; train.py scores the test split after training: give data with one, or pass --no-test"
                    if split == "test" else "")
            raise DatasetError(f"{source}: " * bool(source) +
                               f"the {dataset} dataset has no images in split {split!r} (it has {have}){hint}")
    return counts


def data_source(config: DataConfig) -> str:
    """The files (or folder) a dataset's records are read from, for messages: the Karpathy split file,
    the COCO annotation files, the image folder, Shapes' root."""
    if config.dataset == "karpathy" and config.split_file:
        return str(config.split_file)
    if config.dataset == "coco" and config.annotations:
        return ", ".join(map(str, [*([config.split_file] if config.split_file else []), *config.annotations]))
    return str(config.root)


def check_images_exist(records: Sequence[ImageRecord], skip_bad_images: bool) -> None:
    """Every image file is there (unless unreadable images are to be skipped), before any is read.

    Raises:
        DatasetError: the first missing file, with how many are missing and the keys that fix it.
    """
    if skip_bad_images:
        return
    missing = [record for record in records if not record.path.is_file()]
    if missing:
        first = missing[0]
        # A FIFO or a folder where an image should be is there, just not a file: name it as such.
        what = not_a_regular_file(first.path) or "image file not found"
        raise DatasetError(f"{first.path} (image {first.image_id}): {what} ({len(missing)} of "
                           f"{len(records)} images are missing or not files; set data.root=... to the image "
                           "folder, or data.skip_bad_images=true to leave them out)")


def check_schedule(config: Config, train_images: int) -> None:
    """A warm-up that fits in the cross-entropy stage for ``cosine``, whose decay needs the steps after it.

    Raises:
        ConfigError: naming both numbers and the keys that change them.
    """
    train = config.train
    per_epoch = steps_per_epoch(train_images, train.batch_size)
    steps = train.epochs * per_epoch
    if train.schedule == "cosine" and train.epochs and train.warmup_steps >= steps:
        raise ConfigError(f"train.warmup_steps={train.warmup_steps} leaves no steps for the cosine decay: the "
                          f"cross-entropy stage has {steps} ({train.epochs} epochs x {per_epoch} steps of "
                          f"{train.batch_size} of {train_images} training images); set train.warmup_steps "
                          f"below {steps}")


def _epochs(first: int, last: int) -> str:
    if first > last:
        return "none"
    return f"epoch {first}" if first == last else f"epochs {first}-{last}"


def describe_plan(config: Config, counts: Counter[str], state: dict | None = None, test: bool = True,
                  checkpoint_epochs: int | None = None) -> str:
    """One line saying what a run will do: each stage's epochs, steps per epoch, images per split,
    and where a resumed run continues.

    Args:
        config: the run's configuration.
        counts: images per split (``check_splits``).
        state: the resumed checkpoint's ``TrainState`` as a dict, or None for a new run.
        test: whether the test split is scored after training.
        checkpoint_epochs: the resumed run's ``train.epochs``, to point out a change of it.
    """
    train = config.train
    state = state or {}
    stage, epoch = state.get("stage", "xe"), state.get("epoch", 0)
    patience = train.early_stop_patience
    stopped_early = stage == "xe" and patience > 0 and state.get("epochs_without_improvement", 0) >= patience
    xe = _epochs(epoch + 1, train.epochs)
    if state and (stage == "scst" or epoch >= train.epochs or stopped_early):
        xe = f"done (stopped early after {epoch} epochs)" if stopped_early and epoch < train.epochs else "done"
    scst = _epochs(epoch + 1 if stage == "scst" else 1, train.scst_epochs)
    steps = steps_per_epoch(counts["train"], train.batch_size)
    validated = min(train.val_images, counts["val"]) if train.val_images else counts["val"]
    parts = [f"plan: cross-entropy {xe}, then self-critical {scst}",
             f"{steps} steps per epoch ({counts['train']} training images, batch {train.batch_size})",
             f"images: train {counts['train']}, val {counts['val']} (validating on {validated})"
             + (f", test {counts['test']} (scored at the end)" if test else "")]
    rule = split_rule(config.data)
    if rule:
        parts.append(rule)
    if train.max_steps:
        parts.append(f"stopping at step {train.max_steps} (train.max_steps)")
    if not state:
        parts.append("a new run")
    else:
        where = (f"resuming from step {state.get('global_step', 0)}: stage {stage} ({STAGE_NAMES[stage]}), "
                 f"{epoch} epoch{'s' * (epoch != 1)} done")
        if state.get("batch_in_epoch"):
            where += f", {state['batch_in_epoch']} batches into epoch {epoch + 1}"
        if not xe.startswith("done") and checkpoint_epochs is not None and checkpoint_epochs != train.epochs:
            where += (f"; the checkpoint's run had train.epochs={checkpoint_epochs}, this one {train.epochs}"
                      f" (pass --epochs {checkpoint_epochs} to keep it)")
        parts.append(where)
    return "; ".join(parts)
