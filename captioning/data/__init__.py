"""Datasets: readers that turn each source into ``ImageRecord`` lists, and the vocabulary built on them.

``load_records(config)`` reads with the reader ``config.dataset`` names in ``DATASETS`` (each
registers itself beside its code: ``shapes``, ``karpathy``, ``coco``, ``imagefolder``, ``folder``,
``webdataset``).
Torch datasets live in ``captioning.data.datasets``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Collection
from pathlib import Path

from captioning.config import DataConfig
from captioning.data.caption_text import replace_lone_surrogates
from captioning.data.coco import divide_official_val, read_coco
from captioning.data.folder import read_folder
from captioning.data.imagefolder import read_imagefolder
from captioning.data.karpathy import read_karpathy
from captioning.data.readers import (
    DATASETS,
    DatasetReader,
    check_data_paths,
    data_source,
    reader_of,
    register_reader,
)
from captioning.data.record_index import load_indexed
from captioning.data.records import DatasetError, ImageRecord, records_of_split, shuffled_captions
from captioning.data.shapes import generate_shapes, read_shapes
from captioning.data.shapes_hallucination import generate_shapes_hallucination
from captioning.data.shards import read_shards
from captioning.data.vocab import Vocabulary
from captioning.utils.files import atomic_write

__all__ = [
    "DATASETS",
    "DatasetError",
    "DatasetReader",
    "ImageRecord",
    "MAX_CAPTIONS_PER_IMAGE",
    "build_vocabulary",
    "caption_length_summary",
    "check_data_paths",
    "data_source",
    "divide_official_val",
    "generate_shapes",
    "generate_shapes_hallucination",
    "load_records",
    "read_coco",
    "read_folder",
    "read_imagefolder",
    "read_karpathy",
    "read_shapes",
    "read_shards",
    "reader_of",
    "register_reader",
    "split_rule",
    "write_data_summary",
]

logger = logging.getLogger(__name__)


def split_rule(config: DataConfig) -> str | None:
    """How the val and test splits are made when no file gives them (``coco.divide_official_val``,
    ``imagefolder.assign_splits``), for the plan line and ``data_summary.json``; None when the files
    give every split."""
    return reader_of(config).split_rule(config)


def load_records(
    config: DataConfig,
    output_dir: Path | None = None,
    generate: bool = True,
    splits: Collection[str] | None = None,
    write_index: bool | None = None,
) -> list[ImageRecord]:
    """Read the dataset named by ``config.dataset`` (generating Shapes under ``config.root`` if needed).

    Karpathy and COCO datasets are read from their per-split index when it is current
    (``captioning.data.record_index``); a run with an ``output_dir`` writes it.

    Args:
        config: the data configuration.
        output_dir: when given (training and caching runs), ``data_summary.json`` is written there
            (see ``write_data_summary``).
        generate: whether Shapes may be generated under ``config.root``; False when that path came
            from a checkpoint (paths read from a file never choose where the project writes).
        splits: only the records of these splits (all when None).
        write_index: whether the dataset index (Karpathy, COCO) or a reader's own (the webdataset
            reader's shard listings) may be written when it is not current (default: when
            ``output_dir`` is given); it lives under the configured cache folder.
    Returns:
        One record per image, in the reader's order; with ``config.shuffle_captions`` the train split's
        captions permuted across its images (:func:`captioning.data.records.shuffled_captions`).
    Raises:
        DatasetError: an image id outside the 64-bit range results and tensors hold; an image with
            over ``MAX_CAPTIONS_PER_IMAGE`` captions; Shapes data missing where it may not be generated.
        UnknownNameError: ``config.dataset`` names no registered reader (one line listing them).
    """
    reader = reader_of(config)
    reader.check_readable(config, generate)
    writable = output_dir is not None if write_index is None else write_index
    if reader.indexed:
        check_data_paths(config)  # also when the index answers without the reader
        # Cleaned before indexing: the index is UTF-8, which cannot hold a lone surrogate.
        records = load_indexed(
            config,
            lambda data: _check_caption_counts([_clean_text(r) for r in reader.read(data)], config),
            splits,
            writable=writable,
        )
    else:
        records = reader.read_records(config, writable)
        records = records if splits is None else [r for r in records if r.split in splits]
    records = [_clean_text(record) for record in records]
    for record in records:
        if not INT64_MIN <= record.image_id <= INT64_MAX:
            raise DatasetError(
                f"{data_source(config)}: image id {record.image_id} does not fit a 64-bit integer"
            )
    _check_caption_counts(records, config)
    if config.shuffle_captions:
        records = shuffled_captions(records, "train", config.shuffle_captions_seed)
        logger.info(
            "data.shuffle_captions: the train split's captions are permuted across its images (seed %d)",
            config.shuffle_captions_seed,
        )
    if output_dir is not None:
        write_data_summary(records, config, Path(output_dir))
    return records


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Captions one image may hold: published datasets give 5 to 7 (COCO, Flickr); an image with hundreds of
# thousands would make every epoch and every score that image's.
MAX_CAPTIONS_PER_IMAGE = 1000


def _check_caption_counts(records: list[ImageRecord], config: DataConfig) -> list[ImageRecord]:
    """``records``, when no image has over ``MAX_CAPTIONS_PER_IMAGE`` captions (checked before an
    index of them is written)."""
    for record in records:
        if len(record.raw) > MAX_CAPTIONS_PER_IMAGE:
            raise DatasetError(
                f"{data_source(config)}: image id {record.image_id} ({record.path}): {len(record.raw)} "
                f"captions; at most {MAX_CAPTIONS_PER_IMAGE:,} per image (each is a training sample and "
                "a scoring reference)"
            )
    return records


def _clean_text(record: ImageRecord) -> ImageRecord:
    """The record with lone surrogates in its captions replaced (they cannot be written as UTF-8)."""
    raw = tuple(replace_lone_surrogates(text) for text in record.raw)
    captions = tuple(tuple(replace_lone_surrogates(word) for word in caption) for caption in record.captions)
    if raw == record.raw and captions == record.captions:
        return record
    return dataclasses.replace(record, raw=raw, captions=captions)


def write_data_summary(records: list[ImageRecord], config: DataConfig, output_dir: Path) -> Path:
    """``output_dir/data_summary.json``: images and captions per split, and training captions longer
    than ``max_caption_length`` (with a warning saying how many will be cut)."""
    images = Counter(record.split for record in records)
    captions: Counter[str] = Counter()
    for record in records:
        captions[record.split] += len(record.captions)
    summary = {
        split or "(no split)": {"images": images[split], "captions": captions[split]} for split in images
    }
    logger.info(
        "%s: %s",
        config.dataset,
        ", ".join(f"{split} {counts['images']} images" for split, counts in summary.items()),
    )
    cut, message = caption_length_summary(records, config.max_caption_length)
    if cut:  # kept, but cut to data.max_caption_length words when encoded: say so once
        logger.warning("%s (data.max_caption_length)", message)
    rule = split_rule(config)
    text = json.dumps(
        {
            "dataset": config.dataset,
            "splits": summary,
            "train_captions_cut": cut,
            **({"split_rule": rule} if rule else {}),
        },
        indent=2,
        sort_keys=True,
    )
    path = output_dir / "data_summary.json"
    atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
    return path


def build_vocabulary(records: list[ImageRecord], min_count: int) -> Vocabulary:
    """Count the words of the training captions only; words seen under ``min_count`` times become <unk>."""
    train = records_of_split(records, "train")
    if not train:
        raise DatasetError("no training images: the vocabulary is counted on the train split")
    return Vocabulary.build((caption for record in train for caption in record.captions), min_count)


CUT_SHARE_ADVICE = 5.0  # percent of training captions cut from which the summary says which keys to raise


def caption_length_summary(records: list[ImageRecord], max_length: int) -> tuple[int, str]:
    """How many training captions are longer than ``max_length`` words (and will be cut).

    Returns:
        The count, and one line such as
        ``"12 of 10000 training captions (0.1%) exceed 20 words and are cut"``.
    """
    lengths = sorted(
        len(caption) for record in records_of_split(records, "train") for caption in record.captions
    )
    cut = sum(length > max_length for length in lengths)
    share = 100.0 * cut / len(lengths) if lengths else 0.0
    message = (
        f"{cut} of {len(lengths)} training captions ({share:.1f}%) exceed {max_length} words and are cut"
    )
    if share >= CUT_SHARE_ADVICE:  # e.g. characters of Chinese captions: each one counts as a word
        longest = lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))]
        message += (
            f"; 95% of them are at most {longest} tokens: set data.max_caption_length={longest} and "
            f"decode.max_length={longest} to keep them whole (docs/own-data.md)"
        )
    return cut, message
