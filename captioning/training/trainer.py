"""The trainer: the epoch loop of both stages, validation by decoding, checkpoints and exact resume."""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter

from captioning.config import PER_STEP_SCHEDULES, Config, to_dict
from captioning.data.datasets import CaptionDataset, collate_captions, usable_workers
from captioning.evaluation.degenerate import degenerate_captions
from captioning.evaluation.metrics import score_captions
from captioning.models.captioner import Captioner
from captioning.runtime import distributed
from captioning.runtime.checkpoint import (
    CheckpointError,
    atomic_write,
    checkpoint_config,
    load_checkpoint,
    load_state_checked,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from captioning.runtime.inference import EpochBatches, generate_captions
from captioning.text import detokenize
from captioning.training.averaging import WeightAverage, trainable_parameters
from captioning.training.engine import TrainState, steps_per_epoch, train_one_epoch
from captioning.training.optim import optimizer_for, scheduler_for
from captioning.training.rewards import CiderDReward
from captioning.training.stopping import EXIT_STATUS, StopRequest, TrainingStopped


def loader_for(dataset: CaptionDataset, batches, config: Config, device: torch.device) -> DataLoader:
    # An own generator: creating the loader's iterator must not draw from the global RNG, or a
    # resumed run (whose iterator starts mid-epoch) would see different dropout masks.
    return DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=collate_captions,
        num_workers=usable_workers(config.data.num_workers),
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(config.train.seed),
    )


def decode_records(
    model: Captioner,
    dataset: CaptionDataset,
    config: Config,
    device: torch.device,
    limit: int = 0,
    progress: bool = True,
    desc: str = "decoding",
    group: distributed.ProcessGroup = distributed.SINGLE_PROCESS,
):
    """Caption the first ``limit`` (0 = all) images of ``dataset``: (index, image id, Caption) triples.

    With several processes each decodes its own share (whole batches of ``decode.batch_size``)
    and returns only those.
    """
    count = len(dataset) if not limit else min(limit, len(dataset))
    batches = EpochBatches(
        count,
        config.decode.batch_size * group.world_size,
        seed=0,
        epoch=0,
        shuffle=False,
        rank=group.rank,
        world_size=group.world_size,
    )
    return generate_captions(
        model,
        loader_for(dataset, batches, config, device),
        config.decode,
        device,
        progress=progress,
        desc=desc,
        amp=config.train.amp,
    )


def validation_scores(
    model: Captioner,
    dataset: CaptionDataset,
    config: Config,
    device: torch.device,
    progress: bool,
    group: distributed.ProcessGroup = distributed.SINGLE_PROCESS,
) -> tuple[dict[str, float | None], list[tuple[int, str, list[str]]], str | None]:
    """Decode the validation images for real and score them (CIDEr-D, BLEU-4 ...; no Java needed).

    Returns the scores, three (image id, caption, references) examples, and a warning line when
    the captions are mostly empty or the same (``degenerate_captions``), else None.

    With several processes the images are shared out, the captions gathered and scored on rank 0,
    and its scores given to every process (they all take the same schedule and stopping decisions).
    """
    triples = decode_records(
        model, dataset, config, device, config.train.val_images, progress, "validating", group
    )
    mine = [(index, image_id, detokenize(caption.words(model.vocab))) for index, image_id, caption in triples]
    gathered = distributed.gather_to_main(mine, group)
    result = None
    if gathered is not None:
        decoded = sorted(item for part in gathered for item in part)  # dataset order, as one process has it
        candidates = {image_id: caption for _, image_id, caption in decoded}
        references = {dataset.records[i].image_id: list(dataset.records[i].raw) for i, _, _ in decoded}
        scores = score_captions(references, candidates, use_java=False, tokenizer=config.data.tokenizer)
        examples = [(image_id, caption, references[image_id][:1]) for _, image_id, caption in decoded[:3]]
        result = (scores.overall, examples, degenerate_captions(list(candidates.values()), "validation"))
    return distributed.broadcast_object(result) if group.world_size > 1 else result


# What may differ between a checkpoint's configuration and the run that resumes it: how long and
# where to run, logging, and decoding (it only changes validation). The self-critical settings may
# still change while the checkpoint is in its cross-entropy stage.
RESUMABLE_KEYS = frozenset(
    [
        "train.epochs",
        "train.scst_epochs",
        "train.max_steps",
        "train.early_stop_patience",
        "train.checkpoint_every",
        "train.log_every",
        "train.val_images",
        "train.output_dir",
        "train.device",
        "train.amp",
        "train.compile",
        "train.deterministic",
        "train.nonfinite",
        "train.overwrite",
        "data.root",
        "data.cache_dir",
        "data.split_file",
        "data.annotations",
        "data.instances",
        "data.chair_table",
        "data.num_workers",
        "data.use_cache",
        "data.skip_bad_images",
        "train.resume",
    ]
)
RESUMABLE_BEFORE_SCST = frozenset(
    ["train.scst_lr", "train.scst_samples", "train.scst_baseline", "train.scst_reward_eos"]
)


def _flat(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def check_resumable(stored: Config, config: Config, stage: str, path: Path) -> None:
    """Refuse to resume a checkpoint under a configuration that would not continue the same run.

    Raises:
        CheckpointError: one line naming the first key that differs and may not change.
    """
    allowed = RESUMABLE_KEYS | (RESUMABLE_BEFORE_SCST if stage == "xe" else frozenset())
    old, new = _flat(to_dict(stored)), _flat(to_dict(config))
    changed = [
        key
        for key in new
        if old.get(key) != new[key] and key not in allowed and not key.startswith("decode.")
    ]
    if changed:
        key = changed[0]
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise CheckpointError(
            f"{path}: {key} is {old.get(key)!r} in the checkpoint but {new[key]!r} now{more}; "
            "a resumed run keeps its configuration (pass the same --config and flags), "
            "apart from its length, logging, paths and decoding"
        )


def _logged_step(line: str) -> float:
    """The step of a steps.jsonl line; infinite (so it is dropped) for a line cut short by a full disk
    or a kill mid-append."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, TypeError, KeyError):
        return math.inf
    return step if isinstance(step, int) else math.inf


class Trainer:
    """Holds a run's parts; ``fit`` runs the cross-entropy then the self-critical stage."""

    def __init__(
        self,
        config: Config,
        output_dir: Path,
        model: Captioner,
        train_set: CaptionDataset,
        val_set: CaptionDataset,
        device: torch.device,
        group: distributed.ProcessGroup,
        progress: bool,
    ):
        self.config, self.output_dir, self.model = config, output_dir, model
        self.train_set, self.val_set, self.device, self.group = train_set, val_set, device, group
        self.progress = progress and group.is_main
        self.state = TrainState()
        self.checkpoint_dir = output_dir / "checkpoints"
        self.writer = SummaryWriter(str(output_dir / "tensorboard")) if group.is_main else None
        self.steps_log = output_dir / "steps.jsonl"
        self.rewarder = None
        self.stop = StopRequest(group.world_size, device)
        self._last_saved_at: int | None = None  # the global step of the latest last.pt this run wrote
        self._step_lr: float | None = None  # the rate the latest step of this process used
        self.caption_warning: str | None = None  # the latest validation's, when its captions say nothing
        self.average = (
            WeightAverage(self._trainable(), config.train.ema_decay) if config.train.ema_decay else None
        )
        self._new_stage("xe")
        self.scaler = (
            torch.amp.GradScaler("cuda") if config.train.amp == "fp16" and device.type == "cuda" else None
        )

    # ------------------------------------------------------------------ state
    def _new_stage(self, stage: str) -> None:
        train = self.config.train
        # The self-critical stage scales a fine-tuned encoder's rate as it scales the decoder's.
        scale = train.scst_lr / train.lr if stage == "scst" else 1.0
        self.optimizer = optimizer_for(self.model, train.lr * scale, train.encoder_lr * scale, self.config)
        self.scheduler = scheduler_for(self.optimizer, self.config, stage, self._xe_steps)
        if stage == "scst" and self.rewarder is None:
            references = {r.image_id: [list(c) for c in r.captions] for r in self.train_set.records}
            # document frequencies once, from the training references
            reward = CiderDReward(references, end_token=train.scst_reward_eos)
            itos = self.model.vocab.itos
            self.rewarder = lambda ids, rows, finished: reward(
                ids, [[itos[t] for t in row] for row in rows], finished
            )

    def _trainable(self) -> dict[str, torch.nn.Parameter]:
        return trainable_parameters(
            {"decoder": distributed.unwrap(self.model.decoder), "encoder": self.model.encoder}
        )

    def _averaged(self) -> contextlib.AbstractContextManager:
        """The weights validation scores and checkpoints hold: the average with ``train.ema_decay``."""
        return self.average.applied() if self.average is not None else contextlib.nullcontext()

    def checkpoint(self, name: str) -> Path:
        """Write ``checkpoints/<name>.pt`` (rank 0 only).

        ``last`` holds everything ``--resume`` needs; the best checkpoints hold the weights and the
        run's position only: Adam's two moments would double or triple their size, and nothing
        resumes from them (the self-critical stage and evaluation take their weights alone). With
        ``train.ema_decay`` the weights are the average, and ``last`` keeps the optimiser's beside it.
        """
        path = self.checkpoint_dir / f"{name}.pt"
        resumable = name == "last"
        if resumable:
            self._last_saved_at = self.state.global_step
        rng = distributed.all_gather_objects(rng_state()) if resumable else None  # every rank's streams
        if not self.group.is_main:
            return path
        encoder = self.config.model.encoder
        training = {"state": self.state.to_dict()}
        if resumable:
            training.update(
                {
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict() if self.scheduler else None,
                    "scaler": self.scaler.state_dict() if self.scaler else None,
                    "rng": rng[0],
                    "rng_per_rank": rng,
                }
            )
            if self.average is not None:
                training["average"] = self.average.state_dict()
        with self._averaged():
            # Trained or random encoder weights cannot be rebuilt from their name: save them.
            encoder_state = (
                self.model.encoder.state_dict()
                if encoder.fine_tune_stages or encoder.weights == "none"
                else None
            )
            save_checkpoint(
                path,
                config=self.config,
                vocab=self.model.vocab,
                decoder_state=distributed.unwrap(self.model.decoder).state_dict(),
                encoder_state=encoder_state,
                encoder_fingerprint=self.model.encoder.fingerprint(),
                training=training,
            )
        return path

    def _stop_here(self) -> None:
        """Every process agreed to stop after this step: save ``last.pt`` and end the run.

        Raises:
            TrainingStopped: always, once every process knows ``last.pt`` is on disk.
        """
        state = self.state
        if self._last_saved_at != state.global_step:  # checkpoint_every may have just written it
            self.checkpoint("last")
        distributed.barrier()  # no process exits (and gets its job torn down) before the file is written
        message = (
            f"stopped by SIGTERM after step {state.global_step} ({state.stage} epoch {state.epoch + 1}): "
            f"{self.checkpoint_dir / 'last.pt'} holds the run; run the same command with --resume auto "
            f"to continue it (exit status {EXIT_STATUS})"
        )
        if self.group.is_main:
            print(message, flush=True)
        raise TrainingStopped(message)

    def resume(self, path: Path) -> None:
        """Continue from a checkpoint: weights, optimizer, schedule, position and RNG streams."""
        payload = load_checkpoint(path)
        training = payload.get("training")
        if not training:
            raise CheckpointError(f"{path}: has no training state to resume from")
        if "optimizer" not in training:
            raise CheckpointError(
                f"{path}: holds weights only, without the optimizer state a resumed run needs; "
                "resume from checkpoints/last.pt"
            )
        stored, vocab = checkpoint_config(payload, path)
        check_resumable(stored, self.config, training["state"].get("stage", "xe"), path)
        if vocab != self.model.vocab:
            raise CheckpointError(
                f"{path}: vocabulary differs from this run's ({len(vocab)} vs {len(self.model.vocab)} words)"
            )
        load_state_checked(distributed.unwrap(self.model.decoder), payload["decoder"], "decoder", path)
        if payload.get("encoder") is not None:
            load_state_checked(self.model.encoder, payload["encoder"], "encoder", path)
        if self.average is not None:  # the weights just loaded are the average; the optimiser's come back
            self.average.load_state_dict(training["average"])
        self.state = TrainState.from_dict(training["state"])
        self._new_stage(self.state.stage)
        self.optimizer.load_state_dict(training["optimizer"])
        if self.scheduler is not None and training.get("scheduler"):
            self.scheduler.load_state_dict(training["scheduler"])
        if self.scaler is not None and training.get("scaler"):
            self.scaler.load_state_dict(training["scaler"])
        per_rank = training.get("rng_per_rank") or [training["rng"]]
        same_ranks = len(per_rank) == self.group.world_size
        set_rng_state(
            per_rank[self.group.rank] if same_ranks else training["rng"]
        )  # exact with the same ranks
        self._trim_steps_log()

    def _trim_steps_log(self) -> None:
        """Forget logged steps after the checkpoint (a killed run may have logged a few more)."""
        if not self.steps_log.exists() or not self.group.is_main:
            return
        kept = [
            line
            for line in self.steps_log.read_text(encoding="utf-8", errors="replace").splitlines()
            if _logged_step(line) <= self.state.global_step
        ]
        atomic_write(self.steps_log, lambda p: p.write_text("".join(line + "\n" for line in kept)))

    # ------------------------------------------------------------------ loop
    @property
    def _per_step_schedule(self) -> bool:
        return self.config.train.schedule in PER_STEP_SCHEDULES and self.scheduler is not None

    @property
    def _xe_steps(self) -> int:
        """The cross-entropy stage's optimisation steps, over which ``cosine`` decays."""
        return self.config.train.epochs * steps_per_epoch(len(self.train_set), self.config.train.batch_size)

    def _on_step(self, state: TrainState, numbers: dict[str, float]) -> None:
        if self.average is not None:
            self.average.update()
        if self.group.is_main:
            with self.steps_log.open("a") as log:
                log.write(
                    json.dumps(
                        {"step": state.global_step, "epoch": state.epoch + 1, "stage": state.stage, **numbers}
                    )
                    + "\n"
                )
            if state.global_step % self.config.train.log_every == 0:
                for key, value in numbers.items():
                    self.writer.add_scalar(f"train/{key}", value, state.global_step)
                self.writer.add_scalar("train/lr", self.optimizer.param_groups[0]["lr"], state.global_step)
        if self._per_step_schedule:  # after logging the rate this step used, before a checkpoint keeps it
            self._step_lr = self.optimizer.param_groups[0]["lr"]
            self.scheduler.step()
        every = self.config.train.checkpoint_every
        if every and state.global_step % every == 0:
            self.checkpoint("last")

    def _stage_epochs(self, stage: str) -> int:
        return self.config.train.scst_epochs if stage == "scst" else self.config.train.epochs

    def fit(self) -> TrainState:
        """Run the remaining epochs of both stages, validating after each epoch.

        SIGTERM stops every process at the next step boundary, after ``last.pt`` is written.

        Raises:
            TrainingStopped: stopped by SIGTERM (exit status 75 from the command line).
        """
        with self.stop:
            return self._fit()

    def _fit(self) -> TrainState:
        for stage in ("xe", "scst"):
            if stage == "scst" and self.state.stage == "xe":
                # Early stopping ends the cross-entropy stage only; max_steps ends the run.
                if not self.config.train.scst_epochs or self._out_of_steps:
                    break
                self.state = replace(
                    self.state,
                    stage="scst",
                    epoch=0,
                    batch_in_epoch=0,
                    best_metric=-math.inf,
                    best_epoch=-1,
                    epochs_without_improvement=0,
                )
                best = self.checkpoint_dir / "best.pt"
                if best.exists():  # self-critical training starts from the best cross-entropy model
                    payload = load_checkpoint(best)
                    load_state_checked(
                        distributed.unwrap(self.model.decoder), payload["decoder"], "decoder", best
                    )
                    if payload.get("encoder") is not None:
                        load_state_checked(self.model.encoder, payload["encoder"], "encoder", best)
                    if self.group.is_main:
                        print(f"self-critical training starts from {best}", flush=True)
                if (
                    self.average is not None
                ):  # the stage averages its own steps, from the weights it starts at
                    self.average.reset()
                self._new_stage("scst")
            if self.state.stage != stage:
                continue
            while self.state.epoch < self._stage_epochs(stage) and not self._stopped:
                self._run_epoch()
        return self.state

    @property
    def _out_of_steps(self) -> bool:
        return bool(self.config.train.max_steps) and self.state.global_step >= self.config.train.max_steps

    @property
    def _stopped(self) -> bool:
        """The current stage is over early: out of steps, or no gain in ``early_stop_patience`` epochs."""
        patience = self.config.train.early_stop_patience
        return self._out_of_steps or (patience > 0 and self.state.epochs_without_improvement >= patience)

    def _loss_text(self, numbers: dict[str, float]) -> str:
        """The epoch's loss with its parts: a caption's doubly stochastic penalty cannot go below
        P (1 - T/P)^2 for P grid cells and T steps (171 at 14x14 for 13 steps), so the total
        alone hides the cross-entropy."""
        loss = numbers.get("loss", float("nan"))
        text = f"loss {loss:.3f}"
        if "cross_entropy" in numbers:
            weight = self.config.model.decoder.doubly_stochastic
            text += (
                f" = cross-entropy {numbers['cross_entropy']:.3f} + {weight:g} x attention penalty "
                f"{numbers['attention_penalty']:.3f}"
            )
            if not math.isclose(
                loss,
                numbers["cross_entropy"] + weight * numbers["attention_penalty"],
                rel_tol=1e-4,
                abs_tol=1e-4,
            ):
                text += " + hard-attention terms"
        if "reward" in numbers:
            text += f" (reward {numbers['reward']:.3f}, baseline {numbers['baseline']:.3f})"
        return text

    def _run_epoch(self) -> None:
        config, state = self.config, self.state
        self.train_set.set_epoch(state.epoch)
        batches = EpochBatches(
            len(self.train_set),
            config.train.batch_size,
            config.train.seed,
            state.epoch,
            skip=state.batch_in_epoch,
            rank=self.group.rank,
            world_size=self.group.world_size,
        )
        started = time.time()
        numbers = train_one_epoch(
            self.model,
            loader_for(self.train_set, batches, config, self.device),
            self.optimizer,
            config.train,
            state,
            self.device,
            decoder_config=config.model.decoder,
            decode_config=config.decode,
            rewarder=self.rewarder,
            scaler=self.scaler,
            on_step=self._on_step,
            world_size=self.group.world_size,
            progress=self.progress,
            stop=self.stop.agreed,
        )
        if self.stop.stopping:  # even after the epoch's last batch: validation waits for the resumed run
            self._stop_here()
        if state.batch_in_epoch < steps_per_epoch(len(self.train_set), config.train.batch_size):
            self.checkpoint("last")  # stopped mid-epoch by max_steps: keep the position
            return
        with self._averaged():
            scores, examples, self.caption_warning = validation_scores(
                self.model, self.val_set, config, self.device, self.progress, self.group
            )
        metric = scores.get(config.train.metric)
        metric = float("-inf") if metric is None else metric
        improved = metric > state.best_metric
        # The rate this epoch used: a per-step schedule's last step's, else the epoch's, before it moves.
        lr = self.optimizer.param_groups[0]["lr"]
        if self._per_step_schedule and self._step_lr is not None:
            lr = self._step_lr
        if self.scheduler is not None and not self._per_step_schedule:
            if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                self.scheduler.step(metric)
            else:
                self.scheduler.step()
        record = {
            "stage": state.stage,
            "epoch": state.epoch + 1,
            "seconds": round(time.time() - started, 1),
            **{f"train_{k}": v for k, v in numbers.items()},
            **{f"val_{k}": v for k, v in scores.items() if v is not None},
            "lr": lr,
        }
        state.history.append(record)
        if improved:
            state.best_metric, state.best_epoch, state.epochs_without_improvement = metric, state.epoch + 1, 0
        else:
            state.epochs_without_improvement += 1
        state.epoch += 1
        state.batch_in_epoch = 0
        if self.group.is_main:
            for key, value in scores.items():
                if value is not None:
                    self.writer.add_scalar(f"val/{key}", value, state.global_step)
            self.writer.add_text(
                "val/captions",
                "\n\n".join(
                    f"{image_id}: **{caption}** (reference: {refs[0] if refs else ''})"
                    for image_id, caption, refs in examples
                ),
                state.global_step,
            )
            self.writer.flush()
            for key, value in numbers.items():
                self.writer.add_scalar(f"epoch/train_{key}", value, state.global_step)
            print(
                f"[{state.stage}] epoch {state.epoch}: {self._loss_text(numbers)}  "
                f"{config.train.metric} {metric:.3f}  BLEU-4 {scores.get('BLEU-4') or 0:.3f}  "
                f"lr {record['lr']:.2e}  {record['seconds']}s"
                + ("  (best)" if improved else "")
                + (f"  {self.caption_warning}" if self.caption_warning else ""),
                flush=True,
            )
        # Best first, then last: a crash between the two leaves a resumable 'last' of the previous epoch.
        if improved:
            self.checkpoint("best" if state.stage == "xe" else "best_scst")
        self.checkpoint("last")
