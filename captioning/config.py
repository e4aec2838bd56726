"""Typed, frozen configuration for every part of the pipeline.

The configuration is a tree of dataclasses (``Config`` -> ``DataConfig``, ``EncoderConfig``, ...).
It is filled from a YAML file, overridden from the command line with dotted keys
(``train.lr=2e-4``), validated at construction, saved beside the outputs and stored in every
checkpoint as plain Python types, so a checkpoint rebuilds its model with no other file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from captioning.files import not_a_regular_file


class ConfigError(ValueError):
    """A configuration value or file is invalid; the message names the key."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


# The metrics validation computes (without Java): train.metric must name one of them.
SCHEDULES = ("none", "step", "plateau", "noam", "cosine")
PER_STEP_SCHEDULES = ("noam", "cosine")  # the others step once per epoch
VALIDATION_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D")


def _one_of(name: str, value: Any, choices: tuple) -> None:
    _check(value in choices, f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


@dataclass(frozen=True)
class DataConfig:
    """Where the captions and images come from and how captions become token ids."""

    dataset: str = "shapes"  # shapes | karpathy | coco | folder
    root: str = "data/shapes"  # image root (Karpathy: the folder holding filepath/filename)
    split_file: str | None = None  # Karpathy split JSON (dataset_coco.json, dataset_flickr8k.json, ...)
    annotations: tuple[str, ...] = ()  # COCO caption annotation files (captions_train2014.json, ...)
    instances: tuple[str, ...] = ()  # COCO instances JSON files with boxes, for attention grounding
    restval_to_train: bool = True  # Karpathy's 'restval' images join 'train'
    min_word_count: int = 5  # words seen fewer times in train become <unk>
    max_caption_length: int = 20  # words per caption, without <start>/<end>; longer ones are cut
    skip_bad_images: bool = False  # skip (and count) unreadable images instead of stopping
    num_workers: int = 0  # DataLoader worker processes
    cache_dir: str | None = None  # feature cache folder; None: <data.root>/features
    use_cache: bool = True  # cache frozen-encoder features on disk (ignored when fine-tuning)
    # Shapes, the built-in synthetic dataset.
    shapes_seed: int = 0  # Shapes: generator seed (same seed, same bytes)
    shapes_train: int = 2000  # Shapes: training images
    shapes_val: int = 200  # Shapes: validation images
    shapes_test: int = 200  # Shapes: test images
    shapes_image_size: int = 224  # Shapes: image side in pixels
    shapes_max_objects: int = 3  # Shapes: at most this many objects per image (1-3)

    def __post_init__(self) -> None:
        _one_of("data.dataset", self.dataset, ("shapes", "karpathy", "coco", "folder"))
        _check(self.min_word_count >= 1, f"data.min_word_count must be >= 1, got {self.min_word_count}")
        _check(self.max_caption_length >= 1, "data.max_caption_length must be >= 1")
        _check(self.num_workers >= 0, "data.num_workers must be >= 0")
        _check(1 <= self.shapes_max_objects <= 3, "data.shapes_max_objects must be 1, 2 or 3")
        _check(min(self.shapes_train, self.shapes_val, self.shapes_test) >= 1,
               "data.shapes_train/val/test must be >= 1")
        _check(self.shapes_image_size >= 32, "data.shapes_image_size must be >= 32")


@dataclass(frozen=True)
class EncoderConfig:
    """The CNN that turns an image into a grid of annotation vectors."""

    name: str = "efficientnet_lite0"  # a name from captioning.models.encoders.ENCODERS
    weights: str = "pretrained"  # pretrained | none | path to a state-dict file
    image_size: int = 224  # images resized to a square of this side, no crop (the grid covers the image)
    grid_size: int = 0  # 0 keeps the native grid; else adaptive pooling to grid_size x grid_size (coarser only)
    fine_tune_stages: int = 0  # last N stages trained; 0 = frozen (features can be cached)

    def __post_init__(self) -> None:
        _check(self.image_size >= 32, f"model.encoder.image_size must be >= 32, got {self.image_size}")
        _check(self.grid_size >= 0, f"model.encoder.grid_size must be >= 0, got {self.grid_size}")
        _check(self.fine_tune_stages >= 0, "model.encoder.fine_tune_stages must be >= 0")


@dataclass(frozen=True)
class DecoderConfig:
    """The caption decoder: the attention LSTM of Show, Attend and Tell, or a Transformer."""

    kind: str = "lstm"  # lstm (Show, Attend and Tell) | transformer (README: "The Transformer decoder")
    attention: str = "soft"  # soft (section 4.2) | hard (stochastic, section 4.1)
    scoring: str = "additive"  # additive | dot | scaled_dot | multihead
    activation: str = "tanh"  # additive scoring non-linearity: tanh (paper) | relu (tutorial)
    num_heads: int = 8  # multihead scoring; the Transformer's attention heads
    embed_dim: int = 512  # word embedding size
    hidden_dim: int = 512  # LSTM size
    attention_dim: int = 512  # attention projection size
    gate: str = "scalar"  # scalar (paper's beta_t) | channel (tutorial) | none
    deep_output: bool = True  # equation 7; False gives a plain linear output over h_t
    dropout: float = 0.5  # LSTM: before the output layer; Transformer: embeddings and every residual branch
    doubly_stochastic: float = 1.0  # lambda of equation 14, both terms per caption (README: "What lambda means")
    # Hard attention (equation 12: REINFORCE with a moving-average baseline and an entropy bonus).
    hard_reinforce: float = 1.0  # hard attention: lambda_r, weight of the REINFORCE term
    hard_entropy: float = 0.002  # hard attention: lambda_e, weight of the entropy bonus
    hard_baseline_decay: float = 0.9  # hard attention: decay of the moving-average reward baseline
    hard_expected_prob: float = 0.5  # probability of using the expected context instead of a sample
    # Transformer (kind: transformer) only.
    d_model: int = 512  # Transformer: model width (embeddings, attention, residual stream)
    d_ff: int = 2048  # Transformer: inner size of the feed-forward blocks
    encoder_layers: int = 3  # Transformer: self-attention blocks over the grid, once per image; 0 = none
    decoder_layers: int = 3  # Transformer: decoder blocks (masked self-attention, cross-attention, feed-forward)
    pre_norm: bool = False  # Transformer: LayerNorm before each sublayer instead of after (the original)
    tie_embeddings: bool = True  # Transformer: the output layer shares the word embedding matrix

    def __post_init__(self) -> None:
        _one_of("model.decoder.kind", self.kind, ("lstm", "transformer"))
        if self.kind == "transformer":
            _check(self.attention == "soft", "model.decoder.attention must be soft with kind transformer")
            for name in ("d_model", "d_ff", "decoder_layers"):
                _check(getattr(self, name) >= 1, f"model.decoder.{name} must be >= 1, got {getattr(self, name)}")
            _check(self.encoder_layers >= 0, f"model.decoder.encoder_layers must be >= 0, got {self.encoder_layers}")
            _check(self.d_model % self.num_heads == 0,
                   f"model.decoder.d_model ({self.d_model}) must be divisible by model.decoder.num_heads "
                   f"({self.num_heads})")
        _one_of("model.decoder.attention", self.attention, ("soft", "hard"))
        _one_of("model.decoder.scoring", self.scoring, ("additive", "dot", "scaled_dot", "multihead"))
        _one_of("model.decoder.activation", self.activation, ("tanh", "relu"))
        _one_of("model.decoder.gate", self.gate, ("scalar", "channel", "none"))
        for name in ("embed_dim", "hidden_dim", "attention_dim", "num_heads"):
            _check(getattr(self, name) >= 1, f"model.decoder.{name} must be >= 1")
        if self.scoring == "multihead":
            _check(self.attention_dim % self.num_heads == 0,
                   "model.decoder.attention_dim must be divisible by model.decoder.num_heads")
        _check(0.0 <= self.dropout < 1.0, f"model.decoder.dropout must be in [0, 1), got {self.dropout}")
        for name in ("doubly_stochastic", "hard_reinforce", "hard_entropy"):
            value = getattr(self, name)
            _check(math.isfinite(value) and value >= 0, f"model.decoder.{name} must be finite and >= 0, got {value}")
        _check(0.0 <= self.hard_expected_prob <= 1.0, "model.decoder.hard_expected_prob must be in [0, 1]")
        _check(0.0 <= self.hard_baseline_decay < 1.0, "model.decoder.hard_baseline_decay must be in [0, 1)")


@dataclass(frozen=True)
class ModelConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)


@dataclass(frozen=True)
class DecodeConfig:
    """How captions are generated at validation, test and visualization time."""

    strategy: str = "beam"  # greedy | beam | sample
    beam_size: int = 3  # hypotheses kept per image
    max_length: int = 20  # words, without <end>
    min_length: int = 0  # <end> is forbidden before this many words
    length_alpha: float = 0.0  # GNMT length normalisation ((5 + len) / 6) ** alpha; 0 = none
    block_trigrams: bool = False  # forbid a trigram from appearing twice in one caption
    temperature: float = 1.0  # sampling only
    top_k: int = 0  # sampling only; 0 = the whole vocabulary
    forbid_unk: bool = True  # never emit <unk> (validation, test, figures and self-critical rollouts)
    batch_size: int = 50  # images decoded at once

    def __post_init__(self) -> None:
        _one_of("decode.strategy", self.strategy, ("greedy", "beam", "sample"))
        _check(self.beam_size >= 1, f"decode.beam_size must be >= 1, got {self.beam_size}")
        _check(self.max_length >= 1, f"decode.max_length must be >= 1, got {self.max_length}")
        _check(0 <= self.min_length <= self.max_length, "decode.min_length must be in [0, max_length]")
        _check(0 <= self.length_alpha <= 10, f"decode.length_alpha must be in [0, 10], got {self.length_alpha}")
        # Logits are divided by it: far below 1e-3 they overflow to inf and sampling gives NaN.
        _check(1e-3 <= self.temperature <= 1e3, f"decode.temperature must be in [0.001, 1000], got {self.temperature}")
        _check(self.top_k >= 0, "decode.top_k must be >= 0")
        _check(self.batch_size >= 1, "decode.batch_size must be >= 1")


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation: cross-entropy stage, then optionally self-critical."""

    output_dir: str = "runs/shapes"  # checkpoints, logs, results and figures go here
    overwrite: bool = False  # a new run in an output_dir with another run's checkpoints deletes its outputs; else refused
    resume: str = "none"  # none | auto: continue from output_dir's checkpoints/last.pt if there is one (--resume auto)
    epochs: int = 4  # cross-entropy epochs
    batch_size: int = 32  # images per batch (each brings all its captions)
    captions_per_image: int = 5  # captions of an image used per step (seq_per_img)
    lr: float = 4e-4  # decoder learning rate (Adam), cross-entropy stage
    encoder_lr: float = 1e-4  # used when model.encoder.fine_tune_stages > 0
    weight_decay: float = 0.0  # Adam weight decay
    adam_beta2: float = 0.999  # Adam's second-moment decay (Transformer recipes use 0.98)
    grad_clip: float = 5.0  # max gradient norm; 0 disables
    label_smoothing: float = 0.0  # cross-entropy label smoothing
    ema_decay: float = 0.0  # validate and keep an exponential moving average of the weights (e.g. 0.998); 0 = off
    schedule: str = "plateau"  # none | step | plateau (per epoch) | noam | cosine (per step, cross-entropy stage only: warm-up, then 1/sqrt(step) or half a cosine to 0 at the last epoch's end)
    warmup_steps: int = 4000  # noam, cosine: steps of linear warm-up to train.lr
    step_size: int = 3  # epochs between decays (step)
    gamma: float = 0.8  # decay factor (step and plateau)
    plateau_patience: int = 2  # epochs without improvement before a plateau decay
    early_stop_patience: int = 5  # epochs without improvement of `metric`; 0 disables
    metric: str = "CIDEr-D"  # validation metric for best checkpoint and early stopping: BLEU-1..4, ROUGE-L or CIDEr-D
    val_images: int = 0  # validate on the first N validation images; 0 = all
    seed: int = 0  # seeds Python, NumPy, torch and the batch order
    deterministic: bool = False  # deterministic algorithms (exact resume on CPU)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "none"  # none | bf16 (GPU or CPU) | fp16 (GPU): autocast in training and validation
    compile: bool = False  # torch.compile the decoder step (helps on GPU; slow to compile on CPU)
    checkpoint_every: int = 0  # also checkpoint every N steps; 0 = once per epoch
    nonfinite: str = "stop"  # stop | skip: what a non-finite loss does
    max_steps: int = 0  # stop after N optimisation steps in total (tests, smoke runs); 0 = no limit
    log_every: int = 20  # TensorBoard scalars every N steps
    # Self-critical sequence training (Rennie et al. 2017), after the cross-entropy epochs.
    scst_epochs: int = 0  # self-critical epochs after the cross-entropy epochs
    scst_lr: float = 2e-5  # learning rate of the self-critical stage (a fine-tuned encoder's: encoder_lr * scst_lr / lr)
    scst_baseline: str = "greedy"  # greedy | mean (mean reward of the other samples)
    scst_samples: int = 5  # sampled captions per image

    def __post_init__(self) -> None:
        _check(self.epochs >= 0, f"train.epochs must be >= 0, got {self.epochs}")
        _check(self.batch_size >= 1, f"train.batch_size must be >= 1, got {self.batch_size}")
        _check(self.captions_per_image >= 1, "train.captions_per_image must be >= 1")
        for name in ("lr", "encoder_lr", "scst_lr"):
            _check(getattr(self, name) > 0, f"train.{name} must be > 0, got {getattr(self, name)}")
        _check(self.weight_decay >= 0, "train.weight_decay must be >= 0")
        _check(0.0 <= self.adam_beta2 < 1.0, f"train.adam_beta2 must be in [0, 1), got {self.adam_beta2}")
        _check(self.grad_clip >= 0, "train.grad_clip must be >= 0")
        _check(0.0 <= self.label_smoothing < 1.0, "train.label_smoothing must be in [0, 1)")
        _check(0.0 <= self.ema_decay < 1.0, f"train.ema_decay must be in [0, 1), got {self.ema_decay}")
        _one_of("train.schedule", self.schedule, SCHEDULES)
        _check(self.warmup_steps >= 1, f"train.warmup_steps must be >= 1, got {self.warmup_steps}")
        _check(self.step_size >= 1, "train.step_size must be >= 1")
        _check(0 < self.gamma <= 1, "train.gamma must be in (0, 1]")
        _check(self.early_stop_patience >= 0, "train.early_stop_patience must be >= 0")
        _one_of("train.resume", self.resume, ("none", "auto"))
        _one_of("train.metric", self.metric, VALIDATION_METRICS)
        _check(0 <= self.seed < 2 ** 32, f"train.seed must be in [0, 2**32 - 1], got {self.seed}")
        _one_of("train.amp", self.amp, ("none", "bf16", "fp16"))
        _one_of("train.nonfinite", self.nonfinite, ("stop", "skip"))
        _one_of("train.scst_baseline", self.scst_baseline, ("greedy", "mean"))
        _check(self.scst_samples >= 2 or self.scst_baseline == "greedy",
               "train.scst_samples must be >= 2 with the mean baseline")
        for name in ("checkpoint_every", "max_steps", "val_images", "scst_epochs"):
            _check(getattr(self, name) >= 0, f"train.{name} must be >= 0")
        _check(self.log_every >= 1, "train.log_every must be >= 1")


@dataclass(frozen=True)
class Config:
    """The whole configuration of a run."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


def to_dict(config: Any) -> dict[str, Any]:
    """A configuration dataclass as nested plain dicts/lists (for YAML, JSON and checkpoints)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value

    return plain(config)


def _coerce(type_hint: Any, value: Any, key: str) -> Any:
    """Turn a YAML/CLI value into the field's declared type, or raise ConfigError naming the key."""
    origin = typing.get_origin(type_hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(type_hint)
        is_null = value is None or (isinstance(value, str) and value.lower() in ("none", "null", ""))
        if is_null and type(None) in options:
            return None
        inner = [t for t in options if t is not type(None)]
        return _coerce(inner[0], value, key)
    if origin is tuple:
        if value is None:  # older configurations wrote null for an empty optional file
            return ()
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return tuple(_coerce(str, v, key) for v in value)
    if type_hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            return value.lower() in ("true", "yes", "1", "on")
        raise ConfigError(f"{key} must be true or false, got {_shown(value)}")
    if type_hint is int:
        # Integers only, as written: 1e3 or 2.0 is a float in YAML and is not silently truncated.
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            if isinstance(value, str):
                return int(value.strip())
        except ValueError:
            pass
        raise ConfigError(f"{key} must be an integer, got {_shown(value)}")
    if type_hint is float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be a number, got {_shown(value)}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        return number
    if type_hint is str:
        if value is None:  # str(None) would be the folder name "None"
            raise ConfigError(f"{key} must be a string, got null")
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        if "\x00" in str(value):
            raise ConfigError(f"{key} must not contain a NUL character")
        return _expand_home(str(value), key) if key in PATH_KEYS else str(value)
    return value


# Keys that name files or folders: a leading ~ or ~user is expanded as a shell does (a quoted path or
# KEY=~/x after --set reaches the program unexpanded), never taken as a folder named "~".
PATH_KEYS = frozenset(["data.root", "data.split_file", "data.annotations", "data.instances", "data.cache_dir",
                       "model.encoder.weights", "train.output_dir"])

# The spellings YAML reads as null; --set KEY=VALUE reads them the same way.
YAML_NULLS = frozenset(["", "~", "null", "Null", "NULL"])


def _shown(value: Any) -> str:
    return "null" if value is None else repr(value)


def _expand_home(path: str, key: str) -> str:
    if not path.startswith("~"):
        return path
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        raise ConfigError(f"{key}: cannot expand {path!r}: no such user or no home folder; give the full path")
    return expanded


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'configuration'} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        where = prefix or "the top level"
        raise ConfigError(f"unknown configuration key {prefix + unknown[0]!r} in {where}; "
                          f"known: {', '.join(sorted(names))}")
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        key = prefix + name
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, key + ".")
        else:
            kwargs[name] = _coerce(hint, value, key)
    return cls(**kwargs)


def from_dict(values: dict[str, Any]) -> Config:
    """Build a validated Config from nested dicts; missing keys take their defaults."""
    return _build(Config, values, "")


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {key!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


# The sections of a checkpoint's configuration that evaluating or visualizing may change: the model is fixed.
CHECKPOINT_SECTIONS = ("data", "decode")


def parse_overrides(items: Iterable[str]) -> dict[str, str | None]:
    """``["train.lr=2e-4", ...]`` as typed after ``--set`` -> ``{"train.lr": "2e-4", ...}`` (later wins).

    A value YAML reads as null (``null``, ``~``, nothing) is None, as in a configuration file: an
    optional key is unset by it, and a key that must hold a string refuses it.

    Raises:
        ConfigError: an item without ``=`` or with an empty key.
    """
    overrides: dict[str, str | None] = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = None if value.strip() in YAML_NULLS else value.strip()
    return overrides


def check_overrides(overrides: dict[str, Any], sections: tuple[str, ...] | None = None) -> None:
    """Fail fast on overrides that no configuration can take: each key must name a field (inside
    ``sections`` when given) and each value must have the field's type. Range and cross-field rules
    (``decode.min_length <= decode.max_length``) are checked when the overrides are applied.

    Raises:
        ConfigError: naming the key.
    """
    for key, value in overrides.items():
        if sections is not None and key.split(".", 1)[0] not in sections:
            allowed = " and ".join(f"{section}.*" for section in sections)
            raise ConfigError(f"{key}: only {allowed} keys can be overridden here (the rest is fixed, "
                              "e.g. by the checkpoint)")
        cls: type = Config
        parts = key.split(".")
        for depth, part in enumerate(parts):
            names = {f.name for f in dataclasses.fields(cls)}
            prefix = ".".join(parts[:depth]) + "." if depth else ""
            if part not in names:
                raise ConfigError(f"unknown configuration key {prefix + part!r} in {prefix or 'the top level'}; "
                                  f"known: {', '.join(sorted(names))}")
            hint = typing.get_type_hints(cls)[part]
            is_section = dataclasses.is_dataclass(hint)
            if depth == len(parts) - 1:
                if is_section:
                    raise ConfigError(f"{key} is a section: set one of its keys, e.g. {key}.{dataclasses.fields(hint)[0].name}")
                _coerce(hint, value, key)
            elif not is_section:
                raise ConfigError(f"cannot set {key!r}: {prefix + part!r} is not a section")
            else:
                cls = hint


def apply_overrides(config: Config, overrides: dict[str, Any],
                    sections: tuple[str, ...] | None = None) -> Config:
    """``config`` with dotted-key ``overrides`` applied and the result validated again.

    Args:
        config: a validated configuration, e.g. a checkpoint's.
        overrides: ``{"decode.beam_size": "5", ...}``; values may be strings as typed on a command line.
        sections: when given, the only top-level sections whose keys may change (a checkpoint's
            ``model`` must stay as it was trained).
    Raises:
        ConfigError: a key outside ``sections``, an unknown key or an invalid value.
    """
    check_overrides(overrides, sections)
    tree = to_dict(config)
    for key, value in overrides.items():
        _set_dotted(tree, key, value)
    return from_dict(tree)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML configuration (or start from the defaults) and apply dotted-key overrides.

    Args:
        path: YAML file whose nested sections mirror ``Config``; None starts from the defaults.
        overrides: ``{"train.lr": 2e-4, ...}``; values may be strings as typed on a command line.
    Returns:
        The validated, frozen ``Config``.
    Raises:
        ConfigError: the file is unreadable or not YAML, a key is unknown, or a value is invalid.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            kind = not_a_regular_file(path)
            if kind is not None:
                raise ConfigError(f"{path}: {kind}")
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"{path}: cannot read configuration ({error.strerror})") from None
        except UnicodeDecodeError as error:
            raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None
        try:
            tree = yaml.safe_load(text) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
        except RecursionError:
            raise ConfigError(f"{path}: YAML nested too deeply to read") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: a configuration must be a mapping of sections")
    for key, value in (overrides or {}).items():
        _set_dotted(tree, key, value)
    try:
        return from_dict(tree)
    except ConfigError as error:
        # Name the file only when the bad value came from it, not from an override (a flag or --set).
        from_override = any(str(error).startswith(key) or repr(key) in str(error) for key in overrides or {})
        raise ConfigError(f"{path}: {error}" if path and not from_override else str(error)) from None


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved configuration as YAML (readable by ``load_config``)."""
    from captioning.files import atomic_write

    text = yaml.safe_dump(to_dict(config), sort_keys=False)
    atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def config_json(config: Any) -> str:
    """The configuration as one JSON line, for logs."""
    return json.dumps(to_dict(config), sort_keys=True)
