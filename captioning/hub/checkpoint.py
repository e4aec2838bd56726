"""Checkpoints: one file with weights, configuration, vocabulary and training state.

Only tensors and plain Python types go in, so every checkpoint loads with
``torch.load(weights_only=True)``: a checkpoint from a stranger cannot run code. Writes are
atomic (temporary file, fsync, rename), so a crash or a full disk while writing leaves the
previous checkpoint whole.
"""

from __future__ import annotations

import io
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.config import Config, ConfigError, LSTMDecoderConfig, to_dict
from captioning.config.loading import from_dict
from captioning.data.vocab import Vocabulary, VocabularyError
from captioning.utils.errors import CheckpointError
from captioning.utils.files import NoSpaceError, atomic_write, not_a_regular_file
from captioning.utils.json_files import read_json_file
from captioning.utils.state_files import StateFileError, read_state_file

FORMAT = "captioning-checkpoint"
VERSION = 1


__all__ = [
    "CheckpointError",
    "atomic_write",
    "check_payload",
    "check_state_fits",
    "checkpoint_config",
    "load_checkpoint",
    "load_state_checked",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch random states as checkpoint-safe values."""
    numpy_state = np.random.get_state()
    if not isinstance(numpy_state, tuple):  # a dict only from a bit generator other than the global MT19937
        raise RuntimeError(f"NumPy's global random state is not MT19937's, got {type(numpy_state).__name__}")
    state = {
        "python": random.getstate(),
        "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` saved."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    path: str | Path,
    *,
    config: Config,
    vocab: Vocabulary,
    decoder_state: dict,
    encoder_state: dict | None = None,
    encoder_fingerprint: dict | None = None,
    training: dict | None = None,
) -> None:
    """Write a checkpoint atomically.

    Args:
        config: the run's full configuration (rebuilds the model).
        vocab: the vocabulary the decoder's ids refer to.
        decoder_state: ``decoder.state_dict()``.
        encoder_state: the encoder's weights when they were fine-tuned (else rebuilt from config).
        encoder_fingerprint: ``encoder.fingerprint()``, to check features match at load time.
        training: optimizer/scheduler/epoch/step/RNG state for ``--resume``.
    """
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "config": to_dict(config),
        "vocab": vocab.to_dict(),
        "decoder": decoder_state,
        "encoder": encoder_state,
        "encoder_fingerprint": encoder_fingerprint,
        "training": training,
    }
    try:
        atomic_write(path, lambda temporary: _save(payload, temporary))
    except NoSpaceError as error:
        raise CheckpointError(str(error)) from error


class _WholeWrites:
    """A file that writes all it is given or records why not.

    torch's zip writer turns a failed or short write into "[enforce fail ...] unexpected pos"; the
    OSError recorded here (ENOSPC on a full disk) is what ``_save`` raises instead, for atomic_write
    to name.
    """

    def __init__(self, stream: io.FileIO) -> None:
        self.stream = stream
        self.name = stream.name  # the file's path, as a file object has it
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        view = memoryview(data).cast("B")
        try:
            while view:  # a full disk first writes short, then fails with ENOSPC on the next call
                view = view[self.stream.write(view) :]
        except OSError as error:
            self.error = error
            raise
        return len(data)

    def flush(self) -> None:
        self.stream.flush()


def _save(payload: dict[str, Any], path: Path) -> None:
    with open(path, "wb", buffering=0) as stream:
        writer = _WholeWrites(stream)
        try:
            # torch.save takes any object with write() and flush(); its hint says IO[bytes] only.
            torch.save(payload, writer)  # type: ignore[arg-type]
        except Exception as error:
            if writer.error is not None:
                raise writer.error from error
            raise


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True`` and check its layout.

    Raises:
        CheckpointError: missing, truncated, not a checkpoint of this project, or containing
            pickled objects other than tensors and plain types (refused, never executed).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: {not_a_regular_file(path) or 'checkpoint file not found'}")
    try:
        payload = read_state_file(path, "checkpoint", map_location)
    except StateFileError as error:
        raise CheckpointError(str(error)) from None
    check_payload(payload, path)
    return payload


def check_payload(payload: Any, path: str | Path) -> None:
    """Refuse a checkpoint payload (or a model folder's, ``captioning.hub.model_folder``) of another layout,
    or whose weights are not all finite tensors.

    Raises:
        CheckpointError: one line naming ``path``.
    """
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a captioning checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {payload.get('version')} is not supported "
            f"(this code reads version {VERSION})"
        )
    for key in ("config", "vocab", "decoder"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{path}: checkpoint has no '{key}' section")
    for key in ("encoder", "encoder_fingerprint", "training"):
        if not isinstance(payload.get(key), (dict, type(None))):
            raise CheckpointError(
                f"{path}: checkpoint entry '{key}' must be a mapping or null, "
                f"got {type(payload[key]).__name__}"
            )
    for section in ("decoder", "encoder"):
        _check_weights(payload.get(section) or {}, section, path)


def _check_weights(state: dict, section: str, path: str | Path) -> None:
    """Every entry a tensor, every floating-point value finite: else decoding gives empty captions."""
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f"{path}: {section} weights: entry {name!r} is not a tensor ({type(value).__name__})"
            )
        if value.layout != torch.strided or value.is_quantized:  # torch's own messages run to kilobytes
            raise CheckpointError(
                f"{path}: {section} weights: {name} is a {str(value.layout).removeprefix('torch.')} "
                f"{'quantized ' * value.is_quantized}tensor; a checkpoint holds dense tensors"
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{path}: {section} weights: {name} holds NaN or infinite values")


def checkpoint_config(payload: dict[str, Any], path: str | Path = "checkpoint") -> tuple[Config, Vocabulary]:
    """The configuration and vocabulary stored in a loaded checkpoint (its encoder one this code builds)."""
    from captioning.models.encoders import ENCODERS, encoder_builder

    try:
        config, vocab = from_dict(payload["config"], stored=True), Vocabulary.from_dict(payload["vocab"])
    except (ConfigError, VocabularyError, KeyError, TypeError, AttributeError, ValueError) as error:
        raise CheckpointError(f"{path}: invalid stored configuration or vocabulary ({error})") from None
    if "scst_reward_eos" not in (payload["config"].get("train") or {}):
        # Written before the self-critical reward counted the caption's end: its weights, and a resumed
        # run, keep the reward they were trained with (train.scst_reward_eos false).
        config = replace(config, train=replace(config.train, scst_reward_eos=False))
    config = _general_scorer_of_old_dot(config, payload.get("decoder") or {})
    try:  # a registered name, or <family>:<model> of a known family (timm:, open_clip:)
        encoder_builder(config.model.encoder.name)
    except ConfigError:
        names = sorted(ENCODERS)
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise CheckpointError(
            f"{path}: stored model.encoder.name {config.model.encoder.name!r:.60} is not an "
            f"encoder of this code ({shown}; timm:, open_clip: names); a module's own: --import "
            "MODULE, in Python load(..., imports=[MODULE])"
        ) from None
    return config, vocab


def _general_scorer_of_old_dot(config: Config, decoder_weights: dict[str, Any]) -> Config:
    """Luong's general scorer was named ``dot`` before ``dot`` became the plain dot product, which has
    no weights: a stored ``dot`` whose decoder holds the scorer's ``query_proj`` is the general one,
    and is read as ``general`` (the same weights, the same captions)."""
    decoder = config.model.decoder
    if (
        isinstance(decoder, LSTMDecoderConfig)
        and decoder.scoring == "dot"
        and "attention.query_proj.weight" in decoder_weights
    ):
        return replace(config, model=replace(config.model, decoder=replace(decoder, scoring="general")))
    return config


def load_state_checked(
    module: torch.nn.Module, state: dict[str, torch.Tensor], what: str, path: str | Path
) -> None:
    """``load_state_dict(strict=True)`` with a one-line message saying what differs."""
    check_state_fits(module, state, what, path)
    module.load_state_dict(state, strict=True)


def check_state_fits(
    module: torch.nn.Module, state: dict[str, torch.Tensor], what: str, path: str | Path
) -> None:
    """Refuse, without loading them, weights whose names or shapes differ from ``module``'s.

    Raises:
        CheckpointError: one line saying what differs.
    """
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in state and tuple(own[k].shape) != tuple(state[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else ""))
    if unexpected:
        problems.append(f"unexpected {', '.join(unexpected[:3])}" + (" ..." if len(unexpected) > 3 else ""))
    if mismatched:
        problems.append(f"shape {', '.join(mismatched[:3])}" + (" ..." if len(mismatched) > 3 else ""))
    if problems:
        raise CheckpointError(
            f"{path}: {what} weights do not fit the model configuration: {'; '.join(problems)}"
        )


def model_path(path: str | Path) -> Path:
    """What ``captioning.load`` and the tools read for ``path``: a run folder's checkpoint whose test
    scores the run reports (``scored_checkpoint``); a checkpoint file or a model folder as it is."""
    from captioning.hub.identity import CONFIG
    from captioning.utils.run_folder import CHECKPOINTS

    path = Path(path)
    if path.is_dir() and not (path / CONFIG).exists() and (path / CHECKPOINTS).is_dir():
        return scored_checkpoint(path)
    return path


def scored_checkpoint(run: Path) -> Path:
    """The checkpoint of a run folder whose test scores the run reports: the one ``test_scores.json``'s
    signature names (by its hash), else the one the main job scores (``run_folder.best_checkpoint``:
    the better of ``best_scst.pt`` and ``best.pt`` by validation metric, else ``last.pt``).

    Raises:
        RunFolderError: ``checkpoints/`` holds no checkpoint.
    """
    from captioning.hub.identity import file_hash, parse_signature
    from captioning.utils.run_folder import CHECKPOINTS

    try:
        signature = read_json_file(run / "test_scores.json").get("signature", "")
        digest = parse_signature(signature).get("ckpt") if isinstance(signature, str) else None
    except (OSError, ValueError, AttributeError):
        digest = None
    if digest:
        for candidate in sorted((run / CHECKPOINTS).glob("*.pt")):
            if candidate.is_file() and file_hash(candidate) == digest:
                return candidate
    return best_checkpoint_of(run)


def best_checkpoint_of(run: Path) -> Path:
    """The checkpoint the main job evaluates (``run_folder.best_checkpoint``: the best validation
    metric their training state records, else ``last.pt``)."""
    import math

    from captioning.utils.run_folder import best_checkpoint

    def metric(path: Path) -> float:
        return (load_checkpoint(path).get("training") or {}).get("state", {}).get("best_metric", -math.inf)

    return best_checkpoint(run, metric)
