"""The trainer: the epoch loop of both stages, validation by decoding, checkpoints and exact resume."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from captioning.config import Config
from captioning.data.datasets import CaptionDataset
from captioning.data.tokenizers import detokenize
from captioning.evaluation.degenerate import degenerate_captions
from captioning.evaluation.metrics import score_captions
from captioning.hub.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_state_checked,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from captioning.inference.batches import EpochBatches, decode_records, loader_for
from captioning.models.captioner import Captioner
from captioning.training.averaging import WeightAverage, trainable_parameters
from captioning.training.engine import Rewarder, TrainState, steps_per_epoch, train_one_epoch
from captioning.training.hooks import RunLog, ScheduleHook, epoch_checkpoints, loss_text, step_checkpoint_due
from captioning.training.optim import optimizer_for, scheduler_for
from captioning.training.resume_state import check_resume_payload
from captioning.training.rewards import CiderDReward
from captioning.training.stopping import EXIT_STATUS, StopRequest, TrainingStopped
from captioning.utils import distributed
from captioning.utils.errors import RunError


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
    mine = [
        (index, image_id, detokenize(caption.words(model.vocab), config.data.tokenizer))
        for index, image_id, caption in triples
    ]
    gathered = distributed.gather_to_main(mine, group)
    result = None
    if gathered is not None:
        decoded = sorted(item for part in gathered for item in part)  # dataset order, as one process has it
        candidates = {image_id: caption for _, image_id, caption in decoded}
        references = {dataset.records[i].image_id: list(dataset.records[i].raw) for i, _, _ in decoded}
        scores = score_captions(references, candidates, use_java=False, tokenizer=config.data.tokenizer)
        examples = [(image_id, caption, references[image_id][:1]) for _, image_id, caption in decoded[:3]]
        warning = degenerate_captions(list(candidates.values()), "validation", config.data.tokenizer)
        result = (scores.overall, examples, warning)
    if group.world_size > 1:
        result = distributed.broadcast_object(result)
    if result is None:
        raise RunError("validation: rank 0 sent no scores")
    return result


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
        self.log = RunLog(output_dir, group.is_main, config.train.log_every)
        self.rewarder: Rewarder | None = None  # the self-critical stage's, built when it starts
        self.stop = StopRequest(group.world_size, device)
        self._last_saved_at: int | None = None  # the global step of the latest last.pt this run wrote
        self.caption_warning: str | None = None  # the latest validation's, when its captions say nothing
        self.average = (
            WeightAverage(self._trainable(), config.train.ema_decay) if config.train.ema_decay else None
        )
        self._new_stage("xe", step_lr=None)
        self.scaler = (
            torch.amp.GradScaler("cuda") if config.train.amp == "fp16" and device.type == "cuda" else None
        )

    # ------------------------------------------------------------------ state
    def _new_stage(self, stage: str, step_lr: float | None) -> None:
        """The optimiser, schedule (``step_lr``: the rate the previous stage's latest step used) and,
        for the self-critical stage, the reward of ``stage``."""
        train = self.config.train
        # The self-critical stage scales a fine-tuned encoder's rate as it scales the decoder's.
        scale = train.scst_lr / train.lr if stage == "scst" else 1.0
        self.optimizer = optimizer_for(self.model, train.lr * scale, train.encoder_lr * scale, self.config)
        self.scheduler = scheduler_for(self.optimizer, self.config, stage, self._xe_steps)
        self.schedule = ScheduleHook(self.optimizer, self.scheduler, train.schedule, step_lr)
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
        rng = distributed.all_gather_objects(rng_state()) if resumable else []  # every rank's streams
        if not self.group.is_main:
            return path
        encoder = self.config.model.encoder
        training: dict[str, Any] = {"state": self.state.to_dict()}
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
        training, _, vocab = check_resume_payload(payload, self.config, path)
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
        self._new_stage(self.state.stage, self.schedule.step_lr)
        self.optimizer.load_state_dict(training["optimizer"])
        if self.scheduler is not None and training.get("scheduler"):
            self.scheduler.load_state_dict(training["scheduler"])
        if self.scaler is not None and training.get("scaler"):
            self.scaler.load_state_dict(training["scaler"])
        per_rank = training.get("rng_per_rank") or [training["rng"]]
        same_ranks = len(per_rank) == self.group.world_size
        # Exact with the same ranks.
        set_rng_state(per_rank[self.group.rank] if same_ranks else training["rng"])
        self.log.trim(self.state.global_step)

    # ------------------------------------------------------------------ loop
    @property
    def _xe_steps(self) -> int:
        """The cross-entropy stage's optimisation steps, over which ``cosine`` decays."""
        return self.config.train.epochs * steps_per_epoch(len(self.train_set), self.config.train.batch_size)

    def _on_step(self, state: TrainState, numbers: dict[str, float]) -> None:
        if self.average is not None:
            self.average.update()
        self.log.after_step(state, numbers, self.optimizer.param_groups[0]["lr"])
        self.schedule.after_step()  # after logging the rate this step used, before a checkpoint keeps it
        if step_checkpoint_due(state.global_step, self.config.train.checkpoint_every):
            self.checkpoint("last")

    def _stage_epochs(self, stage: str) -> int:
        return self.config.train.scst_epochs if stage == "scst" else self.config.train.epochs

    def fit(self) -> TrainState:
        """Run the remaining epochs of both stages, validating after each epoch: the training loop.

        For each stage (cross-entropy, then self-critical from the best cross-entropy weights), each
        epoch is one pass of ``train_one_epoch`` (its cross-entropy and self-critical steps), then
        validation, the epoch's record, early stopping's count and the checkpoints.

        SIGTERM stops every process at the next step boundary, after ``last.pt`` is written.

        Raises:
            TrainingStopped: stopped by SIGTERM (exit status 75 from the command line).
        """
        config = self.config
        with self.stop:
            for stage in ("xe", "scst"):
                if stage == "scst" and self.state.stage == "xe":
                    # Early stopping ends the cross-entropy stage only; max_steps ends the run.
                    if not config.train.scst_epochs or self._out_of_steps:
                        break
                    self._start_self_critical()
                if self.state.stage != stage:
                    continue
                while self.state.epoch < self._stage_epochs(stage) and not self._stopped:
                    state = self.state
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
                    if (
                        self.stop.stopping
                    ):  # even after the epoch's last batch: validation waits for the resumed run
                        self._stop_here()
                    if state.batch_in_epoch < steps_per_epoch(len(self.train_set), config.train.batch_size):
                        self.checkpoint("last")  # stopped mid-epoch by max_steps: keep the position
                        continue
                    self._end_epoch(numbers, time.time() - started)
                self._say_if_stopped_early(stage)
        return self.state

    def _say_if_stopped_early(self, stage: str) -> None:
        """A stage that ended before its planned epochs says why, on the console and in the state
        (``history.json``'s ``stops``): early stopping (the metric, the patience, the best epoch) or
        ``train.max_steps``."""
        state, planned, train = self.state, self._stage_epochs(stage), self.config.train
        if state.stage != stage or state.epoch >= planned or any(s["stage"] == stage for s in state.stops):
            return
        if self._out_of_steps:
            stop = {"reason": "max_steps", "max_steps": train.max_steps}
            text = f"train.max_steps {train.max_steps} reached at step {state.global_step}"
        elif train.early_stop_patience > 0 and state.epochs_without_improvement >= train.early_stop_patience:
            stop = {
                "reason": "early_stop",
                "metric": train.metric,
                "patience": train.early_stop_patience,
                "best_metric": state.best_metric,
                "best_epoch": state.best_epoch,
            }
            text = (
                f"early stopping: validation {train.metric} has not improved for "
                f"{state.epochs_without_improvement} epochs (train.early_stop_patience "
                f"{train.early_stop_patience}; best {state.best_metric:.3f} at epoch {state.best_epoch})"
            )
        else:
            return  # stopped by a signal: the resumed run goes on
        state.stops.append({"stage": stage, "epoch": state.epoch, "planned_epochs": planned, **stop})
        if self.group.is_main:
            print(f"[{stage}] stopped after epoch {state.epoch} of {planned}: {text}", flush=True)

    def _start_self_critical(self) -> None:
        """The self-critical stage begins: a fresh count of epochs and of the best metric, from the best
        cross-entropy checkpoint's weights, with its own averaging and learning-rate schedule."""
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
            load_state_checked(distributed.unwrap(self.model.decoder), payload["decoder"], "decoder", best)
            if payload.get("encoder") is not None:
                load_state_checked(self.model.encoder, payload["encoder"], "encoder", best)
            if self.group.is_main:
                print(f"self-critical training starts from {best}", flush=True)
        # The stage averages its own steps, from the weights it starts at.
        if self.average is not None:
            self.average.reset()
        self._new_stage("scst", self.schedule.step_lr)

    @property
    def _out_of_steps(self) -> bool:
        return bool(self.config.train.max_steps) and self.state.global_step >= self.config.train.max_steps

    @property
    def _stopped(self) -> bool:
        """The current stage is over early: out of steps, or no gain in ``early_stop_patience`` epochs."""
        patience = self.config.train.early_stop_patience
        return self._out_of_steps or (patience > 0 and self.state.epochs_without_improvement >= patience)

    def _end_epoch(self, numbers: dict[str, float], seconds: float) -> None:
        """After a full epoch: validate, record the epoch, count early stopping and checkpoint."""
        config, state = self.config, self.state
        with self._averaged():
            scores, examples, self.caption_warning = validation_scores(
                self.model, self.val_set, config, self.device, self.progress, self.group
            )
        metric = scores.get(config.train.metric)
        metric = float("-inf") if metric is None else metric
        improved = metric > state.best_metric
        lr = self.schedule.after_epoch(metric)
        record = {
            "stage": state.stage,
            "epoch": state.epoch + 1,
            "seconds": round(seconds, 1),
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
        self.log.after_epoch(
            state,
            scores,
            examples,
            numbers,
            f"[{state.stage}] epoch {state.epoch}: "
            f"{loss_text(numbers, config.model.decoder.doubly_stochastic)}  "
            f"{config.train.metric} {metric:.3f}  BLEU-4 {scores.get('BLEU-4') or 0:.3f}  "
            f"lr {record['lr']:.2e}  {record['seconds']}s"
            + ("  (best)" if improved else "")
            + (f"  {self.caption_warning}" if self.caption_warning else ""),
        )
        for name in epoch_checkpoints(state.stage, improved):
            self.checkpoint(name)
