"""A compact per-split index of a Karpathy or COCO caption dataset: a start reads only what it needs.

Parsing ``dataset_coco.json`` whole takes seconds and gigabytes per process, and the official COCO
captions are tokenized anew at every start. A training or caching run (``load_records`` with an
output folder) writes, under ``<data.cache_dir>/records/`` (default ``<data.root>/features/records/``)::

    <dataset>-<key hash>/<split>.npz   image ids, paths relative to the image root, token ids, raw captions
    <dataset>-<key hash>/meta.json     the key, the splits, the reader's warnings (written last)

The key holds the size and blake2b hash of every source file, the reader options, and a hash of
the code that reads and tokenizes, so a changed source file or reader makes a new index; an
unchanged one is loaded split by split, without parsing or tokenizing. Every file is written
atomically. Tools that take their configuration from a checkpoint only read an index, never write one.
"""

from __future__ import annotations

import array
import hashlib
import inspect
import json
import logging
import zipfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np

from captioning.config import DataConfig
from captioning.data import coco, karpathy
from captioning.data import records as records_module
from captioning.data.readers import reader_of
from captioning.data.records import ImageRecord
from captioning.utils.files import atomic_write, not_a_regular_file
from captioning.utils.json_files import read_json_file

FORMAT_VERSION = 1
_CODE = (karpathy, coco, records_module)  # modules whose code decides what an index holds

logger = logging.getLogger(__name__)


def records_dir(config: DataConfig) -> Path:
    """Where the indexes of this configuration's datasets live (``data.cache_dir`` or ``data.root``)."""
    return (Path(config.cache_dir) if config.cache_dir else Path(config.root) / "features") / "records"


def _file_hash(path: Path) -> list:
    digest = hashlib.blake2b(digest_size=16)
    kind = not_a_regular_file(path)
    if kind is not None:  # opening a FIFO would wait forever: the reader names it instead
        raise OSError(f"{path}: {kind}")
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return [path.name, path.stat().st_size, digest.hexdigest()]


def _code_hash() -> str:
    from captioning.data import tokenizers as text  # the tokenizer of the COCO reader

    digest = hashlib.blake2b(digest_size=16)
    for module in (*_CODE, text):
        digest.update(Path(inspect.getfile(module)).read_bytes())
    return digest.hexdigest()


def _pack_text(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """All ``strings`` as one UTF-8 array and their end offsets in characters."""
    ends = np.cumsum([len(s) for s in strings], dtype=np.int64)
    return np.frombuffer("".join(strings).encode("utf-8"), dtype=np.uint8), ends


def _unpack_text(blob: np.ndarray, ends: np.ndarray) -> list[str]:
    text = blob.tobytes().decode("utf-8")
    starts = np.concatenate([[0], ends[:-1]]).tolist()
    return [text[a:b] for a, b in zip(starts, ends.tolist(), strict=True)]


def _pack_split(records: list[tuple[int, ImageRecord]], image_root: Path) -> dict[str, np.ndarray]:
    """Arrays of one split; ``records`` are (position in the reader's order, record)."""
    word_ids: dict[str, int] = {}
    tokens = array.array("i")  # int32, not a list of int objects: 600k captions on COCO
    caption_ends: list[int] = []
    captions_per_image: list[int] = []
    raws: list[str] = []
    raws_per_image: list[int] = []
    for _, record in records:
        for caption in record.captions:
            tokens.extend(word_ids.setdefault(word, len(word_ids)) for word in caption)
            caption_ends.append(len(tokens))
        captions_per_image.append(len(record.captions))
        raws.extend(record.raw)
        raws_per_image.append(len(record.raw))
    words_blob, word_ends = _pack_text(list(word_ids))
    raw_blob, raw_ends = _pack_text(raws)
    paths_blob, path_ends = _pack_text(
        [record.path.relative_to(image_root).as_posix() for _, record in records]
    )
    return {
        "positions": np.array([p for p, _ in records], dtype=np.int64),
        "image_ids": np.array([r.image_id for _, r in records], dtype=np.int64),
        "paths": paths_blob,
        "path_ends": path_ends,
        "words": words_blob,
        "word_ends": word_ends,
        "tokens": np.frombuffer(tokens, dtype=np.int32),
        "caption_ends": np.array(caption_ends, dtype=np.int64),
        "captions_per_image": np.array(captions_per_image, dtype=np.int64),
        "raw": raw_blob,
        "raw_ends": raw_ends,
        "raws_per_image": np.array(raws_per_image, dtype=np.int64),
    }


def _unpack_split(arrays: Any, split: str, image_root: Path) -> list[tuple[int, ImageRecord]]:
    words = _unpack_text(arrays["words"], arrays["word_ends"])
    token_words = [words[t] for t in arrays["tokens"].tolist()]
    caption_ends = arrays["caption_ends"].tolist()
    captions = [tuple(token_words[a:b]) for a, b in zip([0, *caption_ends[:-1]], caption_ends, strict=True)]
    raws = _unpack_text(arrays["raw"], arrays["raw_ends"])
    caption_bounds = np.cumsum(np.concatenate([[0], arrays["captions_per_image"]])).tolist()
    raw_bounds = np.cumsum(np.concatenate([[0], arrays["raws_per_image"]])).tolist()
    paths = _unpack_text(arrays["paths"], arrays["path_ends"])
    return [
        (
            position,
            ImageRecord(
                image_id=image_id,
                path=image_root / path,
                split=split,
                captions=tuple(captions[caption_bounds[i] : caption_bounds[i + 1]]),
                raw=tuple(raws[raw_bounds[i] : raw_bounds[i + 1]]),
            ),
        )
        for i, (position, image_id, path) in enumerate(
            zip(arrays["positions"].tolist(), arrays["image_ids"].tolist(), paths, strict=True)
        )
    ]


class _Remember(logging.Handler):
    """Keeps the reader's warnings, so that a start from the index repeats them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[list] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append([record.name, record.levelno, record.getMessage()])
        # Being a handler, this one would keep logging's last resort (stderr) from printing the
        # warning when no other handler is configured: print it as logging would have.
        logger_: logging.Logger | None = logging.getLogger(record.name)
        while logger_ is not None:
            if any(handler is not self for handler in logger_.handlers):
                return
            logger_ = logger_.parent if logger_.propagate else None
        if logging.lastResort is not None and record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)


def _read_meta(folder: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    if not_a_regular_file(folder / "meta.json") is not None:
        return None  # not an index this code wrote: read the source files again
    try:
        meta = read_json_file(folder / "meta.json")
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("key") == key else None


def load_indexed(
    config: DataConfig,
    read: Callable[[DataConfig], list[ImageRecord]],
    splits: Collection[str] | None,
    writable: bool,
) -> list[ImageRecord]:
    """The records of ``splits`` (all when None), from the index when it is current, else from ``read``.

    Args:
        config: the data configuration of an ``indexed`` reader (karpathy, coco).
        read: the reader, run when there is no current index.
        splits: the splits wanted; records keep the reader's order.
        writable: write the index after reading the source (training and caching runs).
    """
    reader = reader_of(config)
    try:
        key = {
            "format": FORMAT_VERSION,
            "dataset": config.dataset,
            "options": reader.index_options(config),  # the reader's own (Karpathy's restval_to_train)
            "tokenizer": config.tokenizer,
            "sources": [_file_hash(path) for path in reader.source_files(config)],
            "code": _code_hash(),
        }
    except OSError:
        return _select(read(config), splits)  # the reader names the missing or unreadable file
    folder = (
        records_dir(config) / f"{config.dataset}-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]}"
    )
    root = Path(config.root)
    meta = _read_meta(folder, key)
    if meta is not None:
        try:
            found = []
            for split in meta["splits"]:
                if splits is None or split in splits:
                    with np.load(folder / f"{split}.npz") as arrays:
                        found.extend(_unpack_split(arrays, split, root))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            logger.warning("%s: unreadable dataset index (%s); reading the source files again", folder, error)
        else:
            for name, level, message in meta["warnings"]:
                logging.getLogger(name).log(level, message)
            return [record for _, record in sorted(found, key=lambda item: item[0])]
    remember = _Remember()
    data_logger = logging.getLogger("captioning.data")
    data_logger.addHandler(remember)
    try:
        records = read(config)
    finally:
        data_logger.removeHandler(remember)
    # Ids beyond 64 bits cannot be indexed; load_records refuses them, naming the source file.
    if writable and all(-(2**63) <= record.image_id < 2**63 for record in records):
        # never through a link under the folder the user named (data.cache_dir, else data.root)
        _write(folder, key, records, root, remember.lines, Path(config.cache_dir or config.root))
    return _select(records, splits)


def _write(
    folder: Path, key: dict[str, Any], records: list[ImageRecord], root: Path, warnings: list, under: Path
) -> None:
    by_split: dict[str, list[tuple[int, ImageRecord]]] = {}
    for position, record in enumerate(records):
        by_split.setdefault(record.split, []).append((position, record))
    try:
        for split, items in by_split.items():
            arrays = _pack_split(items, root)

            def write(path: Path, arrays: dict[str, np.ndarray] = arrays) -> None:
                with open(path, "wb") as handle:
                    np.savez(handle, allow_pickle=False, **arrays)

            atomic_write(folder / f"{split}.npz", write, under=under)
        meta = json.dumps({"key": key, "splits": list(by_split), "warnings": warnings})
        atomic_write(folder / "meta.json", lambda path: path.write_text(meta, encoding="utf-8"), under=under)
    except (
        OSError,
        ValueError,
    ) as error:  # a read-only data root: the run goes on, the next start reads again
        logger.warning("cannot write the dataset index in %s (%s)", folder, str(error).splitlines()[0])


def _select(records: list[ImageRecord], splits: Collection[str] | None) -> list[ImageRecord]:
    return records if splits is None else [record for record in records if record.split in splits]
