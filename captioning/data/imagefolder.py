"""Reader for your own images: a folder with a captions file, in Hugging Face's ``imagefolder`` layout.

Either one metadata file at the root, or one per split sub-folder::

    my_data/metadata.jsonl              my_data/train/metadata.csv
    my_data/a.jpg                       my_data/train/a.jpg
    my_data/b.jpg                       my_data/val/metadata.csv (or validation/)
                                        my_data/test/metadata.csv

A metadata file is ``metadata.jsonl`` (one JSON object a line) or ``metadata.csv`` (a header line,
then one row a line), with one row per image or per caption:

- ``file_name``: the image, relative to the metadata file's folder (``photos/a.jpg`` is fine, ``..``
  and absolute paths are refused);
- ``caption`` or ``text``: a caption, or in JSON lines a list of captions;
- ``split`` (optional): ``train``, ``val`` (or ``validation``) or ``test``; in a split sub-folder it
  must name that folder's split;
- ``image_id`` (optional): an integer; rows of the same image must give the same one.

Other columns are ignored. ``split`` is given on every row of a file or on none, ``image_id`` on
every row of the dataset or on none. Without
``image_id``, images are numbered 1, 2, ... in reading order; without any split, :data:`SPLIT_RULE`
makes the val and test splits.

Every bad row is refused before any work with one line naming the metadata file and its line: a
missing image file, an empty caption (or one with no token), an unknown split, an image given two
splits or two ids, two images given one id.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from captioning.config import DataConfig
from captioning.data.karpathy import image_path_under
from captioning.data.readers import DatasetReader, check_data_paths, register_reader
from captioning.data.records import DatasetError, ImageRecord
from captioning.data.tokenizers import tokenize, tokenizer_for
from captioning.utils.files import not_a_regular_file, path_kind
from captioning.utils.json_files import JsonError, parse_json

METADATA_NAMES = ("metadata.jsonl", "metadata.csv")
SPLIT_NAMES = {"train": "train", "val": "val", "validation": "val", "test": "test"}
SPLIT_RULE = (
    "no split given: in reading order, the 9th image of every 10 -> val, the 10th -> test, the rest -> train"
)


@dataclass
class _Row:
    """One metadata row, its values checked."""

    where: str  # "<metadata file>: line <n>"
    file_name: str
    captions: list[str]
    split: str | None
    image_id: int | None


@dataclass
class _Image:
    """The rows of one image file, merged."""

    path: Path
    where: str  # the first row naming it
    split: str | None
    image_id: int | None
    raw: list[str] = field(default_factory=list)
    captions: list[tuple[str, ...]] = field(default_factory=list)


def metadata_files(root: str | Path) -> list[tuple[Path, str | None]]:
    """The metadata files of an image folder, each with the split its folder gives (None at the root).

    Raises:
        DatasetError: no metadata file, both ``metadata.jsonl`` and ``metadata.csv`` in one folder, or
            metadata both at the root and in split sub-folders.
    """
    root = Path(root)
    own = _metadata_in(root)
    folders: list[tuple[Path, str | None]] = [
        (path, SPLIT_NAMES[name])
        for name in SPLIT_NAMES
        if (root / name).is_dir() and (path := _metadata_in(root / name)) is not None
    ]
    if own is not None and folders:
        raise DatasetError(
            f"{own}: metadata at the root and in split sub-folders ({folders[0][0]}); keep one layout"
        )
    if own is None and not folders:
        raise DatasetError(
            f"{root}: no {' or '.join(METADATA_NAMES)} there or in a split sub-folder "
            f"({', '.join(name + '/' for name in SPLIT_NAMES)})"
        )
    return [(own, None)] if own is not None else folders


def read_imagefolder(root: str | Path, tokenizer: Callable[[str], list[str]] = tokenize) -> list[ImageRecord]:
    """Read an image folder's metadata into one record per image (see the module docstring).

    Args:
        root: the folder holding ``metadata.jsonl``/``metadata.csv``, or the split sub-folders.
        tokenizer: splits each caption into the training tokens (``data.tokenizer``).
    Returns:
        Records in reading order (split folders in the order train, val, validation, test), with
        the raw captions as written and their tokens.
    Raises:
        DatasetError: one line naming the metadata file and line of the first bad row.
    """
    images: dict[Path, _Image] = {}
    path_of_id: dict[int, tuple[Path, str]] = {}
    with_id: list[bool] = []  # across files: numbering images would clash with given ids
    files = metadata_files(root)
    for metadata, folder_split in files:
        with_split: list[bool] = []
        for row in _rows(metadata):
            if folder_split is not None and row.split not in (None, folder_split):
                raise DatasetError(f"{row.where}: split {row.split!r} in the {folder_split} folder")
            _check_optional(with_split, row.split is not None, "split", row.where)
            _check_optional(with_id, row.image_id is not None, "image_id", row.where)
            split = row.split or folder_split
            path = image_path_under(metadata.parent, row.file_name, row.where)
            image = images.get(path)
            if image is None:
                image = images[path] = _Image(path, row.where, split, row.image_id)
                _check_image_file(path, row)
            elif image.split != split:
                raise DatasetError(
                    f"{row.where}: {row.file_name!r} in split {split!r}, but {image.split!r} at {image.where}"
                )
            elif image.image_id != row.image_id:
                raise DatasetError(
                    f"{row.where}: {row.file_name!r} has image_id {row.image_id}, but "
                    f"{image.image_id} at {image.where}"
                )
            if row.image_id is not None:
                other, other_where = path_of_id.setdefault(row.image_id, (path, row.where))
                if other != path:
                    raise DatasetError(
                        f"{row.where}: image_id {row.image_id} names {row.file_name!r}, but "
                        f"{other.name!r} at {other_where}"
                    )
            for caption in row.captions:
                tokens = tokenizer(caption)
                if not tokens:
                    raise DatasetError(f"{row.where}: caption {caption!r:.60} has no words")
                image.raw.append(caption)
                image.captions.append(tuple(tokens))
    if not images:
        raise DatasetError(
            f"{', '.join(str(path) for path, _ in files)}: no rows (one per image or per caption)"
        )
    records = [
        ImageRecord(
            image_id=number if image.image_id is None else image.image_id,
            path=image.path,
            split=image.split or "",
            captions=tuple(image.captions),
            raw=tuple(image.raw),
        )
        for number, image in enumerate(images.values(), start=1)
    ]
    splits_given = files[0][1] is not None or any(record.split for record in records)
    return records if splits_given else assign_splits(records)


def assign_splits(records: list[ImageRecord]) -> list[ImageRecord]:
    """:data:`SPLIT_RULE`: records in their order, the 9th of every 10 validating and the 10th testing.

    Appending images never moves those before them to another split.
    """
    splits = ["train"] * 8 + ["val", "test"]
    return [replace(record, split=splits[position % 10]) for position, record in enumerate(records)]


def split_rule(root: str | Path) -> str | None:
    """:data:`SPLIT_RULE` when the folder's metadata gives no split (for the plan line and
    ``data_summary.json``); None when it gives them."""
    files = metadata_files(root)
    if files[0][1] is not None:
        return None
    return None if any(row.split is not None for row in _rows(files[0][0])) else SPLIT_RULE


def _metadata_in(folder: Path) -> Path | None:
    found = [folder / name for name in METADATA_NAMES if path_kind(folder / name) is not None]
    if len(found) > 1:
        raise DatasetError(f"{folder}: both {' and '.join(METADATA_NAMES)}; keep one")
    return found[0] if found else None


def _check_optional(seen: list[bool], given: bool, name: str, where: str) -> None:
    """A column given on every row or on none: ``seen`` holds the first row's answer."""
    if not seen:
        seen.append(given)
    elif seen[0] != given:
        state = "no" if not given else "a"
        raise DatasetError(
            f"{where}: {state} {name!r}, unlike the rows before it (give it on every row or on none)"
        )


def _check_image_file(path: Path, row: _Row) -> None:
    kind = path_kind(path)
    if kind is None:
        raise DatasetError(f"{row.where}: image file {row.file_name!r} not found ({path})")
    if kind != "a file":
        raise DatasetError(f"{row.where}: image file {row.file_name!r} is {kind}, not a file")


def _rows(metadata: Path) -> Iterator[_Row]:
    kind = not_a_regular_file(metadata)
    if kind is not None:
        raise DatasetError(f"{metadata}: {kind}")
    read = _jsonl_entries if metadata.suffix == ".jsonl" else _csv_entries
    try:
        with open(metadata, encoding="utf-8-sig", newline="") as file:
            for line, entry in read(file, metadata):
                yield _row(entry, f"{metadata}: line {line}", metadata.suffix == ".jsonl")
    except UnicodeDecodeError:
        raise DatasetError(f"{metadata}: not UTF-8 text") from None
    except OSError as error:
        raise DatasetError(f"{metadata}: cannot read ({error.strerror})") from None


def _jsonl_entries(file: Any, metadata: Path) -> Iterator[tuple[int, Any]]:
    for line, text in enumerate(file, start=1):
        if not text.strip():
            continue
        try:
            yield line, parse_json(text)
        except JsonError as error:
            raise DatasetError(f"{metadata}: line {line}: {error}") from None


def _csv_entries(file: Any, metadata: Path) -> Iterator[tuple[int, Any]]:
    reader = csv.DictReader(file, strict=True)
    try:
        names = list(reader.fieldnames or ())  # reads the header line
        header = len(names)
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:  # DictReader would keep only the last column of each name, silently
            raise DatasetError(
                f"{metadata}: line 1: the header names column {repeated[0]!r} "
                f"{names.count(repeated[0])} times; each column once"
            )
        for entry in reader:
            if None in entry:
                raise DatasetError(
                    f"{metadata}: line {reader.line_num}: more fields than the header's {header}"
                )
            if None in entry.values():
                raise DatasetError(
                    f"{metadata}: line {reader.line_num}: fewer fields than the header's {header}"
                )
            yield reader.line_num, {key: value for key, value in entry.items() if value != ""}
    except csv.Error as error:
        raise DatasetError(f"{metadata}: line {reader.line_num}: not valid CSV ({error})") from None


def _row(entry: Any, where: str, lists: bool) -> _Row:
    """One row's values, checked; ``lists``: a caption may be a list (JSON lines)."""
    if not isinstance(entry, dict):
        raise DatasetError(f"{where}: expected an object, got {type(entry).__name__}")
    file_name = entry.get("file_name")
    if not isinstance(file_name, str) or not file_name.strip():
        raise DatasetError(
            f"{where}: "
            + (
                "missing field 'file_name'"
                if file_name is None
                else f"field 'file_name' must be a non-empty string, got {file_name!r:.60}"
            )
        )
    if "caption" in entry and "text" in entry:
        raise DatasetError(f"{where}: both 'caption' and 'text'; give one")
    name = "caption" if "caption" in entry else "text"
    captions = entry.get(name)
    if captions is None:
        raise DatasetError(f"{where}: missing field 'caption' (or 'text')")
    if isinstance(captions, str) or not lists:
        captions = [captions]
    if not isinstance(captions, list) or not captions or not all(isinstance(c, str) for c in captions):
        raise DatasetError(
            f"{where}: field {name!r} must be a string or a non-empty list of strings, got {captions!r:.60}"
        )
    if any(not caption.strip() for caption in captions):
        raise DatasetError(f"{where}: empty caption")
    split = entry.get("split")
    if split is not None and split not in SPLIT_NAMES:
        raise DatasetError(f"{where}: unknown split {split!r:.40} (expected {', '.join(SPLIT_NAMES)})")
    return _Row(
        where, file_name, captions, None if split is None else SPLIT_NAMES[split], _image_id(entry, where)
    )


def _image_id(entry: dict, where: str) -> int | None:
    value = entry.get("image_id")
    if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        value = int(value)  # a CSV cell: "42", "-5" (never "--5" or "4_2", which int() would read)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise DatasetError(f"{where}: field 'image_id' must be an integer, got {value!r:.60}")
    return value


@register_reader("imagefolder")
class ImageFolderReader(DatasetReader):
    """Your own images and captions under ``data.root`` (``metadata.jsonl`` or ``.csv``), tokenized with
    ``data.tokenizer``; without splits, :data:`SPLIT_RULE` makes val and test."""

    def read(self, config: DataConfig) -> list[ImageRecord]:
        check_data_paths(config)
        return read_imagefolder(config.root, tokenizer_for(config.tokenizer))

    def split_rule(self, config: DataConfig) -> str | None:
        return split_rule(config.root)
