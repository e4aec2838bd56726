"""Reader for the official COCO caption annotations (``captions_train2014.json``, ``captions_val2017.json``).

Each file is indexed by ``pycocotools.coco.COCO``. The split comes from the file name
(``captions_train2014.json`` -> ``train``) or, given Karpathy's ``dataset_coco.json``, from
Karpathy's split of each COCO id (``restval`` -> ``train``). Captions are tokenized with
``data.tokenizer`` (default: ``captioning.data.tokenizers.tokenize``, PTB); empty captions and images left
without a caption are skipped and counted, as in the Karpathy reader.

Image paths follow the standard layout under the image root:
``train2014/COCO_train2014_000000057870.jpg`` (folder from the ``COCO_<folder>_`` prefix) and
``val2017/000000397133.jpg`` (folder from the annotation file name). A ``file_name`` that
already holds a folder (``train/000001.png``) is taken relative to the image root as it is.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from captioning.config import CocoDataConfig, ConfigError, DataConfig
from captioning.data.karpathy import SkipLog, image_path_under, read_json, read_karpathy, require_field
from captioning.data.readers import DatasetReader, check_data_paths, own_tokenizer, register_reader
from captioning.data.records import DatasetError, ImageRecord
from captioning.data.tokenizers import tokenize

if TYPE_CHECKING:
    from pycocotools.coco import COCO

logger = logging.getLogger(__name__)

_SPLIT_IN_NAME = re.compile(r"(train|val|test)")
_FOLDER_IN_NAME = re.compile(r"((?:train|val|test)\d{4})")
_COCO_FILE_PREFIX = re.compile(r"COCO_((?:train|val|test)\d{4})_")


def read_coco(
    annotation_files: Iterable[str | Path],
    image_root: str | Path,
    karpathy_split_file: str | Path | None = None,
    restval_to_train: bool = True,
    tokenizer: Callable[[str], list[str]] | None = None,
) -> list[ImageRecord]:
    """Read COCO caption annotation files into one record per image.

    Args:
        annotation_files: COCO captions JSON files; images must not repeat across files.
        image_root: the folder holding ``train2014/``, ``val2014/``, ``val2017/``, ...
        karpathy_split_file: optional ``dataset_coco.json``; when given, every image takes its
            Karpathy split (looked up by COCO id) and images absent from it are skipped.
        restval_to_train: with a Karpathy split file, put ``restval`` images into ``train``.
        tokenizer: splits each caption into its training tokens (``data.tokenizer``; None: PTB).
    Returns:
        Records in file order, then image order within each file; captions in annotation order.
    Raises:
        DatasetError: unreadable or malformed files, an annotation for an unknown image, duplicate
            ids, a split that cannot be told from the file name, or an unsafe image path.
    """
    image_root = Path(image_root)
    karpathy_split = None
    if karpathy_split_file is not None:
        karpathy_split = {
            r.image_id: r.split for r in read_karpathy(karpathy_split_file, image_root, restval_to_train)
        }
    records: list[ImageRecord] = []
    file_of_id: dict[int, str] = {}
    for annotation_file in annotation_files:
        annotation_file = Path(annotation_file)
        skipped = SkipLog(annotation_file.name, logger)
        for record in _read_annotation_file(annotation_file, image_root, karpathy_split, skipped, tokenizer):
            if record.image_id in file_of_id:
                raise DatasetError(
                    f"{annotation_file.name}: image id {record.image_id} is also in "
                    f"{file_of_id[record.image_id]}"
                )
            file_of_id[record.image_id] = annotation_file.name
            records.append(record)
        skipped.report()
    return records


def split_of_file(annotation_file: str | Path) -> str | None:
    """The split an official annotation file holds, from its name (``captions_val2014.json`` -> val)."""
    match = _SPLIT_IN_NAME.search(Path(annotation_file).stem)
    return match.group(1) if match else None


def _read_annotation_file(
    annotation_file: Path,
    image_root: Path,
    karpathy_split: dict[int, str] | None,
    skipped: SkipLog,
    tokenizer: Callable[[str], list[str]] | None,
) -> list[ImageRecord]:
    source = annotation_file.name
    tokenizer = tokenizer or tokenize
    file_split = None
    if karpathy_split is None:
        file_split = split_of_file(annotation_file)
        if file_split is None:
            raise DatasetError(
                f"{source}: cannot tell the split from the file name (expected train, val or "
                "test in it); pass a Karpathy split file instead"
            )
    coco = _index(annotation_file, source)
    folder_match = _FOLDER_IN_NAME.search(annotation_file.stem)
    file_folder = folder_match.group(1) if folder_match else ""
    records = []
    for image_id, image in coco.imgs.items():
        where = f"{source}: image {image_id}"
        split = file_split if karpathy_split is None else karpathy_split.get(image_id)
        if split is None:
            skipped.skip("images not in the Karpathy split file", where)
            continue
        file_name = require_field(image, "file_name", str, where)
        path = image_path_under(image_root, _relative_path(file_name, file_folder), where)
        captions, raws = [], []
        for annotation in coco.imgToAnns.get(image_id, []):
            raw = annotation["caption"]
            tokens = tokenizer(raw)
            raws.append(raw.strip())  # a reference for scoring even when it has no words, as the toolkit does
            if not tokens:
                skipped.skip("empty captions", f"{source}: annotation id {annotation['id']}")
                continue
            captions.append(tuple(tokens))
        if not captions:
            skipped.skip("images with no caption", where)
            continue
        records.append(
            ImageRecord(image_id=image_id, path=path, split=split, captions=tuple(captions), raw=tuple(raws))
        )
    return records


def _index(annotation_file: Path, source: str) -> COCO:
    """Check the file entry by entry (for messages naming the entry), then index it with pycocotools."""
    data = read_json(annotation_file)
    if not isinstance(data, dict):
        raise DatasetError(
            f"{source}: expected a JSON object with 'images' and 'annotations', got {type(data).__name__}"
        )
    image_ids = set()
    for position, image in enumerate(require_field(data, "images", list, source)):
        image_id = require_field(image, "id", int, f"{source}: image {position}")
        if image_id in image_ids:
            raise DatasetError(f"{source}: image {position}: duplicate image id {image_id}")
        image_ids.add(image_id)
    annotation_ids = set()
    for position, annotation in enumerate(require_field(data, "annotations", list, source)):
        annotation_id = require_field(annotation, "id", int, f"{source}: annotation {position}")
        where = f"{source}: annotation {position} (id {annotation_id})"
        if annotation_id in annotation_ids:
            raise DatasetError(f"{where}: duplicate annotation id")
        annotation_ids.add(annotation_id)
        if require_field(annotation, "image_id", int, where) not in image_ids:
            raise DatasetError(f"{where}: image_id {annotation['image_id']} is not in 'images'")
        require_field(annotation, "caption", str, where)
    from pycocotools.coco import COCO  # on first use: a model run by ONNX Runtime reads no COCO files

    coco = COCO()
    coco.dataset = data
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
            coco.createIndex()
    except (AssertionError, KeyError, TypeError) as error:
        raise DatasetError(
            f"{source}: not a COCO annotation file ({type(error).__name__}: {error})"
        ) from None
    return coco


def _relative_path(file_name: str, file_folder: str) -> str:
    """``file_name`` relative to the image root (see the module docstring for the layout)."""
    if "/" in file_name or "\\" in file_name:
        return file_name
    prefix = _COCO_FILE_PREFIX.match(file_name)
    folder = prefix.group(1) if prefix else file_folder
    return f"{folder}/{file_name}" if folder else file_name


@register_reader("coco", CocoDataConfig)
class CocoReader(DatasetReader):
    """The official caption files ``data.annotations`` (split from each file's name, or from Karpathy's
    ``data.split_file``), images under ``data.root`` (``CocoDataConfig``)."""

    indexed = True

    def read(self, config: DataConfig) -> list[ImageRecord]:
        assert isinstance(config, CocoDataConfig)  # data.dataset coco is read into its own class
        if not config.annotations:
            raise ConfigError(
                "data.annotations is required for data.dataset=coco (e.g. captions_train2014.json)"
            )
        check_data_paths(config)
        records = read_coco(
            config.annotations, config.root, config.split_file, config.restval_to_train, own_tokenizer(config)
        )
        return records if config.split_file is not None else divide_official_val(records)

    def source_files(self, config: DataConfig) -> list[Path]:
        assert isinstance(config, CocoDataConfig)
        return [*([Path(config.split_file)] if config.split_file else []), *map(Path, config.annotations)]

    def split_rule(self, config: DataConfig) -> str | None:
        assert isinstance(config, CocoDataConfig)
        if config.split_file is not None:
            return None
        splits = {path: split_of_file(path) for path in config.annotations}
        if "test" in splits.values():
            return None
        val_files = (
            ", ".join(Path(path).name for path, split in splits.items() if split == "val") or "the val files"
        )
        return f"val and test both from {val_files}: even image ids -> val, odd -> test"


def divide_official_val(records: list[ImageRecord]) -> list[ImageRecord]:
    """The official COCO files' splits: ``captions_train2014.json`` trains, and the images of
    ``captions_val2014.json`` are divided by image id, even ids validating and odd ids the test
    split (COCO's test images have no public captions). Records are returned as they are when a
    file already gives a test split (``captions_test....json``)."""
    if any(record.split == "test" for record in records):
        return records
    return [
        replace(record, split="test") if record.split == "val" and record.image_id % 2 else record
        for record in records
    ]
