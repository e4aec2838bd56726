"""What decoding and a decoder cost in memory, checked before any work against what the device has
free (``captioning.utils.memory.available_bytes``, which an address-space limit bounds too).

Each check raises one ``ConfigError`` line naming the key whose count drives the cost: ``num_return``
for sampling, ``beam_size`` for beam search, ``train.scst_samples`` for self-critical rollouts, the
decoder size (``annotation_layers``, ``init_layers``, ``hidden_dim``, ...) for its parameters.
"""

from __future__ import annotations

import dataclasses

import torch

from captioning.config import Config, ConfigError, DecodeConfig, DecoderConfig
from captioning.utils.memory import available_bytes, gib

FLOAT_BYTES = 4  # float32


def hypothesis_bytes(vocab_size: int, positions: int, channels: int, max_length: int) -> int:
    """Bytes one hypothesis holds at once while it is decoded: a few (V,) score rows, the (P,)
    attention map of every word, and its own copy of the (P, C) grid (each step's attention reads the
    grid once per row: the (N, P, C) weighted annotations)."""
    return FLOAT_BYTES * (3 * vocab_size + (max_length + 1) * (positions + 2) + positions * channels)


def check_decoding_fits(
    config: DecodeConfig, vocab_size: int, positions: int, images: int, device: torch.device, channels: int
) -> None:
    """Refuse, before any decoding, a beam wider than the vocabulary, or hypotheses whose search state
    does not fit in the device's free memory.

    A batch decodes ``min(decode.batch_size, images)`` images of ``num_return`` samples
    (``strategy`` sample), ``beam_size`` beams (beam) or one caption (greedy) each; each hypothesis
    costs ``hypothesis_bytes``.

    Raises:
        ConfigError: one line naming the keys (and the evaluate.py flags) to change.
    """
    key, count = {"beam": ("beam_size", config.beam_size), "sample": ("num_return", config.num_return)}.get(
        config.strategy, ("batch_size", 1)
    )
    if config.strategy == "beam" and count > vocab_size:
        raise ConfigError(
            f"decode.beam_size (--beam-size) must be at most the vocabulary's {vocab_size} words, got {count}"
        )
    batch = min(config.batch_size, max(images, 1))
    rows = batch * count
    needed = rows * hypothesis_bytes(vocab_size, positions, channels, config.max_length)
    free = available_bytes(device)
    if free is None or needed <= free:
        return
    flag = "--" + key.replace("_", "-")
    each = f"decode.{key} {count} x " if key != "batch_size" else ""
    raise ConfigError(
        f"{each}{batch} images per batch = {rows} hypotheses of up to decode.max_length "
        f"{config.max_length} words over a {positions} x {channels} grid need about {gib(needed)}, more "
        f"than the {gib(free)} free on {device}; lower "
        + (f"{flag} or " if key != "batch_size" else "")
        + "--max-length, or --set decode.batch_size="
    )


def check_rollouts_fit(
    config: Config, vocab_size: int, positions: int, channels: int, device: torch.device
) -> None:
    """Refuse, before the first step, self-critical rollouts whose hypotheses do not fit: each step
    samples ``train.scst_samples`` captions of each of ``train.batch_size`` images (and a greedy one
    with the greedy baseline), each a hypothesis (``hypothesis_bytes``) whose every word's score rows
    are kept for the backward pass too.

    Raises:
        ConfigError: one line naming ``train.scst_samples`` and ``train.batch_size``.
    """
    train = config.train
    if train.scst_epochs == 0:
        return
    rows = train.batch_size * train.scst_samples
    length = config.decode.max_length
    kept = FLOAT_BYTES * (length + 1) * 3 * vocab_size  # each word's (V,) rows, for the backward pass
    needed = rows * (hypothesis_bytes(vocab_size, positions, channels, length) + kept)
    needed += train.batch_size * hypothesis_bytes(vocab_size, positions, channels, length)  # greedy
    free = available_bytes(device)
    if free is not None and needed > free:
        raise ConfigError(
            f"train.scst_samples {train.scst_samples} x train.batch_size {train.batch_size} self-critical "
            f"rollouts of up to decode.max_length {config.decode.max_length} words, kept for the backward "
            f"pass, need about {gib(needed)}, more than the {gib(free)} free on {device}; lower "
            "train.scst_samples, train.batch_size or decode.max_length"
        )


# What training holds per parameter: the weights, their gradients and Adam's two moments.
TRAINING_COPIES = 4


def _parameter_bytes(config: DecoderConfig, vocab_size: int, channels: int, grid: tuple[int, int]) -> int:
    from captioning.models.captioner import build_decoder

    with torch.device("meta"):  # shapes only: nothing allocated
        decoder = build_decoder(config, vocab_size, channels, grid)
    return sum(t.numel() * t.element_size() for t in [*decoder.parameters(), *decoder.buffers()])


def decoder_bytes(
    config: DecoderConfig, vocab_size: int, channels: int, grid: tuple[int, int]
) -> tuple[int, dict[str, int]]:
    """The bytes of the decoder's parameters and buffers, and what each size key adds to them.

    A count of identical layers (a size named ``*_layers``) costs the same per layer: the decoder is
    built on the meta device with at most one of each and one more, and the rest extrapolated, so
    that 16,384 layers are priced in milliseconds; the other sizes (widths, heads) are built as given.
    """
    counts = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if f.name.endswith("_layers") and type(getattr(config, f.name)) is int
    }
    least = {name: min(value, 1) for name, value in counts.items()}
    small = dataclasses.replace(config, **least)
    base = _parameter_bytes(small, vocab_size, channels, grid)
    added = {}
    for name, value in counts.items():
        if value > least[name]:
            one_more = dataclasses.replace(small, **{name: least[name] + 1})
            added[name] = (value - least[name]) * (
                _parameter_bytes(one_more, vocab_size, channels, grid) - base
            )
    return base + sum(added.values()), {"": base, **added}


def check_decoder_fits(
    config: DecoderConfig,
    vocab_size: int,
    channels: int,
    grid: tuple[int, int],
    device: torch.device,
    training: bool = False,
) -> None:
    """Refuse, before the decoder is built, one whose parameters do not fit in free memory (with
    ``training``, their gradients and Adam's moments too).

    Raises:
        ConfigError: one line naming the size key that costs the most (a layer count, or the largest
            width against its default).
    """
    total, parts = decoder_bytes(config, vocab_size, channels, grid)
    needed = total * (TRAINING_COPIES if training else 1)
    free = available_bytes(device)
    if free is None or needed <= free:
        return
    key = max(parts, key=lambda name: parts[name])
    if not key:  # the widths: the one furthest above its default
        defaults = type(config)()
        widths = [
            f.name
            for f in dataclasses.fields(config)
            if type(getattr(config, f.name)) is int and getattr(defaults, f.name, 0) > 0
        ]
        key = max(widths, key=lambda name: getattr(config, name) / getattr(defaults, name))
    kept = " with their gradients and Adam's moments" if training else ""
    raise ConfigError(
        f"model.decoder.{key} {getattr(config, key)}: the decoder's parameters{kept} need about "
        f"{gib(needed)}, more than the {gib(free)} free on {device}; lower model.decoder.{key}"
    )
