"""The main job: data -> features -> cross-entropy -> (self-critical) -> test scores -> figures."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from captioning.config import Config, config_json, load_config, save_config, to_dict
from captioning.data import build_vocabulary, load_records
from captioning.data.datasets import CaptionDataset
from captioning.data.feature_cache import FeatureCache
from captioning.data.records import ImageRecord, records_of_split
from captioning.models.captioner import Captioner
from captioning.training import distributed
from captioning.training.checkpoint import (
    CheckpointError,
    atomic_write,
    checkpoint_config,
    load_checkpoint,
)
from captioning.training.engine import TrainState
from captioning.training.trainer import Trainer, check_resumable

AUTO = "auto"  # resume from the output folder's last.pt when there is one, else start a new run


@dataclass
class RunOutputs:
    """What a run wrote, for the closing summary."""

    output_dir: Path
    files: dict[str, Path] = field(default_factory=dict)
    test_scores: dict | None = None
    state: TrainState | None = None


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available; anything else is passed to ``torch.device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for, but CUDA is not available")
    return device


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def feature_cache_dir(config: Config, output_dir: Path) -> Path:
    """Shared by runs over the same data: under the data root unless configured."""
    if config.data.cache_dir:
        return Path(config.data.cache_dir)
    return Path(config.data.root) / "features" if config.data.dataset != "folder" else output_dir / "features"


def uses_cache(config: Config) -> bool:
    return config.data.use_cache and config.model.encoder.fine_tune_stages == 0


def caption_dataset(records: list[ImageRecord], model: Captioner, config: Config, device: torch.device,
                    output_dir: Path, progress: bool, captions_per_image: int) -> CaptionDataset:
    """A dataset over ``records``: cached grids for a frozen encoder, images otherwise."""
    common = {"vocab": model.vocab, "max_length": config.data.max_caption_length,
              "captions_per_image": captions_per_image, "seed": config.train.seed,
              "skip_bad_images": config.data.skip_bad_images}
    if uses_cache(config):
        cache = FeatureCache.build_or_open(feature_cache_dir(config, output_dir), model.encoder, records,
                                           batch_size=32, device=device, num_workers=config.data.num_workers,
                                           progress=progress, skip_bad_images=config.data.skip_bad_images)
        return CaptionDataset(records, features=cache, unreadable=set(cache.bad), **common)
    return CaptionDataset(records, transform=model.encoder.transform, **common)


def prepare_run(config: Config, output_dir: Path, resume: Path | None, progress: bool,
                group: distributed.ProcessGroup, device: torch.device):
    """Records, vocabulary, model and datasets for a run (the vocabulary from the checkpoint on resume)."""
    records = load_records(config.data, output_dir)
    train_records = records_of_split(records, "train")
    val_records = records_of_split(records, "val")
    if not train_records or not val_records:
        raise ValueError(f"the dataset has {len(train_records)} training and {len(val_records)} validation "
                         "images; training needs both")
    if resume is not None:
        _, vocab = checkpoint_config(load_checkpoint(resume), resume)
    else:
        vocab = build_vocabulary(train_records, config.data.min_word_count)
    model = Captioner.build(config.model, vocab).to(device)
    model.encoder.set_trainable(config.model.encoder.fine_tune_stages)
    train_set = caption_dataset(train_records, model, config, device, output_dir, progress,
                                config.train.captions_per_image)
    val_set = caption_dataset(val_records, model, config, device, output_dir, progress, 1)
    return records, model, train_set, val_set


def cache_features(config: Config, progress: bool = True) -> dict[str, Path]:
    """Run the frozen encoder once over every split and store the grids (``train.py --cache-only``)."""
    if not uses_cache(config):
        raise ValueError("features are cached only for a frozen encoder with data.use_cache true")
    device = resolve_device(config.train.device)
    records = load_records(config.data, Path(config.train.output_dir))
    vocab = build_vocabulary(records_of_split(records, "train") or records, config.data.min_word_count)
    model = Captioner.build(config.model, vocab).to(device)
    written = {}
    for split in ("train", "val", "test"):
        split_records = [r for r in records_of_split(records, split) if r.captions]
        if split_records:
            dataset = caption_dataset(split_records, model, config, device, Path(config.train.output_dir),
                                      progress, 1)
            written[f"{split} features"] = Path(dataset.features.path)
    return written


def _claim_output_dir(output_dir: Path, overwrite: bool, group: distributed.ProcessGroup) -> None:
    """A new run must not mix with an earlier run's checkpoints and logs in the same folder.

    Without ``train.overwrite`` such a folder is refused (its best checkpoint would otherwise be
    scored as this run's); with it, the earlier run's checkpoints, step log, history and
    TensorBoard events are deleted first.
    """
    earlier = sorted((output_dir / "checkpoints").glob("*.pt"))
    if not earlier:
        return
    if not overwrite:
        raise CheckpointError(f"{output_dir}: holds an earlier run's checkpoints ({', '.join(p.name for p in earlier)}); "
                              "continue it with --resume, replace it with --set train.overwrite=true, or choose "
                              "another --output-dir")
    _delete_run_files(output_dir, group, f"overwrite: deleted the earlier run's checkpoints and logs in {output_dir}")


def _delete_run_files(output_dir: Path, group: distributed.ProcessGroup, message: str) -> None:
    """Delete the checkpoints, step log, history and TensorBoard events in ``output_dir`` (rank 0)."""
    distributed.barrier()  # every rank has looked before rank 0 deletes
    if group.is_main:
        for path in [*(output_dir / "checkpoints").glob("*.pt"), output_dir / "steps.jsonl",
                     output_dir / "history.json", *(output_dir / "tensorboard").glob("events.out.tfevents.*")]:
            path.unlink(missing_ok=True)
        print(message, flush=True)
    distributed.barrier()


def _auto_resume_point(config: Config, output_dir: Path, group: distributed.ProcessGroup) -> Path | None:
    """``--resume auto``: the folder's ``last.pt`` when there is one, else None (a new run).

    Under ``torchrun --max-restarts`` or a requeueing scheduler the same command runs again after a
    failure or a preemption: it continues from the last checkpoint, or starts over when the launch
    before wrote none. What such a launch left behind (its config.yaml, step log, TensorBoard events,
    a best.pt written just before it died) is cleared then, provided its config.yaml holds this
    configuration; a different one is refused as ``--resume`` refuses a changed configuration. Rank 0
    looks and every rank follows its answer.

    Raises:
        CheckpointError: the folder's configuration differs, or it holds checkpoints but no
            config.yaml (not a launch of this command) and ``train.overwrite`` is off.
    """
    last, stored = output_dir / "checkpoints" / "last.pt", output_dir / "config.yaml"
    has_last, has_config = distributed.broadcast_object((last.is_file(), stored.is_file()) if group.is_main else None)
    if has_last:
        return last
    if not has_config:
        _claim_output_dir(output_dir, config.train.overwrite, group)
        if group.is_main:
            print(f"resume auto: no checkpoint in {output_dir}; starting a new run", flush=True)
        return None
    check_resumable(load_config(stored), config, "xe", stored)
    _delete_run_files(output_dir, group, f"resume auto: no checkpoint in {output_dir} yet; starting the run over "
                                         "(cleared the logs an earlier launch left)")
    return None


def train(config: Config, resume: str | Path | None = None, progress: bool = True) -> RunOutputs:
    """Train as configured; returns what was written where.

    Args:
        config: the resolved configuration.
        resume: a checkpoint to continue from (``--resume``); ``"auto"`` for the output folder's
            last.pt when there is one, else a new run (also ``train.resume: auto``); None for a
            new run.
    """
    device = resolve_device(config.train.device)
    group = distributed.init_from_environment(device.type)
    if device.type == "cuda" and group.world_size > 1:
        device = torch.device("cuda", group.local_rank)
        torch.cuda.set_device(device)
    seed_everything(config.train.seed + group.rank, config.train.deterministic)
    output_dir = Path(config.train.output_dir)
    if resume is None and config.train.resume == AUTO:
        resume = AUTO
    if resume == AUTO:
        resume = _auto_resume_point(config, output_dir, group)
    else:
        resume = Path(resume) if resume is not None else None
        if resume is None:
            _claim_output_dir(output_dir, config.train.overwrite, group)
    output_dir.mkdir(parents=True, exist_ok=True)
    outputs = RunOutputs(output_dir)

    if group.is_main:
        print(f"configuration: {config_json(config)}", flush=True)
        # Atomic: a relaunch with --resume auto reads it back.
        atomic_write(output_dir / "config.yaml", lambda path: save_config(config, path))
        outputs.files["configuration"] = output_dir / "config.yaml"
    if not group.is_main:  # rank 0 generates data and fills the feature cache; the others then read it
        distributed.barrier()
    _, model, train_set, val_set = prepare_run(config, output_dir, resume, progress and group.is_main,
                                                     group, device)
    if group.is_main:
        distributed.barrier()
    if group.is_main:
        model.vocab.save(output_dir / "vocab.json")
        outputs.files["vocabulary"] = output_dir / "vocab.json"
        print(f"data: {len(train_set)} training and {len(val_set)} validation images, "
              f"vocabulary {len(model.vocab)} words, encoder {model.encoder.name} "
              f"({model.encoder.channels} channels, grid {model.encoder.grid[0]}x{model.encoder.grid[1]}), "
              f"device {device}", flush=True)
    if config.train.compile:
        model.decoder.compile_step()
    if group.world_size > 1 and config.model.encoder.fine_tune_stages:
        distributed.broadcast_parameters(model.encoder)  # one starting point, as the wrap gives the decoder
    model.decoder = distributed.wrap(model.decoder, group, device)
    trainer = Trainer(config, output_dir, model, train_set, val_set, device, group, progress)
    # Seed the training streams (dropout, sampling) again now that set-up is over: set-up draws
    # from them a varying number of times (rank 0 alone fills the feature cache, and each
    # DataLoader iterator without a generator draws its base seed from the global RNG), which
    # made rank 0's dropout masks depend on whether the cache existed before the launch.
    seed_everything(config.train.seed + group.rank, config.train.deterministic)
    if resume is not None:
        trainer.resume(resume)
        if group.is_main:
            print(f"resumed from {resume}: stage {trainer.state.stage}, epoch {trainer.state.epoch + 1}, "
                  f"step {trainer.state.global_step}", flush=True)
    try:
        outputs.state = trainer.fit()
    finally:
        if trainer.writer is not None:
            trainer.writer.close()
    if group.is_main:
        for name in ("last", "best", "best_scst"):
            path = trainer.checkpoint_dir / f"{name}.pt"
            if path.exists():
                outputs.files[f"checkpoint ({name})"] = path
        outputs.files["TensorBoard logs"] = output_dir / "tensorboard"
        if trainer.steps_log.exists():  # no step was taken in a run of 0 epochs
            outputs.files["step log"] = trainer.steps_log
        history = output_dir / "history.json"
        text = json.dumps({"config": to_dict(config), "epochs": trainer.state.history}, indent=1)
        atomic_write(history, lambda p: p.write_text(text))
        outputs.files["epoch history"] = history
    distributed.barrier()
    return outputs


def best_checkpoint(output_dir: Path) -> Path:
    """The checkpoint to evaluate: of ``best_scst.pt`` and ``best.pt``, the one with the higher
    validation metric (self-critical epochs need not beat the cross-entropy model they start
    from; a tie goes to the self-critical one), else ``last.pt``."""
    scored = []
    for order, name in enumerate(("best_scst", "best")):
        path = output_dir / "checkpoints" / f"{name}.pt"
        if path.exists():
            state = (load_checkpoint(path).get("training") or {}).get("state", {})
            scored.append((state.get("best_metric", -math.inf), -order, path))
    if scored:
        return max(scored)[2]
    last = output_dir / "checkpoints" / "last.pt"
    if last.exists():
        return last
    raise CheckpointError(f"{output_dir / 'checkpoints'}: no checkpoint found")

