"""Datasets: readers that turn each source into ``ImageRecord`` lists, and the vocabulary built on them.

``load_records(config)`` picks the reader named by ``config.dataset`` from ``READERS``.
Torch datasets live in ``captioning.data.datasets``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Collection
from pathlib import Path

from captioning.config import ConfigError, DataConfig
from captioning.data.coco import read_coco
from captioning.data.folder import read_folder
from captioning.data.karpathy import read_karpathy
from captioning.data.record_index import load_indexed
from captioning.data.records import DatasetError, ImageRecord, records_of_split
from captioning.data.shapes import generate_shapes, read_shapes
from captioning.data.vocab import Vocabulary

__all__ = ["READERS", "DatasetError", "ImageRecord", "build_vocabulary", "caption_length_summary",
           "generate_shapes", "load_records", "read_coco", "read_folder", "read_karpathy", "read_shapes"]

logger = logging.getLogger(__name__)


def _load_shapes(config: DataConfig) -> list[ImageRecord]:
    generate_shapes(config.root, seed=config.shapes_seed, num_train=config.shapes_train,
                    num_val=config.shapes_val, num_test=config.shapes_test,
                    image_size=config.shapes_image_size, max_objects=config.shapes_max_objects)
    return read_shapes(config.root)


def _load_karpathy(config: DataConfig) -> list[ImageRecord]:
    if config.split_file is None:
        raise ConfigError("data.split_file is required for data.dataset=karpathy "
                          "(e.g. dataset_flickr8k.json)")
    return read_karpathy(config.split_file, config.root, config.restval_to_train)


def _load_coco(config: DataConfig) -> list[ImageRecord]:
    if not config.annotations:
        raise ConfigError("data.annotations is required for data.dataset=coco (e.g. captions_train2014.json)")
    return read_coco(config.annotations, config.root, config.split_file, config.restval_to_train)


def _load_folder(config: DataConfig) -> list[ImageRecord]:
    return read_folder(config.root)


READERS: dict[str, Callable[[DataConfig], list[ImageRecord]]] = {
    "shapes": _load_shapes,
    "karpathy": _load_karpathy,
    "coco": _load_coco,
    "folder": _load_folder,
}


# Readers of large caption files: their records are kept in a compact per-split index (record_index).
INDEXED_READERS = frozenset({"karpathy", "coco"})


def load_records(config: DataConfig, output_dir: Path | None = None,
                 splits: Collection[str] | None = None) -> list[ImageRecord]:
    """Read the dataset named by ``config.dataset`` (generating Shapes under ``config.root`` if needed).

    Karpathy and COCO datasets are read from their per-split index when it is current
    (``captioning.data.record_index``); a run with an ``output_dir`` writes it.

    Args:
        config: the data configuration.
        output_dir: when given (training and caching runs), ``data_summary.json`` (images and
            captions per split, training captions longer than ``max_caption_length``) is written
            there, a warning says how many training captions will be cut, and the dataset index is
            written if it was not current.
        splits: only the records of these splits (all when None).
    Returns:
        One record per image, in the reader's order.
    """
    if config.dataset in INDEXED_READERS:
        records = load_indexed(config, READERS[config.dataset], splits, writable=output_dir is not None)
    else:
        records = READERS[config.dataset](config)
        records = records if splits is None else [r for r in records if r.split in splits]
    images = Counter(record.split for record in records)
    captions = Counter()
    for record in records:
        captions[record.split] += len(record.captions)
    summary = {split or "(no split)": {"images": images[split], "captions": captions[split]}
               for split in images}
    logger.info("%s: %s", config.dataset, ", ".join(f"{split} {counts['images']} images"
                                                    for split, counts in summary.items()))
    if output_dir is not None:
        cut, message = caption_length_summary(records, config.max_caption_length)
        if cut:  # kept, but cut to data.max_caption_length words when encoded: say so once
            logger.warning("%s (data.max_caption_length)", message)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        text = json.dumps({"dataset": config.dataset, "splits": summary, "train_captions_cut": cut},
                          indent=2, sort_keys=True)
        (Path(output_dir) / "data_summary.json").write_text(text, encoding="utf-8")
    return records


def build_vocabulary(records: list[ImageRecord], min_count: int) -> Vocabulary:
    """Count the words of the training captions only; words seen under ``min_count`` times become <unk>."""
    train = records_of_split(records, "train")
    if not train:
        raise DatasetError("no training images: the vocabulary is counted on the train split")
    return Vocabulary.build((caption for record in train for caption in record.captions), min_count)


def caption_length_summary(records: list[ImageRecord], max_length: int) -> tuple[int, str]:
    """How many training captions are longer than ``max_length`` words (and will be cut).

    Returns:
        The count, and one line such as
        ``"12 of 10000 training captions (0.1%) exceed 20 words and are cut"``.
    """
    lengths = [len(caption) for record in records_of_split(records, "train") for caption in record.captions]
    cut = sum(length > max_length for length in lengths)
    share = 100.0 * cut / len(lengths) if lengths else 0.0
    return cut, (f"{cut} of {len(lengths)} training captions ({share:.1f}%) exceed {max_length} words "
                 "and are cut")
