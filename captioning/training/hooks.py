"""What the epoch loop does at the end of each step and epoch, as small hooks the trainer calls: the
run's logs (``RunLog``), the learning-rate schedule (``ScheduleHook``) and when checkpoints are written
(``step_checkpoint_due``, ``epoch_checkpoints``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

from captioning.config import PER_STEP_SCHEDULES
from captioning.training.engine import TrainState
from captioning.utils.files import atomic_write


def logged_step(line: str) -> float:
    """The step of a steps.jsonl line; infinite (so it is dropped) for a line cut short by a full disk
    or a kill mid-append."""
    try:
        step = json.loads(line)["step"]
    except (ValueError, TypeError, KeyError):
        return math.inf
    return step if isinstance(step, int) else math.inf


def loss_text(numbers: dict[str, float], doubly_stochastic: float) -> str:
    """The epoch's loss with its parts: a caption's doubly stochastic penalty cannot go below
    P (1 - T/P)^2 for P grid cells and T steps (171 at 14x14 for 13 steps), so the total
    alone hides the cross-entropy."""
    loss = numbers.get("loss", float("nan"))
    text = f"loss {loss:.3f}"
    if "cross_entropy" in numbers:
        weight = doubly_stochastic
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


class RunLog:
    """The run's logs: ``steps.jsonl`` (a line per step), TensorBoard events and the epoch line.

    Rank 0 writes them; on the other ranks every hook does nothing (``writer`` is None).
    """

    def __init__(self, output_dir: Path, is_main: bool, log_every: int) -> None:
        self.steps_path = output_dir / "steps.jsonl"
        self.writer = SummaryWriter(str(output_dir / "tensorboard")) if is_main else None
        self.log_every = log_every

    def after_step(self, state: TrainState, numbers: dict[str, float], lr: float) -> None:
        """Append the step to ``steps.jsonl``; every ``log_every`` steps, its numbers and ``lr`` to
        TensorBoard."""
        if self.writer is None:
            return
        with self.steps_path.open("a") as log:
            log.write(
                json.dumps(
                    {"step": state.global_step, "epoch": state.epoch + 1, "stage": state.stage, **numbers}
                )
                + "\n"
            )
        if state.global_step % self.log_every == 0:
            for key, value in numbers.items():
                self.writer.add_scalar(f"train/{key}", value, state.global_step)
            self.writer.add_scalar("train/lr", lr, state.global_step)

    def after_epoch(
        self,
        state: TrainState,
        scores: dict[str, float | None],
        examples: list[tuple[int, str, list[str]]],
        numbers: dict[str, float],
        line: str,
    ) -> None:
        """The epoch's validation scores, example captions and training numbers to TensorBoard; print
        ``line``."""
        if self.writer is None:
            return
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
        print(line, flush=True)

    def trim(self, global_step: int) -> None:
        """Forget logged steps after ``global_step`` (a killed run may have logged a few more than its
        checkpoint holds)."""
        if self.writer is None or not self.steps_path.exists():
            return
        kept = [
            line
            for line in self.steps_path.read_text(encoding="utf-8", errors="replace").splitlines()
            if logged_step(line) <= global_step
        ]
        atomic_write(self.steps_path, lambda p: p.write_text("".join(line + "\n" for line in kept)))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class ScheduleHook:
    """The learning-rate schedule's steps: after every optimisation step for a per-step schedule
    (``noam``, ``cosine``), else after each epoch (``plateau`` with the validation metric).

    Args:
        step_lr: the rate the latest step used, carried over from the previous stage's hook.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau | None,
        schedule: str,
        step_lr: float | None = None,
    ) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler
        # The scheduler stepped after every optimisation step (None: stepped per epoch, or none).
        self.step_scheduler = (
            scheduler
            if schedule in PER_STEP_SCHEDULES
            and not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
            else None
        )
        self.per_step = self.step_scheduler is not None
        self.step_lr = step_lr

    def after_step(self) -> None:
        """Step a per-step schedule, keeping the rate the step used."""
        if self.step_scheduler is not None:
            self.step_lr = self.optimizer.param_groups[0]["lr"]
            self.step_scheduler.step()

    def after_epoch(self, metric: float) -> float:
        """Step a per-epoch schedule; returns the rate the epoch used (a per-step schedule's last step's,
        else the epoch's, before it moves)."""
        lr = self.optimizer.param_groups[0]["lr"]
        if self.per_step and self.step_lr is not None:
            lr = self.step_lr
        if self.scheduler is not None and not self.per_step:
            if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                self.scheduler.step(metric)
            else:
                self.scheduler.step()
        return lr


def step_checkpoint_due(global_step: int, every: int) -> bool:
    """Whether ``last.pt`` is written after this step (``train.checkpoint_every``; 0 = only per epoch)."""
    return bool(every) and global_step % every == 0


def epoch_checkpoints(stage: str, improved: bool) -> tuple[str, ...]:
    """The checkpoints written at an epoch's end, in order: the stage's best when the metric improved,
    then ``last`` (a crash between the two leaves a resumable ``last`` of the previous epoch)."""
    best = "best" if stage == "xe" else "best_scst"
    return (best, "last") if improved else ("last",)
