"""The main job: data -> features -> cross-entropy -> (self-critical) -> test scores -> figures."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from captioning.config import Config, to_dict
from captioning.config.loading import save_config
from captioning.data import build_vocabulary, data_source, load_records, write_data_summary
from captioning.data.cache_build import cache_batch_size
from captioning.data.datasets import CaptionDataset
from captioning.data.records import ImageRecord, records_of_split
from captioning.hub.checkpoint import (
    CheckpointError,
    atomic_write,
    best_checkpoint_of,
    checkpoint_config,
    load_checkpoint,
)
from captioning.inference.inputs import (
    caption_dataset,
    check_splits,
    feature_cache_dir,
    uses_cache,
)
from captioning.models.base import CaptionDecoder
from captioning.models.captioner import Captioner, build_decoder
from captioning.models.encoders import Encoder, build_encoder
from captioning.models.encoders.activations import check_encoder_fits
from captioning.models.memory_bounds import check_decoder_fits, check_decoding_fits, check_rollouts_fit
from captioning.training.claim import auto_resume_point
from captioning.training.cpu_threads import busy_machine_advice, say_if_busy
from captioning.training.engine import TrainState
from captioning.training.plan import (
    check_images_exist,
    describe_plan,
    resumed_length,
    warmup_note,
)
from captioning.training.resume_state import check_resume_payload, check_training_fits
from captioning.training.trainer import Trainer
from captioning.utils import distributed
from captioning.utils.device import amp_dtype, bf16_cost, resolve_device, seed_everything
from captioning.utils.output_paths import check_output_folder
from captioning.utils.run_folder import (
    CHECKPOINTS,
    RunLock,
    check_run_subfolders,
    claim_output_dir,
    remove_outputs,
)

AUTO = "auto"  # resume from the output folder's last.pt when there is one, else start a new run


@dataclass
class RunOutputs:
    """What a run wrote, for the closing summary."""

    output_dir: Path
    files: dict[str, Path] = field(default_factory=dict)
    state: TrainState | None = None
    lock: RunLock | None = None  # held by rank 0 until the main job ends (or the process)
    caption_warning: str | None = (
        None  # the last captions were mostly empty or the same (degenerate_captions)
    )


def check_encoder_passes(encoder: Encoder, config: Config, device: torch.device) -> None:
    """Refuse, before the data are read, encoder passes whose activations do not fit in free memory:
    the feature cache's batches, or (no cache) the training batches (kept for the backward pass when
    the encoder is fine-tuned) and the validation's decoding batches."""
    if uses_cache(config):
        images = cache_batch_size(device)
        check_encoder_fits(encoder, images, device, None)
        return
    fine_tuned = config.model.encoder.fine_tune_stages > 0
    check_encoder_fits(encoder, config.train.batch_size, device, "train.batch_size", training=fine_tuned)
    check_encoder_fits(encoder, config.decode.batch_size, device, "decode.batch_size")


def build_run_model(
    config: Config,
    resume: Path | None,
    device: torch.device,
    group: distributed.ProcessGroup,
    test: bool = False,
) -> tuple[list[ImageRecord], Captioner]:
    """The dataset's records and the model (vocabulary from ``resume`` when given), writing nothing
    in the output folder: an unknown encoder, a missing weights or split file fails here.

    Every input is checked before the first image is read: the data files and folders, the
    splits the run needs (``test`` too when it is scored after training), every image file, and
    the checkpoint to resume; then rank 0 prints the plan (``describe_plan``).
    """
    # The encoder first: a weights file it lacks (offline, a mistyped path) is refused before the
    # data are read or generated (Shapes writes tens of MB). Nothing between this and the decoder
    # draws from torch's random stream, so the weights are those Captioner.build gives.
    encoder = build_encoder(config.model.encoder)
    check_encoder_passes(encoder, config, device)
    records = load_records(config.data, write_index=group.is_main)  # the dataset index: rank 0
    needed = ("train", "val", "test") if test else ("train", "val")
    counts = check_splits(records, config.data.dataset, needed, data_source(config.data))
    check_images_exist([r for r in records if r.split in needed], config.data.skip_bad_images)
    train_records = records_of_split(records, "train")
    if resume is not None:
        payload = load_checkpoint(resume)
        _, vocab = checkpoint_config(payload, resume)
        state = (payload.get("training") or {}).get("state")
    else:
        vocab = build_vocabulary(train_records, config.data.min_word_count)
        state = None
    # What the run will need, before the plan and its first step: the decoder's parameters (with their
    # gradients and Adam's moments), the validation's decoding and the self-critical rollouts.
    positions, channels = encoder.grid[0] * encoder.grid[1], encoder.channels
    check_decoder_fits(config.model.decoder, len(vocab), channels, encoder.grid, device, training=True)
    validated = min(config.train.val_images or counts["val"], counts["val"])  # decoded after every epoch
    check_decoding_fits(config.decode, len(vocab), positions, validated, device, channels)
    check_rollouts_fit(config, len(vocab), positions, channels, device)
    if group.is_main:
        cache_dir = feature_cache_dir(config, Path(config.train.output_dir)) if uses_cache(config) else None
        plan = describe_plan(
            config,
            counts,
            state,
            test,
            cache_dir,
            busy_machine_advice(device),
            bf16_cost(device, config.train.amp),
        )
        print(plan, flush=True)
        note = warmup_note(config, counts["train"])
        if note:
            print(note, flush=True)
    decoder = build_decoder(config.model.decoder, len(vocab), encoder.channels, encoder.grid)
    model = Captioner(encoder, decoder, vocab, config.model).to(device)
    model.encoder.set_trainable(config.model.encoder.fine_tune_stages)
    return records, model


def run_datasets(
    records: list[ImageRecord],
    model: Captioner,
    config: Config,
    output_dir: Path,
    progress: bool,
    device: torch.device,
    group: distributed.ProcessGroup | None = None,
) -> tuple[CaptionDataset, CaptionDataset]:
    """The training and validation datasets (filling the feature cache where needed; every rank of
    ``group`` calls this, and they fill it together)."""
    train_set = caption_dataset(
        records_of_split(records, "train"),
        model,
        config,
        device,
        output_dir,
        progress,
        config.train.captions_per_image,
        group,
    )
    val_set = caption_dataset(
        records_of_split(records, "val"), model, config, device, output_dir, progress, 1, group
    )
    return train_set, val_set


def check_resume(config: Config, output_dir: Path, resume: Path) -> dict:
    """Everything that would refuse ``--resume`` before the model is built, checked before the run
    writes anything; returns the loaded checkpoint (``check_training_fits`` takes it once the model is built).

    Raises:
        CheckpointError: the checkpoint is not in this run's ``checkpoints/`` folder (it would mix two
            runs), is unreadable, has no training state or a damaged one, or was trained under another
            configuration.
    """

    if Path(resume).is_dir():
        raise CheckpointError(
            f"{resume}: a folder; --resume continues a run from its checkpoint (e.g. "
            "runs/shapes/checkpoints/last.pt, or --resume auto): a model folder holds no training state "
            "to continue, train a new run from its configuration instead"
        )
    own = Path(os.path.abspath(resume)).parent.parent
    if Path(os.path.abspath(resume)).parent != Path(os.path.abspath(output_dir)) / CHECKPOINTS:
        if Path(os.path.abspath(resume)).parent.name != CHECKPOINTS:
            raise CheckpointError(
                f"{resume}: --resume continues a run from a checkpoint in its run folder's "
                f"{CHECKPOINTS}/ (e.g. {own.name or 'run'}/{CHECKPOINTS}/last.pt); this file is not in one"
            )
        raise CheckpointError(
            f"{resume}: --resume continues a run in its own folder, but this run writes to "
            f"{output_dir}; pass --output-dir {own}"
        )
    payload = load_checkpoint(resume)
    check_resume_payload(payload, config, resume)
    return payload


def train(
    config: Config,
    resume: str | Path | None = None,
    progress: bool = True,
    test: bool = False,
    length_given: Collection[str] | None = None,
) -> RunOutputs:
    """Train as configured (``start_run``, then ``Trainer.fit``); returns what was written where."""
    with start_run(config, resume, progress, test, length_given) as run:
        run.trainer.fit()
    return run.outputs


@dataclass
class Run:
    """A claimed run folder and its trainer, ready to ``fit`` (what ``start_run`` returns).

    As a context manager: on leaving without an error it lists the run's files and writes
    ``history.json``; on an error it lets go of the folder (and removes it when this run made it and
    left it empty), then the error goes on.
    """

    config: Config
    trainer: Trainer
    outputs: RunOutputs
    group: distributed.ProcessGroup
    new_folder: bool

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        trainer, outputs, group, config = self.trainer, self.outputs, self.group, self.config
        output_dir = outputs.output_dir
        trainer.log.close()
        if kind is None:
            try:
                outputs.state = trainer.state
                outputs.caption_warning = trainer.caption_warning
                if group.is_main:
                    for name in ("last", "best", "best_scst"):
                        path = trainer.checkpoint_dir / f"{name}.pt"
                        if path.exists():
                            outputs.files[f"checkpoint ({name})"] = path
                    outputs.files["TensorBoard logs"] = output_dir / "tensorboard"
                    if trainer.log.steps_path.exists():  # no step was taken in a run of 0 epochs
                        outputs.files["step log"] = trainer.log.steps_path
                    history = output_dir / "history.json"
                    text = json.dumps(
                        {
                            "config": to_dict(config),
                            "epochs": trainer.state.history,
                            "stops": trainer.state.stops,
                        },
                        indent=1,
                    )
                    atomic_write(history, lambda p: p.write_text(text))
                    outputs.files["epoch history"] = history
            except BaseException:
                _let_go(outputs, group, self.new_folder)
                raise
            distributed.barrier()
            return
        _let_go(outputs, group, self.new_folder)


def _let_go(outputs: RunOutputs, group: distributed.ProcessGroup, new_folder: bool) -> None:
    """A failed run lets go of its folder (a later run in this process may use it), and does not
    leave behind an empty folder it made (a full disk)."""
    if outputs.lock is not None:
        outputs.lock.release(failed=True)
    if new_folder and group.is_main:
        with contextlib.suppress(OSError):
            outputs.output_dir.rmdir()


def start_run(
    config: Config,
    resume: str | Path | None = None,
    progress: bool = True,
    test: bool = False,
    length_given: Collection[str] | None = None,
) -> Run:
    """Everything before the training loop, behind one call: the device and process group, the
    seeds, the output folder checked and claimed (or ``--resume`` / ``--resume auto`` validated before
    anything is written), the data read and the model built, the feature cache filled, the trainer
    made and, on resume, its state loaded; the training streams are seeded again just before ``fit``.

    Args:
        config: the resolved configuration.
        resume: a checkpoint to continue from (``--resume``); ``"auto"`` for the output folder's
            last.pt when there is one, else a new run (also ``train.resume: auto``); None for a
            new run.
        test: the test split is scored after training, so it must have images (checked first).
        length_given: the length keys (``train.epochs``, ``train.scst_epochs``) the command line set;
            a resumed run takes the others from its checkpoint (``plan.resumed_length``). None: the
            configuration's own are meant.
    """
    device = resolve_device(config.train.device)
    amp_dtype(device, config.train.amp)  # fp16 on CPU is refused before anything is read or written
    group = distributed.init_from_environment(device.type)
    if device.type == "cuda" and group.world_size > 1:
        device = torch.device("cuda", group.local_rank)
        torch.cuda.set_device(device)
    seed_everything(config.train.seed + group.rank, config.train.deterministic)
    output_dir = Path(config.train.output_dir)
    if group.is_main:  # a run already using the folder refuses this one before any data are read
        check_output_folder(output_dir, "train.output_dir")
        check_run_subfolders(output_dir)
        RunLock(output_dir).check_free()
        say_if_busy(device)
    config, point = _resume_point(config, output_dir, group, resume, length_given)
    if not group.is_main:  # rank 0 reads (or generates) the data first; then all ranks fill the feature cache
        distributed.barrier()
    records, model = build_run_model(config, point.resume, device, group, test)
    if point.stored is not None and point.resume is not None:  # stored is the checkpoint resume names
        check_training_fits(point.stored, point.stored["training"], model, config, point.resume)
        point.stored = None  # the weights and moments are loaded again, by the trainer
    outputs = RunOutputs(output_dir)
    new_folder = not output_dir.exists()
    trainer = None
    try:
        if group.is_main:  # nothing is written before this point: bad input leaves no folder behind
            _claim_run_folder(config, records, outputs, point)
            # The data are read (generated) and the folder is claimed: the other ranks go on.
            distributed.barrier()
        trainer = _ready_trainer(config, records, model, outputs, device, group, progress)
        # Seed the training streams (dropout, sampling) again now that set-up is over: set-up draws
        # from them a varying number of times (a rank that computes feature-cache rows runs DataLoaders,
        # and each DataLoader iterator without a generator draws its base seed from the global RNG), which
        # made rank 0's dropout masks depend on whether the cache existed before the launch.
        seed_everything(config.train.seed + group.rank, config.train.deterministic)
        if point.resume is not None:
            trainer.resume(point.resume)
            if group.is_main:
                print(
                    f"resumed from {point.resume}: stage {trainer.state.stage}, "
                    f"epoch {trainer.state.epoch + 1}, step {trainer.state.global_step}",
                    flush=True,
                )
    except BaseException:
        if trainer is not None:
            trainer.log.close()
        _let_go(outputs, group, new_folder)
        raise
    return Run(config, trainer, outputs, group, new_folder)


@dataclass
class _ResumePoint:
    """Where a run starts: ``resume``, the checkpoint it continues (None: a new run) and ``stored``, that
    checkpoint as loaded; ``auto``: ``--resume auto`` was asked for; ``start_over``: it was, after a
    launch that wrote no checkpoint."""

    resume: Path | None
    stored: dict | None
    auto: bool
    start_over: bool


def _resume_point(
    config: Config,
    output_dir: Path,
    group: distributed.ProcessGroup,
    resume: str | Path | None,
    length_given: Collection[str] | None,
) -> tuple[Config, _ResumePoint]:
    """The run's configuration (a resumed run's lengths as ``plan.resumed_length`` says) and where it
    starts, ``--resume`` validated before anything is written: a refused resume leaves the folder as
    it was."""
    if resume is None and config.train.resume == AUTO:
        resume = AUTO
    start_over = False  # --resume auto after a launch that wrote no checkpoint
    auto = resume == AUTO
    if auto:
        resume, start_over = auto_resume_point(config, output_dir, group)
    else:
        resume = Path(resume) if resume is not None else None
    stored = None
    if resume is not None:
        stored = check_resume(config, output_dir, resume)
        if length_given is not None:
            config, note = resumed_length(
                config,
                checkpoint_config(stored, resume)[0],
                length_given,
                stored["training"]["state"].get("stage", "xe"),
            )
            if note and group.is_main:
                print(note, flush=True)
    return config, _ResumePoint(resume, stored, auto, start_over)


def _claim_run_folder(
    config: Config, records: list[ImageRecord], outputs: RunOutputs, point: _ResumePoint
) -> None:
    """Rank 0 makes and locks the output folder, clears it for a new run (or a start over), and writes
    the configuration and the data summary there."""
    output_dir = outputs.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    outputs.lock = RunLock(output_dir).acquire()
    if point.start_over:
        remove_outputs(
            output_dir,
            f"resume auto: no checkpoint in {output_dir} yet; starting the run over "
            "(deleted the {count} files an earlier launch left)",
        )
    elif point.resume is None:
        claim_output_dir(output_dir, config.train.overwrite)
        if point.auto:
            print(f"resume auto: no checkpoint in {output_dir}; starting a new run", flush=True)
    # Atomic: a relaunch with --resume auto reads it back.
    atomic_write(output_dir / "config.yaml", lambda path: save_config(config, path))
    outputs.files["configuration"] = output_dir / "config.yaml"
    outputs.files["data summary"] = write_data_summary(records, config.data, output_dir)


def _ready_trainer(
    config: Config,
    records: list[ImageRecord],
    model: Captioner,
    outputs: RunOutputs,
    device: torch.device,
    group: distributed.ProcessGroup,
    progress: bool,
) -> Trainer:
    """The trainer, once the datasets are made (the feature cache filled), the vocabulary saved and
    the decoder compiled and wrapped for several processes."""
    output_dir = outputs.output_dir
    main_progress = progress and group.is_main
    train_set, val_set = run_datasets(records, model, config, output_dir, main_progress, device, group)
    if group.is_main:
        model.vocab.save(output_dir / "vocab.json")
        outputs.files["vocabulary"] = output_dir / "vocab.json"
        print(
            f"data: {len(train_set)} training and {len(val_set)} validation images, "
            f"vocabulary {len(model.vocab)} words, encoder {model.encoder.name} "
            f"({model.encoder.channels} channels, grid {model.encoder.grid[0]}x{model.encoder.grid[1]}), "
            f"device {device}",
            flush=True,
        )
    if config.train.compile:
        model.decoder.compile_step()
    if group.world_size > 1 and config.model.encoder.fine_tune_stages:
        # One starting point, as the wrap gives the decoder.
        distributed.broadcast_parameters(model.encoder)
    # With several processes DistributedDataParallel takes the decoder's place: its forward is the
    # decoder's, and everything else reaches the decoder through distributed.unwrap, which is why
    # the attribute keeps the decoder's type.
    model.decoder = cast(CaptionDecoder, distributed.wrap(model.decoder, group, device))
    return Trainer(config, output_dir, model, train_set, val_set, device, group, progress)


def best_checkpoint(output_dir: Path) -> Path:
    """The checkpoint to evaluate (``hub.checkpoint.best_checkpoint_of``: the best validation metric
    their training state records, else ``last.pt``)."""
    return best_checkpoint_of(output_dir)
