"""The epoch loop: cross-entropy steps, self-critical steps and validation by real decoding."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from captioning.config import DecodeConfig, DecoderConfig, TrainConfig
from captioning.inference.batches import annotations_of, move
from captioning.models.captioner import Captioner
from captioning.models.decoding import rollout, sampler
from captioning.training.losses import OBJECTIVES
from captioning.utils import distributed
from captioning.utils.device import autocast
from captioning.utils.errors import CaptioningError

# The self-critical reward: (image ids (N,), captions as token ids without <end> (N,), whether each
# one ended with <end> (N,)) -> (N,) rewards. The trainer's maps ids to words for CiderDReward.
Rewarder = Callable[[Sequence[int], list[list[int]], list[bool]], np.ndarray]


class NonFiniteLossError(CaptioningError, RuntimeError):
    """The loss or the gradient became NaN or infinite; nothing was written."""


@dataclass
class TrainState:
    """Where a run stands; saved in checkpoints so ``--resume`` continues exactly."""

    epoch: int = 0  # the epoch in progress (0-based)
    batch_in_epoch: int = 0  # batches of that epoch already done
    global_step: int = 0
    stage: str = "xe"  # xe (cross-entropy) | scst
    best_metric: float = -math.inf
    best_epoch: int = -1
    epochs_without_improvement: int = 0
    skipped_batches: int = 0
    history: list[dict] = field(default_factory=list)  # one dict of numbers per finished epoch
    # Sums of the epoch in progress's step numbers (loss ...) and its steps: a run resumed mid-epoch
    # reports the mean of the whole epoch, not of the batches after the resume.
    epoch_sums: dict[str, float] = field(default_factory=dict)
    epoch_steps: int = 0
    # Each stage that ended before its planned epochs: stage, epoch, reason and the numbers behind it.
    stops: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict) -> TrainState:
        return cls(**data)


def steps_per_epoch(num_images: int, batch_size: int) -> int:
    """Optimisation steps in one epoch of ``num_images`` in global batches of ``batch_size``
    (the last may be short)."""
    return math.ceil(num_images / batch_size)


def flatten_captions(batch: dict) -> tuple[Tensor, Tensor, Tensor]:
    """(B, K, T) captions -> (B*K, T) captions, (B*K,) lengths, (B*K,) image row of each."""
    captions, lengths = batch["captions"], batch["lengths"]
    b, k, t = captions.shape
    image_index = torch.arange(b, device=captions.device).repeat_interleave(k)
    return captions.reshape(b * k, t), lengths.reshape(b * k), image_index


def optimisation_step(
    loss: Tensor,
    model: Captioner,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    scaler: torch.amp.GradScaler | None,
    where: str,
    average: Sequence[torch.nn.Parameter] = (),
    world_size: int = 1,
) -> bool:
    """Backward, average ``average``'s gradients over processes, clip and step.

    Returns False when the batch was skipped for a non-finite value.

    Raises:
        NonFiniteLossError: a non-finite loss or gradient with ``nonfinite: stop``.
    """
    optimizer.zero_grad(set_to_none=True)
    finite = bool(torch.isfinite(loss.detach()))
    if finite:
        (scaler.scale(loss) if scaler is not None else loss).backward()
        distributed.average_gradients(average, world_size)
        if scaler is not None:
            scaler.unscale_(optimizer)
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(
            parameters, config.grad_clip if config.grad_clip else float("inf")
        )
        finite = bool(torch.isfinite(norm)) or scaler is not None  # the scaler skips inf steps itself
    if not finite:
        optimizer.zero_grad(set_to_none=True)
        if config.nonfinite == "stop":
            raise NonFiniteLossError(
                f"non-finite loss or gradient ({float(loss.detach()):.4g}) at {where}; "
                "stopped without writing a checkpoint (set train.nonfinite=skip to skip "
                "such batches)"
            )
        return False
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return True


def scst_loss(
    model: Captioner,
    batch: dict,
    rewarder: Rewarder,
    config: TrainConfig,
    decode_config: DecodeConfig,
    world_size: int = 1,
) -> tuple[Tensor, dict]:
    """Self-critical loss of one batch (Rennie et al. 2017).

    ``scst_samples`` captions are sampled per image; each one's advantage is its reward (the
    trainer's: :class:`captioning.training.rewards.CiderDReward`, told which captions ended) minus a
    baseline: the greedy caption's reward (``greedy``) or the mean of the other samples (``mean``).
    Loss = -sum(advantage * log p(sampled words)) / number of sampled tokens (over all processes,
    divided by ``world_size``, so that averaged gradients equal one process's).

    Rollouts go through the path decoding takes (``rollout`` with ``choice_scores``): they obey
    ``decode_config``'s constraints (``max_length``, ``min_length``, ``forbid_unk``,
    ``block_trigrams``, ``repetition_penalty``; ``<pad>`` and ``<start>`` are never emitted), and
    samples are drawn with its ``temperature``, ``top_k`` and ``top_p``; their defaults draw from
    the model's own distribution, which the policy gradient assumes. The beam-only options
    (``beam_size``, ``length_alpha``, ``beam_groups``, ``diversity``) do not apply to sampling.

    With hard attention the sampled locations are part of the policy: their log-probabilities
    join the words' (a row that drew the expected context contributes none), and the greedy
    baseline uses the expected context, as at inference.
    """
    decoder = distributed.unwrap(model.decoder)
    annotations = annotations_of(model, batch)
    image_ids = batch["image_ids"].tolist()
    n = config.scst_samples
    sampled = rollout(decoder, annotations, sampler(decode_config), decode_config, repeats=n)
    # One device-to-host copy per rollout, not one per caption.
    sample_words = [
        row[:length] for row, length in zip(sampled.tokens.tolist(), sampled.lengths.tolist(), strict=True)
    ]
    sample_ids, finished = [i for i in image_ids for _ in range(n)], sampled.finished.tolist()
    if config.scst_baseline == "greedy":
        decoder.eval()
        with torch.no_grad():
            greedy = rollout(decoder, annotations, lambda scores: scores.argmax(1), decode_config)
        decoder.train()
        greedy_words = [
            row[:length] for row, length in zip(greedy.tokens.tolist(), greedy.lengths.tolist(), strict=True)
        ]
        # One reward call for samples and baseline: each image's reference vectors are built once a step.
        scored = rewarder(
            [*sample_ids, *image_ids], [*sample_words, *greedy_words], [*finished, *greedy.finished.tolist()]
        )
        rewards, baseline = (
            scored[: len(sample_ids)].reshape(len(image_ids), n),
            scored[len(sample_ids) :, None],
        )
    else:
        rewards = rewarder(sample_ids, sample_words, finished).reshape(len(image_ids), n)
        baseline = (rewards.sum(1, keepdims=True) - rewards) / (n - 1)
    advantage = torch.as_tensor(rewards - baseline, dtype=torch.float32, device=annotations.device).view(-1)
    mask = sampled.mask.float()
    num_tokens = mask.sum().detach()
    if world_size > 1:
        num_tokens = distributed.all_reduce_sum(num_tokens) / world_size
    log_probs = sampled.log_probs  # (N, T)
    if sampled.location_log_probs is not None:
        log_probs = log_probs + sampled.location_log_probs
    loss = -(advantage.unsqueeze(1) * log_probs * mask).sum() / num_tokens.clamp_min(1)
    return loss, {"reward": float(rewards.mean()), "baseline": float(np.mean(baseline))}


def train_one_epoch(
    model: Captioner,
    loader: Iterable[dict],
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    state: TrainState,
    device: torch.device,
    *,
    decoder_config: DecoderConfig,
    decode_config: DecodeConfig | None = None,
    rewarder: Rewarder | None = None,
    scaler: torch.amp.GradScaler | None = None,
    on_step=None,
    world_size: int = 1,
    progress: bool = True,
    stop: Callable[[], bool] | None = None,
) -> dict[str, float]:
    """One pass over ``loader``; calls ``on_step(state, numbers)`` after each optimisation step.

    ``decoder_config`` holds the loss weights; ``decode_config`` the constraints of self-critical
    rollouts (default: ``DecodeConfig()``). ``stop()``, called after each step (and ``on_step``),
    ends the pass early when it returns True; with several processes it must be a collective call,
    so that all of them stop at the same step.

    Returns mean loss (and reward for SCST) over the epoch's batches that were not skipped, those
    before a mid-epoch resume included (``state.epoch_sums``).
    """
    model.train()
    # DistributedDataParallel averages the gradients of the wrapped decoder's forward pass; the
    # encoder's (when fine-tuned) and the self-critical rollout's are averaged by hand.
    by_hand = [p for p in model.encoder.parameters() if p.requires_grad]
    if state.stage == "scst":
        by_hand += list(distributed.unwrap(model.decoder).parameters())
    if (
        state.batch_in_epoch == 0
    ):  # a new epoch; else one resumed mid-way, whose sums come from the checkpoint
        state.epoch_sums, state.epoch_steps = {}, 0
    bar = tqdm(
        loader,
        desc=f"{state.stage} epoch {state.epoch + 1}",
        leave=False,
        disable=not progress,
        dynamic_ncols=True,
        unit="batch",
    )
    for batch in bar:
        if batch is None:  # every image of the batch was unreadable and skipped
            state.batch_in_epoch += 1
            continue
        batch = move(batch, device)
        where = f"epoch {state.epoch + 1}, step {state.global_step + 1}"
        with autocast(device, config.amp):
            if state.stage == "scst":
                if rewarder is None:
                    raise ValueError("a self-critical epoch (stage 'scst') needs a rewarder")
                loss, numbers = scst_loss(
                    model, batch, rewarder, config, decode_config or DecodeConfig(), world_size
                )
            else:  # the cross-entropy step: teacher forcing, then the decoder's objective
                captions, lengths, image_index = flatten_captions(batch)  # (B*K, T), (B*K,), (B*K,)
                output = model(annotations_of(model, batch), captions, lengths, image_index)
                num_tokens = None
                if world_size > 1:  # the global average, so averaged gradients equal one process's
                    num_tokens = float(distributed.all_reduce_sum((lengths - 1).sum().float())) / world_size
                decoder = distributed.unwrap(model.decoder)
                # Equation 14 (equation 12 with hard attention): OBJECTIVES[decoder.objective]
                terms = OBJECTIVES[decoder.objective](
                    decoder, output, captions, decoder_config, config, num_tokens
                )
                loss = terms.total
                numbers = {
                    "cross_entropy": terms.cross_entropy.item(),
                    "attention_penalty": terms.attention_penalty.item(),
                }
        stepped = optimisation_step(loss, model, optimizer, config, scaler, where, by_hand, world_size)
        state.batch_in_epoch += 1
        if not stepped:
            state.skipped_batches += 1
            tqdm.write(f"skipped batch at {where}: non-finite loss")
            continue
        state.global_step += 1
        numbers["loss"] = float(loss.detach())
        state.epoch_steps += 1
        for key, value in numbers.items():
            state.epoch_sums[key] = state.epoch_sums.get(key, 0.0) + value
        bar.set_postfix(loss=f"{numbers['loss']:.3f}")
        if on_step is not None:
            on_step(state, numbers)
        if config.max_steps and state.global_step >= config.max_steps:
            break
        if stop is not None and stop():
            break
    return {key: value / max(state.epoch_steps, 1) for key, value in state.epoch_sums.items()}
