"""``model.explain``: every option checked before any work, then caption, encode and explain.

The API's front door (:meth:`captioning.api.CaptioningModel.explain`) hands its arguments here; what a
model is asked for is only what the API's model has (``caption``, ``captioner``, ``config``,
``device``, ``grid``, ``vocab``, ``source``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from captioning.data.images import as_rgb_image, check_picture
from captioning.explain.baselines import BASELINE_FILE, blurred_grids, checked_baseline, training_mean
from captioning.explain.captions import WordExplanation, explain_captions
from captioning.explain.config import BASELINES, ExplainConfig, config_with
from captioning.explain.cost import check_explain_fits
from captioning.explain.methods import check_extras, needs_baseline, parse_methods
from captioning.explain.pixel_curves import PixelInputs
from captioning.inference.captioner import decode_config_with
from captioning.utils.errors import InputError

_CAPTION_ONLY = ("layer", "head")  # caption's keyword arguments that are not decoding options


def _method_names(methods: object, decoder: Any) -> tuple[str, ...]:
    if isinstance(methods, str):
        return parse_methods(methods, decoder)
    if not isinstance(methods, (list, tuple)) or not all(isinstance(name, str) for name in methods):
        raise InputError(
            f"methods must be a list of method names or one comma-separated string, got {methods!r}"
        )
    return parse_methods(",".join(methods), decoder)


def _image_list(images: object) -> list:
    if isinstance(images, (str, Path, Image.Image, np.ndarray, torch.Tensor)) or not isinstance(
        images, Iterable
    ):
        raise InputError(f"images must be a list of images, got {type(images).__name__}: pass [image]")
    listed = list(images)
    if not listed:
        raise InputError("images: explain() was given no image")
    return listed


def _settings(
    start: ExplainConfig | None, names: tuple[str, ...], baseline: object, options: Mapping[str, Any]
) -> tuple[ExplainConfig, dict[str, Any]]:
    """The explain settings from ``start`` and the options that name its fields; the rest (caption's)."""
    if start is not None and not isinstance(start, ExplainConfig):
        raise InputError(f"settings must be an ExplainConfig, got {type(start).__name__}")
    start = start or ExplainConfig()
    own = {item.name for item in fields(start)}
    mine = {key: value for key, value in options.items() if key in own}
    if "methods" in mine or "baseline" in mine:
        raise InputError("give methods and baseline as explain()'s own arguments")
    chosen = baseline if isinstance(baseline, str) else start.baseline
    if isinstance(baseline, str) and baseline not in BASELINES:
        raise InputError(f"baseline must be one of {', '.join(BASELINES)} or a (C,) array, got {baseline!r}")
    settings = config_with(start, {**mine, "methods": names, "baseline": chosen})
    return settings, {key: value for key, value in options.items() if key not in own}


def _baseline(
    model: Any, settings: ExplainConfig, given: object, pictures: list, curves: bool
) -> torch.Tensor:
    """(C,) or (N, P, C) on the CPU: the array given, or the named baseline."""
    channels = model.captioner.encoder.channels
    if not isinstance(given, str):
        return checked_baseline(given, channels)
    if settings.baseline == "zeros" or not needs_baseline(settings.methods, curves):  # else unread
        return torch.zeros(channels)
    if settings.baseline == "blur":
        readers = [
            lambda image=image, k=k: as_rgb_image(image, f"images[{k}]") for k, image in enumerate(pictures)
        ]
        return blurred_grids(model.captioner, readers, model.device, model.config.decode.batch_size).cpu()
    kept = getattr(model, "_training_mean", None)
    if kept is None:
        source = Path(model.source)
        run_dir = source.parent.parent if source.parent.name == "checkpoints" else None
        kept = training_mean(model.captioner, model.config, model.device, run_dir, source)
        model._training_mean = kept  # computed once per loaded model (and kept as BASELINE_FILE in its run)
    return kept


def explain_images(
    model: Any,
    images: Iterable,
    methods: object,
    curves: object,
    baseline: object,
    settings: ExplainConfig | None,
    options: Mapping[str, Any],
) -> list[tuple[Any, dict[str, np.ndarray], WordExplanation]]:
    """Per image (its caption, method -> (T, gh, gw) maps, its :class:`WordExplanation`): what
    ``model.explain`` returns (see there); every check first."""
    if not isinstance(curves, bool):
        raise InputError(f"curves must be True or False, got {curves!r}")
    names = _method_names(methods, model.captioner.decoder)
    check_extras(names, "methods")  # captum before any captioning
    config, caption_options = _settings(settings, names, baseline, options)
    listed = _image_list(images)
    decode = decode_config_with(
        model.config.decode, **{k: v for k, v in caption_options.items() if k not in _CAPTION_ONLY}
    )
    if not isinstance(baseline, str):
        checked_baseline(baseline, model.captioner.encoder.channels)
    grid = model.grid
    words = len(listed) * decode.max_length  # at most
    check_explain_fits(config, grid[0] * grid[1], model.captioner.encoder.channels, words, model.device)
    for k, image in enumerate(listed):
        check_picture(image, f"images[{k}]")
    base = _baseline(model, config, baseline, listed, curves)
    captions = model.caption(listed, **caption_options)
    transform = model.captioner.encoder.transform
    with torch.no_grad():
        pixels = torch.stack(
            [transform(as_rgb_image(image, f"images[{k}]")) for k, image in enumerate(listed)]
        )
        grids = model.captioner.encode(pixels.to(model.device)).float()  # (B, P, C)
    tokens = [[model.vocab.stoi[word] for word in caption.words] for caption in captions]
    decoder = model.captioner.decoder
    on_pixels = PixelInputs(
        model.captioner.encode, lambda first, stop: pixels[first:stop].to(model.device), grid
    )  # RISE's pixel curves with settings.pixel_steps
    explained = explain_captions(decoder, grids, tokens, names, base.to(grids), config, curves, on_pixels)
    return [
        (caption, {name: np.asarray(maps).reshape(-1, *grid) for name, maps in item.maps.items()}, item)
        for caption, item in zip(captions, explained, strict=True)
    ]


__all__ = ["BASELINE_FILE", "explain_images"]
