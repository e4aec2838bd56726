"""What a removed cell holds: the baselines of integrated gradients, occlusion and the curves.

``ExplainConfig.baseline`` names one:

- ``dataset_mean`` (the default): the TRAINING split's mean grid feature, the same (C,) feature in
  every cell of every image, so an image's maps never depend on which other images are explained
  with it. It is computed once, from the feature cache when the run has one (else through the
  encoder), and kept in the run folder as ``train_mean_feature.json`` under a key of the encoder,
  the training images and (for a fine-tuned encoder) the checkpoint: a later study reads it back.
  The signature names it with a hash of its values (``baseline=dataset_mean.3f2a9c01d4e5``).
- ``zeros``: a zero feature in every cell.
- ``blur``: each image blurred on its pixels (a Gaussian of standard deviation 10/224 of its shorter
  side, Fong and Vedaldi 2017's strongest blur at 224 pixels) through the encoder: a (P, C) grid per
  image, cell p of the blurred image standing in for cell p.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFilter
from torch import Tensor
from torch.utils.data import DataLoader

from captioning.config import Config
from captioning.data.datasets import collate_captions
from captioning.hub.identity import file_hash
from captioning.inference.batches import annotations_of, move
from captioning.inference.captioner import split_records
from captioning.inference.inputs import caption_dataset
from captioning.models.captioner import Captioner
from captioning.utils.errors import InputError
from captioning.utils.files import atomic_write
from captioning.utils.json_files import read_json_file

BASELINE_FILE = "train_mean_feature.json"
BLUR_SIGMA = 10 / 224  # of the picture's shorter side


def baseline_hash(baseline: Tensor) -> str:
    """sha256 (12 hex digits) of a baseline's float32 values: its name in the signature."""
    return hashlib.sha256(baseline.detach().float().cpu().numpy().tobytes()).hexdigest()[:12]


def _key(captioner: Captioner, config: Config, records: Sequence, checkpoint: Path | None) -> str:
    """What the training mean depends on: the encoder, the training images and, when the encoder was
    fine-tuned, the checkpoint's weights."""
    fine_tuned = config.model.encoder.fine_tune_stages > 0
    value = {
        "encoder": captioner.encoder.fingerprint(),
        "images": sorted([str(r.image_id), str(r.path)] for r in records),
        "weights": file_hash(checkpoint) if fine_tuned and checkpoint is not None else None,
    }
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _stored(path: Path, key: str, channels: int) -> Tensor | None:
    """The mean kept at ``path`` when it was computed under ``key`` and is whole; else None."""
    if not path.is_file():
        return None
    try:
        stored = read_json_file(path)
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("key") != key:
        return None
    mean = stored.get("mean")
    if not isinstance(mean, list) or len(mean) != channels:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in mean):
        return None
    return torch.tensor(mean, dtype=torch.float32)


@torch.no_grad()
def training_mean(
    captioner: Captioner,
    config: Config,
    device: torch.device,
    run_dir: Path | None,
    checkpoint: Path | None = None,
    build_cache: bool = False,
    progress: bool = False,
) -> Tensor:
    """(C,) float32: the mean grid feature over the cells of the training split's images.

    Read back from ``run_dir / train_mean_feature.json`` when it was kept there under the same key;
    else computed (from the feature cache when there is one) and, when ``run_dir`` is given, kept.

    Raises:
        InputError: the training split cannot be read (naming ``baseline`` and the other choices).
    """
    try:
        records = split_records(config, "train", generate=False)
    except (OSError, ValueError) as error:
        raise InputError(
            f"baseline dataset_mean needs the training split's images ({error}); choose baseline "
            "zeros or blur, or give a (C,) feature"
        ) from None
    key = _key(captioner, config, records, checkpoint)
    path = run_dir / BASELINE_FILE if run_dir is not None else None
    kept = _stored(path, key, captioner.encoder.channels) if path is not None else None
    if kept is not None:
        return kept
    dataset = caption_dataset(
        records, captioner, config, device, run_dir or Path.cwd(), progress, 1, build_cache=build_cache
    )
    loader = DataLoader(dataset, batch_size=config.decode.batch_size, collate_fn=collate_captions)
    total = torch.zeros(captioner.encoder.channels, dtype=torch.float64)
    cells = 0
    for batch in loader:
        if batch is None:
            continue
        grids = annotations_of(captioner, move(batch, device)).double().cpu()  # (B, P, C)
        total += grids.sum(dim=(0, 1))
        cells += grids.size(0) * grids.size(1)
    if cells == 0:
        raise InputError("baseline dataset_mean: the training split has no readable image")
    mean = (total / cells).float()
    if path is not None:
        content = json.dumps({"key": key, "images": len(records), "mean": mean.tolist()})
        atomic_write(path, lambda p: p.write_text(content, encoding="utf-8"))
    return mean


def blurred(picture: Image.Image) -> Image.Image:
    """``picture`` under a Gaussian blur of standard deviation ``BLUR_SIGMA`` of its shorter side."""
    return picture.filter(ImageFilter.GaussianBlur(radius=BLUR_SIGMA * min(picture.size)))


@torch.no_grad()
def blurred_grids(
    captioner: Captioner, pictures: Sequence[Callable[[], Image.Image]], device: torch.device, batch: int
) -> Tensor:
    """(N, P, C) float32 grids of the N pictures blurred (each read by calling it, one batch in memory
    at a time), through the encoder."""
    transform = captioner.encoder.transform
    grids = []
    for first in range(0, len(pictures), batch):
        pixels = torch.stack([transform(blurred(read())) for read in pictures[first : first + batch]])
        grids.append(captioner.encode(pixels.to(device)).float())
    return torch.cat(grids)


def checked_baseline(value: object, channels: int) -> Tensor:
    """A baseline given as an array: a (C,) tensor or numpy array of finite numbers -> (C,) float32.

    Raises:
        InputError: another type (a list), another shape or a NaN or infinite value, naming ``baseline``.
    """
    if not isinstance(value, (torch.Tensor, np.ndarray)):
        raise InputError(
            "baseline must be dataset_mean, zeros, blur or a (C,) tensor or numpy array of the grid's "
            f"{channels} channels, got a {type(value).__name__}"
        )
    tensor = torch.as_tensor(value)
    if tuple(tensor.shape) != (channels,):
        raise InputError(
            f"baseline must have shape ({channels},), the grid's channels, got {tuple(tensor.shape)}"
        )
    if not (tensor.dtype.is_floating_point or tensor.dtype in (torch.int32, torch.int64, torch.uint8)):
        raise InputError(f"baseline must hold numbers, got dtype {tensor.dtype}")
    tensor = tensor.detach().float().cpu()
    if not bool(torch.isfinite(tensor).all()):
        raise InputError("baseline must be finite: it holds NaN or infinite values")
    return tensor
