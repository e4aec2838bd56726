"""The datasets a run reads: the records of each split, cached grids for a frozen encoder or images."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from captioning.config import Config
from captioning.data.datasets import CaptionDataset, usable_workers
from captioning.data.feature_cache import FeatureCache
from captioning.data.readers import reader_of
from captioning.data.records import DatasetError, ImageRecord
from captioning.models.captioner import Captioner
from captioning.utils import distributed


def feature_cache_dir(config: Config, output_dir: Path) -> Path:
    """Shared by runs over the same data: under the data's folder unless configured."""
    if config.data.cache_dir:
        return Path(config.data.cache_dir)
    reader = reader_of(config.data)
    if not reader.cache_under_root(config.data):
        return output_dir / "features"
    return reader.data_folder(config.data) / "features"


def uses_cache(config: Config) -> bool:
    """Whether a run reads cached grids: ``data.use_cache`` with a frozen encoder (no stage fine-tuned)."""
    return config.data.use_cache and config.model.encoder.fine_tune_stages == 0


def caption_dataset(
    records: list[ImageRecord],
    model: Captioner,
    config: Config,
    device: torch.device,
    output_dir: Path,
    progress: bool,
    captions_per_image: int,
    group: distributed.ProcessGroup | None = None,
    build_cache: bool = True,
) -> CaptionDataset:
    """A dataset over ``records``: cached grids for a frozen encoder, images otherwise.

    With several processes (``group``), every rank must call this: they fill the cache together.
    ``build_cache`` False: a complete cache is used if there is one, else images are read (nothing
    is written); for a cache folder named by a checkpoint rather than by the user.
    """
    group = group or distributed.ProcessGroup()
    dataset = functools.partial(
        CaptionDataset,
        records,
        model.vocab,
        config.data.max_caption_length,
        captions_per_image=captions_per_image,
        seed=config.train.seed,
        skip_bad_images=config.data.skip_bad_images,
    )
    cache = None
    if uses_cache(config):
        cache = FeatureCache.build_or_open(
            feature_cache_dir(config, output_dir),
            model.encoder,
            records,
            device=device,
            num_workers=usable_workers(config.data.num_workers),
            progress=progress,
            skip_bad_images=config.data.skip_bad_images,
            rank=group.rank,
            world_size=group.world_size,
            build=build_cache,
            # the folder the user named: below it the cache writes through no link
            under=config.data.cache_dir or feature_cache_dir(config, output_dir).parent,
        )
    if cache is not None:
        return dataset(features=cache, unreadable=set(cache.bad))
    return dataset(transform=model.encoder.transform)


def check_splits(
    records: Sequence[ImageRecord], dataset: str, needed: Sequence[str], source: str = ""
) -> Counter[str]:
    """Images per split, after checking that every split in ``needed`` has some.

    Args:
        source: the files the records were read from (``data_source``), named first in the message.
    Raises:
        DatasetError: naming the files, the empty split and the splits there are.
    """
    counts = Counter(record.split for record in records)
    for split in needed:
        if not counts[split]:
            have = (
                ", ".join(f"{name or '(none)'} {count}" for name, count in sorted(counts.items()))
                or "no images"
            )
            hint = (
                "; train.py scores the test split after training: give data with one, or pass --no-test"
                if split == "test"
                else ""
            )
            raise DatasetError(
                f"{source}: " * bool(source)
                + f"the {dataset} dataset has no images in split {split!r} (it has {have}){hint}"
            )
    return counts
