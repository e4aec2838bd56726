"""Reader for WebDataset tar shards, in the layout ``img2dataset`` writes (``data.dataset: webdataset``).

``data.root`` is a folder of ``.tar`` shards (all of them, in name order) or a brace pattern of
shard files (``shards/{00000..00127}.tar``, expanded as the webdataset library expands it, in its
order)::

    shards/00000.tar           000000000.jpg  000000000.txt  000000000.json
                               000000001.jpg  000000001.txt  000000001.json  ...
    shards/00000.parquet       (img2dataset's files beside the shards: ignored)
    shards/00000_stats.json
    shards/splits.json         (optional: the shards of each split)

A sample is the consecutive files of a shard sharing a key, the name up to its first dot
(``__key__``, the webdataset library's rule); its image is the first of ``jpg``, ``jpeg``, ``png``
and ``webp`` it has, its captions are ``captions`` (a list) of its ``json`` if given, else its
``txt``, else ``caption`` of its ``json``. Other files are ignored.

Splits: ``splits.json`` in the folder of the (first) shard maps ``train``, ``val`` (or
``validation``) and ``test`` to lists of shard names (relative to that folder; brace patterns
allowed), and every shard ``data.root`` names must be in one of them (shards it lists that
``data.root`` does not name are ignored). Without it, the image-folder reader's rule makes the
splits (:data:`captioning.data.imagefolder.SPLIT_RULE`), in reading order.

Image ids: the keys' numbers when every key is a decimal number and no two are equal (img2dataset's
keys, ``000010042`` -> 10042); else 1, 2, ... in reading order.

Each record's image is ``<shard>#<member>`` (``shards/00000.tar#000000042.jpg``), which
``load_image`` reads from the shard with one seek (``captioning.data.tar_members``); the feature
cache keys its rows by that name and the member's bytes. Shards are listed from their headers (the
images' bytes are not read here), and a training or caching run keeps each listing under the cache
folder, so that later starts read no tar header while the shard is unchanged
(``captioning.data.shard_listings``).

A bad sample (no image, no caption, a caption with no words, unreadable ``txt`` or ``json``, a key
given twice) or a truncated shard stops the reading with one line naming the shard and the key; with
``data.skip_bad_images`` bad samples and the cut-off end of a truncated shard are skipped and counted
(one warning line per reason). Images that cannot be decoded are found when read, as for files.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from captioning.config import ConfigError, DataConfig
from captioning.data import tar_members
from captioning.data.imagefolder import SPLIT_NAMES, SPLIT_RULE, assign_splits
from captioning.data.karpathy import SkipLog, read_json
from captioning.data.readers import DatasetReader, check_data_paths, register_reader
from captioning.data.records import DatasetError, ImageRecord
from captioning.data.shard_listings import FOLDER as LISTINGS_FOLDER
from captioning.data.shard_listings import Listings
from captioning.data.tokenizers import tokenize, tokenizer_for
from captioning.utils.extras import extra_message
from captioning.utils.json_files import JsonError, parse_json

logger = logging.getLogger(__name__)

EXTRA = "webdataset"  # setup.cfg's extra that installs the library
SPLITS_FILE = "splits.json"
IMAGE_KEYS = tar_members.IMAGE_EXTENSIONS  # jpg, jpeg, png, webp: the first a sample has is its image
_META = re.compile(r"__[^/]*__($|/)")  # webdataset's metadata files (__key__, __index__): skipped as it does
_INT64_MAX = 2**63 - 1


def _library() -> tuple[Callable[[str], tuple[str | None, str | None]], Callable[[str], Iterator[str]]]:
    """webdataset's key rule (``base_plus_ext``) and its shard pattern expansion (``braceexpand``).

    Raises:
        ConfigError: the library is not installed; the line names the extra that installs it.
    """
    try:
        import braceexpand
        from webdataset.tariterators import base_plus_ext
    except ImportError:
        raise ConfigError(extra_message(EXTRA, "data.dataset=webdataset")) from None
    return base_plus_ext, braceexpand.braceexpand


MAX_SHARDS = 1_000_000  # names one pattern may expand to (LAION-5B's largest part has 231,350 shards)
_RANGE = re.compile(r"^(-?\d+|[a-zA-Z])\.\.(-?\d+|[a-zA-Z])(?:\.\.(-?\d+))?$")


def _scan(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """Each unescaped character of ``text`` from ``start``: (position, character, brace depth after
    it); a backslash's character is skipped with it."""
    depth, position = 0, start
    while position < len(text):
        char = text[position]
        if char == "\\":
            position += 2
            continue
        depth += (char == "{") - (char == "}")
        yield position, char, depth
        position += 1


def _group_end(pattern: str, start: int) -> int:
    """The index of the brace closing the one at ``start``; -1 when it is not closed."""
    return next(
        (position for position, char, depth in _scan(pattern, start) if char == "}" and not depth), -1
    )


def _top_level_commas(body: str) -> list[str]:
    """``body`` split at its commas outside braces."""
    cuts = [position for position, char, depth in _scan(body) if char == "," and not depth]
    return [body[begin + 1 : end] for begin, end in zip([-1, *cuts], [*cuts, len(body)], strict=True)]


def expansion_size(pattern: str) -> int:
    """How many names a brace pattern expands to, counted without expanding it (``{a..b}`` ranges of
    numbers or letters with an optional step, ``{x,y}`` alternatives, nested); a brace that is not a
    group counts as itself."""
    total, position = 1, 0
    while position < len(pattern):
        char = pattern[position]
        if char == "\\":
            position += 2
            continue
        if char != "{":
            position += 1
            continue
        end = _group_end(pattern, position)
        if end < 0:
            return total  # unbalanced: the library says so
        body = pattern[position + 1 : end]
        bounds = _RANGE.match(body)
        if bounds is not None:
            first, last, step = bounds.groups()
            if first.lstrip("-").isdigit() and last.lstrip("-").isdigit():
                if max(len(first), len(last)) > 18:
                    return MAX_SHARDS + 1
                span = abs(int(last) - int(first))
            else:
                span = abs(ord(last) - ord(first))
            size = span // max(1, abs(int(step))) + 1 if step and len(step) <= 18 else span + 1
        else:
            alternatives = _top_level_commas(body)
            size = sum(expansion_size(part) for part in alternatives) if len(alternatives) > 1 else 1
        total *= size
        if total > MAX_SHARDS:
            return total
        position = end + 1
    return total


def _expand(pattern: str, where: str) -> list[str]:
    _, expand = _library()
    size = expansion_size(pattern)
    if size > MAX_SHARDS:  # the library builds every name in memory before giving the first
        raise ConfigError(
            f"{pattern:.200}: {where}: names {size} shards or more, beyond the {MAX_SHARDS} one pattern "
            "may name (no bigger set of shards is published); check the pattern's ranges"
        )
    try:
        return list(expand(pattern))
    except Exception as error:  # braceexpand's UnbalancedBracesError
        raise ConfigError(f"{pattern}: {where}: not a brace pattern ({error})") from None


def shard_files(root: str | Path) -> list[Path]:
    """The shards ``data.root`` names: a folder's ``.tar`` files in name order, or a brace pattern's
    files in its order (a single ``.tar`` file is a pattern of one).

    Raises:
        ConfigError: nothing at ``root`` and no brace in it, or a pattern that does not parse.
        DatasetError: a folder without shards, a shard the pattern names missing, or named twice.
    """
    text = os.fspath(root)
    folder = Path(text)
    if folder.is_dir():
        shards = sorted(
            (path for path in folder.iterdir() if path.suffix == ".tar" and not path.name.startswith(".")),
            key=lambda path: path.name,
        )
        if not shards:
            raise DatasetError(f"{folder}: no .tar shards in this folder")
        return shards
    if "://" in text or text.startswith("pipe:"):
        raise ConfigError(f"{text}: data.root: shards are read from local files; download them first")
    if "{" not in text and not folder.exists():
        where = f" (relative paths start from {Path.cwd()})" if not folder.is_absolute() else ""
        raise ConfigError(
            f"{text}: data.root: no such folder or shard{where}; set data.root=... to the folder of "
            "the shards or a pattern such as shards/{00000..00127}.tar"
        )
    names = _expand(text, "data.root")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DatasetError(f"{text}: data.root names the shard {name} twice")
        seen.add(name)
    shards = [Path(name) for name in names]
    missing = [shard for shard in shards if not shard.exists()]
    if missing:
        more = (
            f" ({len(missing)} of the {len(shards)} shards of {text} are missing)" if len(shards) > 1 else ""
        )
        if len(missing) == len(shards):  # none there: data.root is wrong, or relative to another folder
            where = f"relative paths start from {Path.cwd()}; " if not missing[0].is_absolute() else ""
            more += f"; data.root: {where}set data.root=... to where the shards are"
        raise DatasetError(f"{missing[0]}: shard not found{more}")
    return shards


def splits_file(shards: list[Path]) -> Path:
    """Where the shard list of each split is looked for: ``splits.json`` beside the first shard."""
    return shards[0].parent / SPLITS_FILE


def read_shard_splits(shards: list[Path]) -> dict[Path, str] | None:
    """Each shard's split, from ``splits.json`` beside the first shard; None when there is none.

    Raises:
        DatasetError: one line naming ``splits.json``: not an object of lists of shard names, an
            unknown split, a shard in two splits; or naming a shard in no split.
    """
    path = splits_file(shards)
    if not path.exists():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or not data:
        raise DatasetError(f"{path}: expected an object mapping train, val and test to lists of shards")
    split_of: dict[str, tuple[str, str]] = {}  # absolute shard path -> (split, entry)
    for name, entries in data.items():
        if name not in SPLIT_NAMES:
            raise DatasetError(f"{path}: unknown split {name!r:.40} (expected {', '.join(SPLIT_NAMES)})")
        entries = [entries] if isinstance(entries, str) else entries
        if not isinstance(entries, list) or not all(isinstance(entry, str) and entry for entry in entries):
            raise DatasetError(f"{path}: split {name!r} must be a list of shard names, got {entries!r:.60}")
        for entry in entries:
            for listed in _expand(entry, f"{path}: split {name!r}"):
                key = os.path.normpath(os.path.abspath(path.parent / listed))
                split, first = split_of.setdefault(key, (SPLIT_NAMES[name], name))
                if split != SPLIT_NAMES[name]:
                    raise DatasetError(f"{path}: shard {listed} is in split {first!r} and in {name!r}")
    splits: dict[Path, str] = {}
    for shard in shards:
        found = split_of.get(os.path.normpath(os.path.abspath(shard)))
        if found is None:
            raise DatasetError(
                f"{shard}: in no split of {path} (it lists {', '.join(data)}); add it to one, or remove "
                f"{SPLITS_FILE} to split by the fixed rule"
            )
        splits[shard] = found[0]
    return splits


@dataclass
class _Sample:
    """The files of one key in a shard, and what is wrong with them (None when nothing is)."""

    key: str
    files: dict[str, tar_members.Member] = field(default_factory=dict)
    problem: tuple[str, str] | None = None  # (reason counted when skipped, what the error line says)


def _samples(
    scan: tar_members.ShardScan, key_of: Callable[[str], tuple[str | None, str | None]]
) -> Iterator[_Sample]:
    """The samples of a shard, grouped as webdataset's ``group_by_keys`` groups them: consecutive
    files of one key."""
    sample: _Sample | None = None
    keys: set[str] = set()
    for member in scan.members:
        if _META.match(member.name) or (member.name.startswith("__") and member.name.endswith("__")):
            continue
        key, suffix = key_of(member.name)
        if key is None or suffix is None:
            continue
        suffix = suffix.lower()
        if sample is None or key != sample.key:
            if sample is not None:
                yield sample
            sample = _Sample(key)
            if key in keys:
                sample.problem = ("keys given twice", "key given twice, not in consecutive files")
            keys.add(key)
        unsafe = tar_members.unsafe_name(member.name)
        if unsafe is not None and sample.problem is None:
            sample.problem = ("members named outside their shard", f"member {member.name!r}: {unsafe}")
        if suffix in sample.files and sample.problem is None:
            sample.problem = (
                "samples with two files of one kind",
                f"two .{suffix} files ({sample.files[suffix].name!r} and {member.name!r})",
            )
        sample.files.setdefault(suffix, member)
    if sample is not None:
        yield sample


def _text(member: tar_members.Member, what: str, handle: BinaryIO) -> str:
    try:
        return tar_members.read_member(member, handle).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _Bad("unreadable captions", f"{what} is not UTF-8 text") from None
    except tar_members.MemberError as error:
        raise _Bad("unreadable captions", f"{what}: {error}") from None


class _Bad(Exception):
    """A sample's problem: (reason counted when skipped, what the error line says)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def _captions(files: dict[str, tar_members.Member], handle: BinaryIO) -> list[str]:
    """The sample's captions as written: json ``captions``, else txt, else json ``caption``."""
    meta: Any = None
    if "json" in files:
        text = _text(files["json"], "its json", handle)
        try:
            meta = parse_json(text)
        except JsonError as error:
            raise _Bad("unreadable captions", f"its json: {error}") from None
        if not isinstance(meta, dict):
            raise _Bad("unreadable captions", f"its json must be an object, got {type(meta).__name__}")
        captions = meta.get("captions")
        if captions is not None:
            if (
                not isinstance(captions, list)
                or not captions
                or not all(isinstance(caption, str) for caption in captions)
            ):
                raise _Bad(
                    "unreadable captions",
                    f"'captions' of its json must be a non-empty list of strings, got {captions!r:.60}",
                )
            return captions
    text = _text(files["txt"], "its txt", handle).strip() if "txt" in files else ""
    if text:  # img2dataset writes an empty txt for a sample without a caption
        return [text]
    caption = meta.get("caption") if isinstance(meta, dict) else None
    if caption is None:
        raise _Bad("samples without a caption", "no caption (a txt file, or caption or captions in its json)")
    if not isinstance(caption, str):
        raise _Bad("unreadable captions", f"'caption' of its json must be a string, got {caption!r:.60}")
    return [caption]


def _record(
    sample: _Sample, shard: Path, handle: BinaryIO, tokenizer: Callable[[str], list[str]]
) -> ImageRecord:
    """The record of a sample (id and split still to be given).

    Raises:
        _Bad: the sample's problem.
    """
    if sample.problem is not None:
        raise _Bad(*sample.problem)
    image = next((sample.files[kind] for kind in IMAGE_KEYS if kind in sample.files), None)
    if image is None:
        raise _Bad("samples without an image", f"no image ({', '.join(IMAGE_KEYS)})")
    raw = _captions(sample.files, handle)
    captions = []
    for caption in raw:
        tokens = tokenizer(caption)
        if not tokens:
            raise _Bad("samples with a caption of no words", f"caption {caption!r:.60} has no words")
        captions.append(tuple(tokens))
    return ImageRecord(0, tar_members.member_path(shard, image.name), "", tuple(captions), tuple(raw))


def read_shards(
    root: str | Path,
    tokenizer: Callable[[str], list[str]] = tokenize,
    skip_bad: bool = False,
    listings: Path | None = None,
    write_listings: bool = False,
    under: Path | None = None,
) -> list[ImageRecord]:
    """Read the samples of the shards ``root`` names into one record per image (module docstring).

    Args:
        root: ``data.root``: a folder of shards or a brace pattern of shard files.
        tokenizer: splits each caption into the training tokens (``data.tokenizer``).
        skip_bad: ``data.skip_bad_images``: skip and count bad samples and truncated shards' ends.
        listings: the folder of the shards' kept listings (``captioning.data.shard_listings``); None:
            every shard is listed from its headers.
        write_listings: keep the listings made in ``listings`` (training and caching runs).
        under: the folder the user named that holds ``listings``: nothing below it is written
            through a link (``captioning.utils.files.refuse_links``).
    Returns:
        Records in reading order (shards in order, samples in archive order).
    Raises:
        ConfigError: the webdataset library is missing, or ``root`` names nothing.
        DatasetError: one line naming the shard and the key of the first bad sample; the shard of a
            truncated or unreadable one.
    """
    key_of, _ = _library()
    shards = shard_files(root)
    splits = read_shard_splits(shards)
    skipped = SkipLog(os.fspath(root), logger)
    found: list[tuple[str, ImageRecord]] = []  # (key, record with a provisional id)
    kept = Listings(listings, write_listings, under)
    for shard in shards:
        try:
            state, scan = kept.scan(shard)
        except tar_members.MemberError as error:
            raise DatasetError(f"{shard}: {error}") from None
        except OSError as error:
            raise DatasetError(f"{shard}: cannot read ({error.strerror})") from None
        tar_members.remember(shard, state, scan)
        cut = key_of(scan.cut)[0] if scan.cut else None
        if scan.truncated is not None:
            if not skip_bad:
                at = f"key {cut!r}: " if cut else ""
                raise DatasetError(
                    f"{shard}: truncated shard: {at}{scan.truncated}; download or copy it again, or set "
                    "data.skip_bad_images=true to read the samples before the cut"
                )
            skipped.skip(
                "truncated shards (their samples before the cut are read)", f"{shard}: {scan.truncated}"
            )
        try:
            handle = open(shard, "rb")  # the captions are read through one handle
        except OSError as error:
            raise DatasetError(f"{shard}: cannot read ({error.strerror})") from None
        with handle:
            for sample in _samples(scan, key_of):
                if sample.key == cut:
                    continue  # its bytes are past the end of the file (counted with the shard)
                try:
                    record = _record(sample, shard, handle, tokenizer)
                except _Bad as bad:
                    where = f"{shard}: key {sample.key!r}"
                    if not skip_bad:
                        hint = " (or set data.skip_bad_images=true to skip such samples)"
                        raise DatasetError(f"{where}: {bad.message}{hint}") from None
                    skipped.skip(bad.reason, where)
                    continue
                split = splits[shard] if splits is not None else ""
                found.append((sample.key, replace(record, split=split)))
    skipped.report()
    kept.report()
    if not found:
        raise DatasetError(
            f"{os.fspath(root)}: no samples with an image and a caption in {len(shards)} shards"
        )
    ids = _image_ids([key for key, _ in found])
    records = [replace(record, image_id=image_id) for image_id, (_, record) in zip(ids, found, strict=True)]
    logger.info("%s: %d samples in %d shards", os.fspath(root), len(records), len(shards))
    return records if splits is not None else assign_splits(records)


def _image_ids(keys: list[str]) -> list[int]:
    """The keys' numbers when all are distinct decimal numbers of 64 bits; else 1, 2, ..."""
    if all(key.isascii() and key.isdecimal() for key in keys):
        numbers = [int(key) for key in keys]
        if len(set(numbers)) == len(numbers) and max(numbers) <= _INT64_MAX:
            return numbers
    return list(range(1, len(keys) + 1))


@register_reader("webdataset")
class WebDatasetReader(DatasetReader):
    """WebDataset tar shards (img2dataset's layout) under ``data.root``, a folder of ``.tar`` files or
    a brace pattern; splits from ``splits.json`` beside them, else :data:`SPLIT_RULE`."""

    checks_root = True

    def read(self, config: DataConfig) -> list[ImageRecord]:
        return self.read_records(config, write_index=False)

    def read_records(self, config: DataConfig, write_index: bool) -> list[ImageRecord]:
        check_data_paths(config)
        under = Path(config.cache_dir) if config.cache_dir else self.data_folder(config)
        listings = (under if config.cache_dir else under / "features") / LISTINGS_FOLDER
        return read_shards(
            config.root, tokenizer_for(config.tokenizer), config.skip_bad_images, listings, write_index, under
        )

    def split_rule(self, config: DataConfig) -> str | None:
        return None if splits_file(shard_files(config.root)).exists() else SPLIT_RULE

    def data_folder(self, config: DataConfig) -> Path:
        return shard_files(config.root)[0].parent if not Path(config.root).is_dir() else Path(config.root)
