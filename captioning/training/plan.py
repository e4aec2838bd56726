"""Before a training run does any work: check that it has every input it needs, and say what it will do."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

from captioning.config import PER_STEP_SCHEDULES, Config
from captioning.data import split_rule
from captioning.data.records import DatasetError, ImageRecord
from captioning.data.tar_members import image_exists
from captioning.training.engine import steps_per_epoch
from captioning.training.optim import MAX_WARMUP_FRACTION, warmup_for
from captioning.utils.files import not_a_regular_file

STAGE_NAMES = {"xe": "cross-entropy", "scst": "self-critical"}


def check_images_exist(records: Sequence[ImageRecord], skip_bad_images: bool) -> None:
    """Every image file is there (unless unreadable images are to be skipped), before any is read.

    Raises:
        DatasetError: the first missing file, with how many are missing and the keys that fix it.
    """
    if skip_bad_images:
        return
    missing = [record for record in records if not image_exists(record.path)]  # a file or a shard's member
    if missing:
        first = missing[0]
        # A FIFO or a folder where an image should be is there, just not a file: name it as such.
        what = not_a_regular_file(first.path) or "image file not found"
        raise DatasetError(
            f"{first.path} (image {first.image_id}): {what} ({len(missing)} of "
            f"{len(records)} images are missing or not files; set data.root=... to the image "
            "folder, or data.skip_bad_images=true to leave them out)"
        )


def warmup_note(config: Config, train_images: int) -> str | None:
    """A one-line note when the per-step schedule's warm-up is clipped to fit the cross-entropy stage
    (``optim.warmup_for``), else None: a first check with ``--epochs 1`` runs, and says what changed."""
    train = config.train
    if train.schedule not in PER_STEP_SCHEDULES:
        return None
    per_epoch = steps_per_epoch(train_images, train.batch_size)
    steps = train.epochs * per_epoch
    warmup = warmup_for(train.warmup_steps, steps)
    if warmup == train.warmup_steps:
        return None
    epochs = f"{train.epochs} epoch{'s' * (train.epochs != 1)}"
    return (
        f"note: train.warmup_steps={train.warmup_steps} is more than {MAX_WARMUP_FRACTION:.0%} of the "
        f"cross-entropy stage's {steps} steps ({epochs} x {per_epoch}); the {train.schedule} schedule warms "
        f"up over {warmup} steps instead"
    )


# A run's length, and the flag that sets each key.
LENGTH_FLAGS = {"train.epochs": "--epochs", "train.scst_epochs": "--scst-epochs"}


def resumed_length(
    config: Config, stored: Config, given: Collection[str], stage: str = "xe"
) -> tuple[Config, str | None]:
    """The configuration a resumed run goes on with: its length from the checkpoint's run unless
    ``given``, and a one-line note of what that keeps or changes (None when nothing differs).

    Repeating a run's ``--config`` without its ``--epochs`` would otherwise quietly run the
    configuration's remaining epochs before, say, the self-critical ones a resume asks for.

    Args:
        config: this command's configuration.
        stored: the configuration in the checkpoint to resume.
        given: the configuration keys set on this command line (``--epochs``, ``--set train.epochs=...``).
        stage: the checkpoint's stage: cross-entropy epochs added to one in its self-critical stage never run.
    """
    changes, notes = {}, []
    for key, flag in LENGTH_FLAGS.items():
        name = key.split(".")[1]
        before, now = getattr(stored.train, name), getattr(config.train, name)
        stage_name = "self-critical" if name == "scst_epochs" else "cross-entropy"
        if before == now:
            continue
        if key not in given:
            changes[name] = before
            notes.append(
                f"keeps the checkpoint's {key}={before} (the configuration says {now}; "
                f"pass {flag} {now} to change it)"
            )
        elif name == "epochs" and stage == "scst":
            notes.append(
                f"{key} {before} -> {now} changes nothing: the checkpoint is in its self-critical stage"
            )
        elif now > before:
            added = now - before
            notes.append(f"adds {added} {stage_name} epoch{'s' * (added != 1)} ({key} {before} -> {now})")
        else:
            notes.append(f"shortens the run: {key} {before} -> {now}")
    resumed = replace(config, train=replace(config.train, **changes)) if changes else config
    return resumed, ("resume: " + "; ".join(notes)) if notes else None


def _epochs(first: int, last: int) -> str:
    if first > last:
        return "none"
    return f"epoch {first}" if first == last else f"epochs {first}-{last}"


def cache_location(cache_dir: Path) -> str:
    """Where a feature cache goes, as configured, and where that is on disk when a symlink on the way
    (a data root linked to another disk) leads elsewhere: tens of gigabytes for COCO."""
    resolved = Path(os.path.realpath(cache_dir))
    if resolved != Path(os.path.abspath(cache_dir)):
        return f"{cache_dir} (which resolves to {resolved})"
    return str(cache_dir)


def describe_cache_plan(
    counts: Counter[str], encoder: str, grid: tuple[int, int], channels: int, cache_dir: Path
) -> str:
    """One line saying what ``train.py --cache-only`` will do: which encoder's grids, of how many
    images per split, where; before any image is read."""
    images = ", ".join(f"{split} {counts[split]}" for split in ("train", "val", "test") if counts[split])
    return (
        f"plan: cache the {encoder} features ({grid[0]}x{grid[1]} grid, {channels} channels) of every "
        f"split ({images} images) in the feature cache in {cache_location(cache_dir)}; nothing is trained"
    )


def describe_plan(
    config: Config,
    counts: Counter[str],
    state: dict | None = None,
    test: bool = True,
    cache_dir: Path | None = None,
    busy: str | None = None,
    precision: str | None = None,
) -> str:
    """One line saying what a run will do: each stage's epochs, steps per epoch, images per split,
    and where a resumed run continues.

    Args:
        config: the run's configuration.
        counts: images per split (``check_splits``).
        state: the resumed checkpoint's ``TrainState`` as a dict, or None for a new run.
        test: whether the test split is scored after training.
        cache_dir: the feature cache folder, when features are cached (``cache_location``).
        busy: what a busy machine will cost and the setting that helps
            (:func:`captioning.training.cpu_threads.busy_machine_advice`), said last.
        precision: what mixed precision will cost on this device
            (:func:`captioning.utils.device.bf16_cost`), said before ``busy``.
    """
    train = config.train
    state = state or {}
    stage, epoch = state.get("stage", "xe"), state.get("epoch", 0)
    patience = train.early_stop_patience
    stopped_early = stage == "xe" and patience > 0 and state.get("epochs_without_improvement", 0) >= patience
    xe = _epochs(epoch + 1, train.epochs)
    if state and (stage == "scst" or epoch >= train.epochs or stopped_early):
        xe = (
            f"done (stopped early after {epoch} epochs)" if stopped_early and epoch < train.epochs else "done"
        )
    scst = _epochs(epoch + 1 if stage == "scst" else 1, train.scst_epochs)
    steps = steps_per_epoch(counts["train"], train.batch_size)
    validated = min(train.val_images, counts["val"]) if train.val_images else counts["val"]
    parts = [
        f"plan: cross-entropy {xe}, then self-critical {scst}",
        f"{steps} steps per epoch ({counts['train']} training images, batch {train.batch_size})",
        f"images: train {counts['train']}, val {counts['val']} (validating on {validated})"
        + (f", test {counts['test']} (scored at the end)" if test else ""),
    ]
    rule = split_rule(config.data)
    if rule:
        parts.append(rule)
    if cache_dir is not None:
        parts.append(f"feature cache in {cache_location(cache_dir)}")
    if train.max_steps:
        parts.append(f"stopping at step {train.max_steps} (train.max_steps)")
    if not state:
        parts.append("a new run")
    else:
        where = (
            f"resuming from step {state.get('global_step', 0)}: stage {stage} ({STAGE_NAMES[stage]}), "
            f"{epoch} epoch{'s' * (epoch != 1)} done"
        )
        if state.get("batch_in_epoch"):
            where += f", {state['batch_in_epoch']} batches into epoch {epoch + 1}"
        parts.append(where)
    if precision:
        parts.append(precision)
    if busy:
        parts.append(busy)
    return "; ".join(parts)
