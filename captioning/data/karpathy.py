"""Reader for Karpathy's split files: dataset_coco.json, dataset_flickr8k.json, dataset_flickr30k.json.

The published schema::

    {"dataset": "coco",
     "images": [{"filepath": "val2014",                 # COCO only
                 "filename": "COCO_val2014_000000391895.jpg",
                 "imgid": 0, "cocoid": 391895,           # cocoid: COCO only
                 "split": "test",                        # train | val | test | restval
                 "sentids": [0, 1, ...],
                 "sentences": [{"tokens": ["a", "man", ...], "raw": "A man ...",
                                "imgid": 0, "sentid": 0}, ...]},
                ...]}

Bad captions: a sentence whose tokens are all blank is left out of the training targets (it
stays a scoring reference), and an image left with no caption at all is dropped (in every
split: it can be neither trained on nor scored). Both are counted and reported, one warning
line per file and reason, naming the first such entry. Malformed entries are errors.

The helpers ``read_json``, ``require_field``, ``image_path_under`` and ``SkipLog`` are shared
with the COCO reader.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from captioning.config import ConfigError, DataConfig, KarpathyDataConfig
from captioning.data.readers import DatasetReader, check_data_paths, own_tokenizer, register_reader
from captioning.data.records import DatasetError, ImageRecord
from captioning.utils.json_files import JsonError, read_json_file

logger = logging.getLogger(__name__)

KARPATHY_SPLITS = ("train", "val", "test", "restval")

_TYPE_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "an object"}


def read_json(path: Path) -> Any:
    """Parse a JSON file, turning every failure into a one-line ``DatasetError`` naming the file."""
    try:
        return read_json_file(path)  # the project's one JSON reader: a regular file, bounded
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except JsonError as error:
        raise DatasetError(str(error)) from None


def require_field(entry: Any, name: str, kind: type, where: str) -> Any:
    """``entry[name]``, checked to be of ``kind`` (integers exclude booleans).

    Raises:
        DatasetError: ``"<where>: missing field 'name'"`` or ``"<where>: field 'name' must be ..."``.
    """
    if not isinstance(entry, dict):
        raise DatasetError(f"{where}: expected an object, got {type(entry).__name__}")
    if name not in entry:
        raise DatasetError(f"{where}: missing field {name!r}")
    value = entry[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DatasetError(f"{where}: field {name!r} must be {_TYPE_NAMES[kind]}, got {value!r:.60}")
    return value


def image_path_under(image_root: Path, relative: str, where: str) -> Path:
    """``image_root / relative``, refusing absolute paths and paths that climb out with ``..``."""
    if "\x00" in relative:  # no file can have such a name; say so rather than "not found"
        raise DatasetError(f"{where}: image path {relative!r} contains a NUL character")
    posix = PurePosixPath(relative.replace("\\", "/"))
    if not relative:
        raise DatasetError(f"{where}: empty image path")
    if posix.is_absolute():
        raise DatasetError(
            f"{where}: image path {relative!r} is absolute; it must be relative to the image root"
        )
    if PureWindowsPath(relative).drive:
        raise DatasetError(
            f"{where}: image path {relative!r} starts with a drive ({PureWindowsPath(relative).drive}); "
            "it must be relative to the image root"
        )
    if ".." in posix.parts:
        raise DatasetError(
            f"{where}: image path {relative!r} must be relative to the image root and must not contain '..'"
        )
    return image_root / posix


class SkipLog:
    """Counts what a reader skipped and reports one warning line per reason."""

    def __init__(self, source: str, log: logging.Logger = logger):
        self.source = source
        self.log = log  # the reader's own logger, so that warnings name the module that skipped
        self.counts: Counter[str] = Counter()
        self.first_entry: dict[str, str] = {}

    def skip(self, reason: str, entry: str) -> None:
        self.counts[reason] += 1
        self.first_entry.setdefault(reason, entry)

    def report(self) -> None:
        for reason, count in self.counts.items():
            self.log.warning(
                "%s: skipped %d %s (first: %s)", self.source, count, reason, self.first_entry[reason]
            )


def read_karpathy(
    split_file: str | Path,
    image_root: str | Path,
    restval_to_train: bool = True,
    tokenizer: Callable[[str], list[str]] | None = None,
) -> list[ImageRecord]:
    """Read a Karpathy split file into one record per image, in file order.

    Args:
        split_file: ``dataset_coco.json``, ``dataset_flickr8k.json``, ``dataset_flickr30k.json``
            or a file in the same schema (e.g. Shapes' ``dataset_shapes.json``).
        image_root: the folder holding ``filepath/filename`` (or ``filename`` when there is no filepath).
        restval_to_train: put ``restval`` images into ``train`` (Karpathy's usual COCO training set).
        tokenizer: when given (``data.tokenizer`` other than ptb), each sentence's tokens are
            ``tokenizer(raw)`` instead of the file's ``tokens``.
    Returns:
        Records with ``image_id`` = ``cocoid`` when present, else ``imgid``; the given tokens,
        lower-cased (or the tokenizer's); the raw sentences unchanged.
    Raises:
        DatasetError: not JSON, wrong structure, a missing or mistyped field, an unknown split,
            duplicate image ids, or an image path that is absolute or contains ``..``.
    """
    split_file, image_root = Path(split_file), Path(image_root)
    source = split_file.name
    data = read_json(split_file)
    if not isinstance(data, dict):
        raise DatasetError(
            f"{source}: expected a JSON object with an 'images' list, got {type(data).__name__}"
        )
    images = require_field(data, "images", list, source)
    skipped = SkipLog(source)
    records: list[ImageRecord] = []
    position_of_id: dict[int, int] = {}
    for position, entry in enumerate(images):
        image_id, where = _image_id(entry, f"{source}: image {position}")
        if image_id in position_of_id:
            raise DatasetError(
                f"{where}: duplicate image id {image_id} (also image {position_of_id[image_id]})"
            )
        position_of_id[image_id] = position
        record = _read_image(entry, image_id, where, image_root, restval_to_train, skipped, tokenizer)
        if record is not None:
            records.append(record)
    skipped.report()
    return records


def _image_id(entry: Any, where: str) -> tuple[int, str]:
    """The image id (cocoid, else imgid) and the entry's name for messages."""
    id_field = "cocoid" if isinstance(entry, dict) and "cocoid" in entry else "imgid"
    image_id = require_field(entry, id_field, int, where)
    return image_id, f"{where} ({id_field} {image_id})"


def _read_image(
    entry: dict,
    image_id: int,
    where: str,
    image_root: Path,
    restval_to_train: bool,
    skipped: SkipLog,
    tokenizer: Callable[[str], list[str]] | None,
) -> ImageRecord | None:
    filename = require_field(entry, "filename", str, where)
    if not filename.strip():
        raise DatasetError(f"{where}: empty field 'filename'")
    filepath = require_field(entry, "filepath", str, where) if "filepath" in entry else ""
    relative = f"{filepath}/{filename}" if filepath else filename
    path = image_path_under(image_root, relative, where)
    split = require_field(entry, "split", str, where)
    if split not in KARPATHY_SPLITS:
        raise DatasetError(f"{where}: unknown split {split!r} (expected {', '.join(KARPATHY_SPLITS)})")
    if split == "restval" and restval_to_train:
        split = "train"
    captions, raws = [], []
    for number, sentence in enumerate(require_field(entry, "sentences", list, where)):
        sentence_where = f"{where} sentence {number}"
        tokens = require_field(sentence, "tokens", list, sentence_where)
        raw = require_field(sentence, "raw", str, sentence_where)
        if not all(isinstance(token, str) for token in tokens):
            raise DatasetError(f"{sentence_where}: field 'tokens' must hold strings only")
        if tokenizer is not None:
            tokens = tokenizer(raw)
        words = tuple(token.strip().lower() for token in tokens if token.strip())
        raws.append(raw)  # a reference for scoring even when it has no words, as in the official files
        if not words:
            skipped.skip("empty captions", sentence_where)
            continue
        captions.append(words)
    if not captions:
        skipped.skip("images with no caption", where)
        return None
    return ImageRecord(image_id=image_id, path=path, split=split, captions=tuple(captions), raw=tuple(raws))


@register_reader("karpathy", KarpathyDataConfig)
class KarpathyReader(DatasetReader):
    """Karpathy's split file ``data.split_file`` (dataset_flickr8k.json, ...), images under ``data.root``;
    ``restval`` joins ``train`` unless ``data.restval_to_train`` is false (``KarpathyDataConfig``)."""

    indexed = True

    def read(self, config: DataConfig) -> list[ImageRecord]:
        assert isinstance(config, KarpathyDataConfig)  # data.dataset karpathy is read into its own class
        if config.split_file is None:
            raise ConfigError(
                "data.split_file is required for data.dataset=karpathy (e.g. dataset_flickr8k.json)"
            )
        check_data_paths(config)
        return read_karpathy(config.split_file, config.root, config.restval_to_train, own_tokenizer(config))

    def source_files(self, config: DataConfig) -> list[Path]:
        assert isinstance(config, KarpathyDataConfig)
        return [Path(config.split_file)] if config.split_file else []
