"""The rules of ``--resume``: which checkpoint and configuration may continue a run, and checks of the
checkpoint's training state before the run uses it or writes anything.

``check_resume_payload`` owns the refusals both resume paths give (``run.check_resume`` before any
work, ``Trainer.resume`` when it loads), and ``check_resumable`` the configuration rule (also
``--resume auto``'s, against a launch's ``config.yaml``).

A resumed run loads the optimizer, schedule, position and random streams stored in ``last.pt``.
torch loads whatever it is given and fails later, mid-run, with messages that name neither the file
nor the entry (``'str' object has no attribute 'items'``, ``The size of tensor a (3) must match
...``), after the run folder was already rewritten. Every entry is checked here instead, in two
steps: ``check_training_entries`` needs only the checkpoint (before the data are read), and
``check_training_fits`` compares the optimizer state with the model's parameters (once the model is
built, still before anything is written). Each failure is one line: ``<ckpt>: <entry>: <what>``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.config import Config, to_dict
from captioning.data.vocab import Vocabulary
from captioning.hub.checkpoint import CheckpointError, check_state_fits, checkpoint_config
from captioning.models.captioner import Captioner
from captioning.training.averaging import trainable_parameters
from captioning.training.engine import TrainState
from captioning.training.optim import optimizer_for, scheduler_for
from captioning.training.plan import STAGE_NAMES

MOMENTS = ("exp_avg", "exp_avg_sq")  # Adam's two moment estimates, one per parameter
COUNTERS = (
    "epoch",
    "batch_in_epoch",
    "global_step",
    "epochs_without_improvement",
    "skipped_batches",
    "epoch_steps",
)


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
        "data.pointing_tolerance",
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


def check_resumable(stored: Config, config: Config, stage: str, path: str | Path) -> None:
    """Refuse to resume a checkpoint under a configuration that would not continue the same run.

    Raises:
        CheckpointError: one line naming every key that differs and may not change, with both values.
    """
    allowed = RESUMABLE_KEYS | (RESUMABLE_BEFORE_SCST if stage == "xe" else frozenset())
    old, new = _flat(to_dict(stored)), _flat(to_dict(config))
    changed = [
        key
        for key in new
        if old.get(key) != new[key] and key not in allowed and not key.startswith("decode.")
    ]
    if changed:  # every key that differs, so that one relaunch can fix them all
        first, *others = changed
        differences = f"{first} is {old.get(first)!r} in the checkpoint but {new[first]!r} now" + "".join(
            f", {key} {old.get(key)!r} then {new[key]!r} now" for key in others
        )
        raise CheckpointError(
            f"{path}: {differences}; "
            "a resumed run keeps its configuration (pass the same --config and flags), "
            "apart from its length, logging, paths and decoding"
        )


def check_resume_payload(payload: dict, config: Config, path: str | Path) -> tuple[dict, Config, Vocabulary]:
    """Refuse to resume from a loaded checkpoint that cannot continue this run: no training state,
    weights only (``best.pt``), a damaged entry (``check_training_entries``) or another configuration
    (``check_resumable``).

    Returns:
        The checkpoint's training section, its stored configuration and vocabulary.
    Raises:
        CheckpointError: one line naming ``path`` and what is wrong.
    """
    training = payload.get("training")
    if not training:
        raise CheckpointError(f"{path}: has no training state to resume from")
    if "optimizer" not in training:  # best.pt and best_scst.pt keep the weights only
        raise CheckpointError(
            f"{path}: holds weights only, without the optimizer state a resumed run needs; "
            "resume from checkpoints/last.pt"
        )
    check_training_entries(training, path)
    stored, vocab = checkpoint_config(payload, path)
    check_resumable(stored, config, training["state"].get("stage", "xe"), path)
    return training, stored, vocab


def _refuse(path: str | Path, entry: str, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: {entry}: {what}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_number(value: Any, path: str | Path, entry: str) -> float:
    if not _is_number(value):
        raise _refuse(path, entry, f"must be a number, got {_kind(value)}")
    if not math.isfinite(value):
        raise _refuse(path, entry, f"must be a finite number, got {value}")
    return float(value)


def _mapping(value: Any, path: str | Path, entry: str) -> dict:
    if not isinstance(value, dict):
        raise _refuse(path, entry, f"must be a mapping, got {_kind(value)}")
    return value


def check_training_entries(training: dict, path: str | Path) -> None:
    """The training section's structure and values: position, optimizer layout, schedule, RNG streams.

    Raises:
        CheckpointError: ``<path>: training.<entry>: <what is wrong>`` for the first bad entry.
    """
    _check_state(_mapping(training.get("state"), path, "training.state"), path)
    optimizer = _mapping(training.get("optimizer"), path, "training.optimizer")
    _mapping(optimizer.get("state"), path, "training.optimizer.state")
    groups = optimizer.get("param_groups")
    if not isinstance(groups, list) or not groups:
        raise _refuse(
            path, "training.optimizer.param_groups", f"must be a non-empty list, got {_kind(groups)}"
        )
    for index, group in enumerate(groups):
        _check_group(group, path, f"training.optimizer.param_groups[{index}]")
    for name in ("scheduler", "scaler"):
        value = training.get(name)
        if value is not None:
            _check_plain_numbers(_mapping(value, path, f"training.{name}"), path, f"training.{name}")
    _check_rng(training.get("rng"), path, "training.rng")
    per_rank = training.get("rng_per_rank")
    if per_rank is not None:
        if not isinstance(per_rank, list) or not per_rank:
            raise _refuse(path, "training.rng_per_rank", f"must be a non-empty list, got {_kind(per_rank)}")
        for rank, state in enumerate(per_rank):
            _check_rng(state, path, f"training.rng_per_rank[{rank}]")


def _check_state(state: dict, path: str | Path) -> None:
    known = {f.name for f in fields(TrainState)}
    unknown = sorted(str(key) for key in set(state) - known)
    if unknown:
        raise _refuse(path, f"training.state.{unknown[0]}", "is not part of a run's position")
    stage = state.get("stage", "xe")
    if stage not in STAGE_NAMES:
        raise _refuse(path, "training.state.stage", f"must be one of {', '.join(STAGE_NAMES)}, got {stage!r}")
    for name in COUNTERS:
        value = state.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _refuse(path, f"training.state.{name}", f"must be an integer >= 0, got {value!r}")
    best_epoch = state.get("best_epoch", -1)
    if not isinstance(best_epoch, int) or isinstance(best_epoch, bool) or best_epoch < -1:
        raise _refuse(path, "training.state.best_epoch", f"must be an integer >= -1, got {best_epoch!r}")
    best = state.get("best_metric", -math.inf)
    if not _is_number(best) or math.isnan(best) or best == math.inf:
        raise _refuse(path, "training.state.best_metric", f"must be a number or -inf, got {best!r}")
    history = state.get("history", [])
    if not isinstance(history, list) or not all(isinstance(item, dict) for item in history):
        raise _refuse(path, "training.state.history", "must be a list of mappings")
    for key, value in _mapping(state.get("epoch_sums", {}), path, "training.state.epoch_sums").items():
        _finite_number(value, path, f"training.state.epoch_sums.{key}")


def _check_group(group: Any, path: str | Path, entry: str) -> None:
    group = _mapping(group, path, entry)
    params = group.get("params")
    if not isinstance(params, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in params
    ):
        raise _refuse(path, f"{entry}.params", f"must be a list of parameter numbers, got {_kind(params)}")
    if "lr" not in group:
        raise _refuse(path, f"{entry}.lr", "is missing")
    for key in ("lr", "eps", "weight_decay"):
        if key in group and _finite_number(group[key], path, f"{entry}.{key}") < 0:
            raise _refuse(path, f"{entry}.{key}", f"must be >= 0, got {group[key]}")
    if "betas" in group:
        betas = group["betas"]
        if not isinstance(betas, (list, tuple)) or len(betas) != 2:
            raise _refuse(path, f"{entry}.betas", f"must be two numbers, got {betas!r}")
        for beta in betas:
            if not 0 <= _finite_number(beta, path, f"{entry}.betas") < 1:
                raise _refuse(path, f"{entry}.betas", f"must be in [0, 1), got {beta}")


def _check_plain_numbers(state: dict, path: str | Path, entry: str) -> None:
    """A scheduler's or gradient scaler's numbers: no NaN (an infinite best score is a legitimate start)."""
    for key, value in state.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, bool) or item is None or isinstance(item, (str, dict, list, tuple)):
                continue
            if not _is_number(item) or math.isnan(item):
                raise _refuse(path, f"{entry}.{key}", f"must hold numbers, got {item!r}")


def _check_rng(state: Any, path: str | Path, entry: str) -> None:
    """Each stream restores into a fresh generator, leaving this process's streams alone."""
    state = _mapping(state, path, entry)
    try:
        version, internal, gauss = state["python"]
        random.Random().setstate((version, tuple(internal), gauss))
    except (KeyError, TypeError, ValueError) as error:
        raise _refuse(path, f"{entry}.python", f"not a Python random state ({error})") from None
    try:
        name, keys, *rest = state["numpy"]
        np.random.RandomState().set_state((name, keys.numpy().astype(np.uint32), *rest))
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise _refuse(path, f"{entry}.numpy", f"not a NumPy random state ({error})") from None
    streams = [("torch", state.get("torch"))]
    cuda = state.get("cuda")
    if cuda is not None:
        if not isinstance(cuda, list):
            raise _refuse(path, f"{entry}.cuda", f"must be a list, got {_kind(cuda)}")
        streams += [(f"cuda[{i}]", value) for i, value in enumerate(cuda)]
    for name, value in streams:
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
            raise _refuse(path, f"{entry}.{name}", f"must be a byte tensor, got {_kind(value)}")
        if name == "torch":
            try:
                torch.Generator().set_state(value)
            except RuntimeError as error:
                raise _refuse(path, f"{entry}.torch", f"not a torch random state ({error})") from None


def check_training_fits(
    payload: dict, training: dict, model: Captioner, config: Config, path: str | Path
) -> None:
    """The stored weights and optimizer state against the model this run built (nothing is changed).

    Raises:
        CheckpointError: a group or parameter count that differs, a moment of the wrong shape, type or
            with NaN/inf values, or a state that torch's optimizer or schedule refuses.
    """
    check_state_fits(model.decoder, payload["decoder"], "decoder", path)
    if payload.get("encoder") is not None:
        check_state_fits(model.encoder, payload["encoder"], "encoder", path)
    if config.train.ema_decay:
        check_average_state(
            training.get("average"),
            trainable_parameters({"decoder": model.decoder, "encoder": model.encoder}),
            path,
        )
    reference = optimizer_for(model, config.train.lr, config.train.encoder_lr, config)
    stored = training["optimizer"]
    groups = [group["params"] for group in reference.param_groups]
    if len(stored["param_groups"]) != len(groups):
        raise _refuse(
            path,
            "training.optimizer.param_groups",
            f"{len(stored['param_groups'])} groups, but this model trains {len(groups)}",
        )
    parameters: dict[int, torch.Tensor] = {}
    for index, (group, own) in enumerate(zip(stored["param_groups"], groups, strict=True)):
        if len(group["params"]) != len(own):
            raise _refuse(
                path,
                f"training.optimizer.param_groups[{index}].params",
                f"{len(group['params'])} parameters, but this model has {len(own)} in the group",
            )
        parameters.update(zip(group["params"], own, strict=True))
    for key, moments in stored["state"].items():
        entry = f"training.optimizer.state[{key}]"
        if key not in parameters:
            raise _refuse(path, entry, "belongs to no parameter of param_groups")
        _check_moments(_mapping(moments, path, entry), parameters[key], path, entry)
    try:  # anything else torch refuses, on a throw-away optimizer and schedule
        reference.load_state_dict(stored)
        scheduler = scheduler_for(reference, config, training["state"].get("stage", "xe"))
        if scheduler is not None and training.get("scheduler"):
            scheduler.load_state_dict(training["scheduler"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as error:
        raise _refuse(
            path, "training.optimizer", f"cannot be loaded ({str(error).splitlines()[0]})"
        ) from None


def _check_moments(moments: dict, parameter: torch.Tensor, path: str | Path, entry: str) -> None:
    step = moments.get("step")
    value = step.item() if isinstance(step, torch.Tensor) and step.numel() == 1 else step
    if _finite_number(value, path, f"{entry}.step") < 0:
        raise _refuse(path, f"{entry}.step", f"must be >= 0, got {value}")
    for name in (*MOMENTS, "max_exp_avg_sq"):
        if name not in moments and name not in MOMENTS:
            continue
        tensor = moments.get(name)
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise _refuse(path, f"{entry}.{name}", f"must be a floating-point tensor, got {_kind(tensor)}")
        if tuple(tensor.shape) != tuple(parameter.shape):
            raise _refuse(
                path,
                f"{entry}.{name}",
                f"shape {_shape(tensor.shape)} does not match the parameter's {_shape(parameter.shape)}",
            )
        if not bool(torch.isfinite(tensor).all()):
            raise _refuse(path, f"{entry}.{name}", "holds NaN or infinite values")


def _shape(shape: Sequence[int]) -> str:
    return str(tuple(shape))


def check_average_state(state: Any, parameters: dict[str, torch.nn.Parameter], path: str | Path) -> None:
    """``training.average`` (``train.ema_decay``) against the parameters it must fill (nothing is changed).

    Raises:
        CheckpointError: ``<path>: training.average...: <what is wrong>`` for the first bad entry.
    """
    if state is None:
        raise _refuse(
            path,
            "training.average",
            "missing; a run with train.ema_decay > 0 resumes from a last.pt that such a run wrote",
        )
    state = _mapping(state, path, "training.average")
    updates = state.get("updates")
    if not isinstance(updates, int) or isinstance(updates, bool) or updates < 0:
        raise _refuse(path, "training.average.updates", f"must be an integer >= 0, got {updates!r}")
    optimised = _mapping(state.get("optimised"), path, "training.average.optimised")
    for name in sorted(set(optimised) - set(parameters), key=str):
        raise _refuse(
            path, "training.average.optimised", f"{name!r} is not a trainable parameter of this model"
        )
    for name, parameter in parameters.items():
        entry = f"training.average.optimised.{name}"
        tensor = optimised.get(name)
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise _refuse(path, entry, f"missing or not a floating-point tensor, got {_kind(tensor)}")
        if tensor.shape != parameter.shape:
            raise _refuse(
                path,
                entry,
                f"shape {_shape(tensor.shape)} does not match the parameter's {_shape(parameter.shape)}",
            )
        if not bool(torch.isfinite(tensor).all()):
            raise _refuse(path, entry, "holds NaN or infinite values")
