"""The training data loader at COCO's scale: a synthetic feature cache read as training reads it.

``speed.py --parts loader`` writes a feature cache of ``images`` rows of an (h, w, C) float16 grid
through ``FeatureCache.build_or_open`` (the project's own writer and format: ``features.npy``,
``state.bin``, ``index.json``) in a temporary folder, then reads it with the trainer's
``loader_for`` over a ``CaptionDataset`` in shuffled batches of 32 images x 5 captions, with 0, 1
and 2 worker processes, twice each: the first pass after the file's pages were evicted from the page
cache (``posix_fadvise(DONTNEED)``, this file only), the second right after it.

The grids come from a stand-in encoder (a fixed random 1x1 convolution of a tiny image to C
channels at the grid's side): its values do not matter to the loader, only their number. Every
record points at one small PNG, so writing the cache costs the rows, not 113,287 image files.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torchvision.transforms import InterpolationMode

from captioning.config import Config, ShapesDataConfig, TrainConfig
from captioning.data import build_vocabulary
from captioning.data.datasets import CaptionDataset, usable_workers
from captioning.data.feature_cache import FeatureCache
from captioning.data.records import ImageRecord
from captioning.inference.batches import EpochBatches, loader_for, move
from captioning.models.encoders import Backbone, Encoder
from captioning.utils.output_paths import check_output_folder
from captioning.utils.run_folder import RunFolderError

COCO_IMAGES = 113_287  # Karpathy train + restval
CAPTIONS_PER_IMAGE = 5
BATCH_IMAGES = 32
WORKERS = (0, 1, 2)
VOCABULARY_WORDS = 9_486  # plus the 4 special tokens: COCO's usual 9,490
MAX_WORDS = 20  # data.max_caption_length


@dataclass(frozen=True)
class LoaderSizes:
    """The synthetic cache: ``images`` rows of a ``side`` x ``side`` x ``channels`` float16 grid."""

    images: int = COCO_IMAGES
    side: int = 7
    channels: int = 1280

    @property
    def cache_bytes(self) -> int:
        return self.images * self.side * self.side * self.channels * 2


QUICK = LoaderSizes(images=96, side=2, channels=8)


def parse_grid(text: str) -> tuple[int, int]:
    """``7x7x1280`` -> (7, 1280): a square grid's side and its channels."""
    try:
        height, width, channels = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--loader-grid: {text!r} is not HxWxC, e.g. 7x7x1280") from None
    if height != width or min(height, channels) < 1:
        raise SystemExit(
            f"--loader-grid: {text!r}: the grid must be square with positive sizes, e.g. 14x14x2048"
        )
    return height, channels


def cache_parent(folder: Path | None, sizes: LoaderSizes) -> Path:
    """The folder to write the cache under (default: the temporary folder); refuses, before anything
    is written, one that is not a folder or whose disk cannot hold the cache with 1 GiB to spare."""
    folder = Path(folder if folder is not None else tempfile.gettempdir())
    if not folder.is_dir():
        raise SystemExit(f"--loader-dir {folder}: not a folder")
    try:
        check_output_folder(folder, "--loader-dir")  # read-only, or not ours to write
    except RunFolderError as error:
        raise SystemExit(str(error)) from None
    free = shutil.disk_usage(folder).free
    needed = sizes.cache_bytes + sizes.images * 300 + 2**30  # rows, state bytes and index entries, margin
    if needed > free:
        raise SystemExit(
            f"--loader-dir {folder}: {free / 1e9:.1f} GB free, the cache of {sizes.images:,} images "
            f"of {sizes.side}x{sizes.side}x{sizes.channels} float16 needs {needed / 1e9:.1f} GB; "
            "choose a larger disk with --loader-dir or fewer rows with --loader-images"
        )
    return folder


def stand_in_encoder(sizes: LoaderSizes) -> Encoder:
    """An ``Encoder`` whose grid is ``side`` x ``side`` x ``channels`` at ``side`` px: a 1x1 convolution."""
    generator = torch.Generator().manual_seed(0)
    convolution = nn.Conv2d(3, sizes.channels, 1)
    with torch.no_grad():
        convolution.weight.copy_(torch.randn(convolution.weight.shape, generator=generator))
        convolution.bias.copy_(torch.randn(convolution.bias.shape, generator=generator))
    backbone = Backbone(
        features=convolution,
        stages=(convolution,),
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        interpolation=InterpolationMode.NEAREST,
        weights={"stand_in": "conv1x1 seed 0"},
        channels_last=False,
    )
    return Encoder("stand_in", backbone, image_size=sizes.side, grid_size=0).eval()


def coco_like_records(image: Path, sizes: LoaderSizes, words: dict[int, float]) -> list[ImageRecord]:
    """``images`` training records of one image file, 5 captions each, lengths drawn from ``words``."""
    rng = np.random.default_rng(0)
    lengths = rng.choice(
        list(words),
        p=np.array(list(words.values())) / sum(words.values()),
        size=(sizes.images, CAPTIONS_PER_IMAGE),
    )
    vocabulary = [f"w{number}" for number in range(VOCABULARY_WORDS)]
    tokens = rng.integers(0, VOCABULARY_WORDS, size=(sizes.images, CAPTIONS_PER_IMAGE, MAX_WORDS))
    return [
        ImageRecord(
            image_id=number,
            path=image,
            split="train",
            captions=tuple(
                tuple(vocabulary[t] for t in row[:length])
                for row, length in zip(tokens[number], lengths[number], strict=True)
            ),
        )
        for number in range(sizes.images)
    ]


def evict(path: Path) -> None:
    """Drop ``path``'s clean pages from the page cache (only this file; pages mapped by a process stay)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def read_pass(dataset: CaptionDataset, workers: int, device: torch.device) -> tuple[float, int, int]:
    """One epoch of the trainer's loader: (seconds, captions, images) delivered to ``device``."""
    config = Config(data=ShapesDataConfig(num_workers=workers), train=TrainConfig(device=device.type))
    loader = loader_for(dataset, EpochBatches(len(dataset), BATCH_IMAGES, seed=0, epoch=0), config, device)
    captions = images = 0
    start = time.perf_counter()
    for batch in loader:
        batch = move(batch, device)
        captions += batch["lengths"].numel()
        images += batch["indices"].numel()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, captions, images


@contextlib.contextmanager
def unmapped(cache: FeatureCache) -> Iterator[FeatureCache]:
    """A copy of ``cache`` as a worker receives it (no open memory map), unmapped again on exit, so
    that ``evict`` can drop every page of the file before the next first pass."""
    copy = pickle.loads(pickle.dumps(cache))
    try:
        yield copy
    finally:
        del copy
        gc.collect()


def measure(
    sizes: LoaderSizes, folder: Path | None, device: torch.device, words: dict[int, float]
) -> dict[str, Any]:
    """Write the synthetic cache under ``folder`` (default: the temporary folder) and time its reading."""
    parent = cache_parent(folder, sizes)
    results: dict[str, Any] = {
        "loader_images": sizes.images,
        "loader_grid": f"{sizes.side}x{sizes.side}x{sizes.channels}",
        "loader_cache_gb": sizes.cache_bytes / 1e9,
    }
    with tempfile.TemporaryDirectory(prefix="speed_loader_", dir=parent) as temporary:
        image = Path(temporary) / "image.png"
        Image.new("RGB", (sizes.side, sizes.side), (120, 60, 200)).save(image)
        records = coco_like_records(image, sizes, words)
        vocab = build_vocabulary(records, min_count=1)
        start = time.perf_counter()
        cache = FeatureCache.build_or_open(
            Path(temporary) / "features", stand_in_encoder(sizes), records, batch_size=256, progress=False
        )
        results["loader_write_s"] = time.perf_counter() - start
        start = time.perf_counter()
        dataset = CaptionDataset(records, vocab, MAX_WORDS, CAPTIONS_PER_IMAGE, features=cache)
        results["loader_dataset_s"] = time.perf_counter() - start
        features_file = cache.path / "features.npy"
        first, second, used = {}, {}, {}
        for workers in WORKERS:
            used[str(workers)] = usable_workers(workers)
            with unmapped(cache) as features:
                dataset.features = features
                evict(features_file)
                first[str(workers)] = read_pass(dataset, workers, device)
                second[str(workers)] = read_pass(dataset, workers, device)
                dataset.features = cache  # the copy, and its memory map, go on leaving the block
    row_bytes = sizes.cache_bytes / sizes.images
    for name, passes in (("loader_first_pass", first), ("loader", second)):
        results[f"{name}_captions_per_s"] = {
            w: captions / seconds for w, (seconds, captions, _) in passes.items()
        }
        # Megabytes of the cache file (float16 rows) delivered per second.
        results[f"{name}_mb_per_s"] = {
            w: images * row_bytes / seconds / 1e6 for w, (seconds, _, images) in passes.items()
        }
    results["loader_workers_used"] = used
    results["loader_mean_words"] = statistics.fmean(len(c) for r in records for c in r.captions)
    return results
