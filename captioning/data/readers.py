"""``DATASETS``: the dataset readers ``data.dataset`` names, and what every reader shares.

A reader is a class registered beside its code with ``@register_reader(name, config_class)``, its
class and its options together (``config_class``: ``DataConfig``, or a subclass of it holding the
reader's own options, as ``ShapesDataConfig`` or ``KarpathyDataConfig``); its ``read(config)`` turns
the files the configuration names into ``ImageRecord``s. :func:`captioning.data.load_records` looks
``data.dataset`` up in ``DATASETS`` (``captioning.config``), so a reader of your own registered by a
module given to ``--import`` is used by every tool (docs/extending.md, "A new dataset reader")::

    @register_reader("karpathy", KarpathyDataConfig)
    class KarpathyReader(DatasetReader):
        indexed = True

        def read(self, config: DataConfig) -> list[ImageRecord]:
            assert isinstance(config, KarpathyDataConfig)  # data.dataset karpathy is read into it
            check_data_paths(config)
            return read_karpathy(config.split_file, config.root, ...)

Every registered name is covered by tests/data/test_dataset_readers_contract.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from captioning.config import DATASETS, ConfigError, DataConfig, path_options
from captioning.data.records import ImageRecord
from captioning.data.tokenizers import tokenizer_for
from captioning.utils.files import path_kind


class DatasetReader:
    """A source of ``ImageRecord``s, chosen by ``data.dataset``.

    Attributes:
        captioned: the records carry captions and a split (train, val or test); False for a plain
            folder of images to caption (split ``""``, no captions).
        indexed: large caption files: records are kept in the per-split index (``record_index``).
        writes_root: the reader makes ``data.root`` itself (Shapes generates it), so it need not exist.
        checks_root: ``data.root`` need not be a folder (a pattern of shard files): the reader checks
            it itself, with its own messages.
    """

    captioned: ClassVar[bool] = True
    indexed: ClassVar[bool] = False
    writes_root: ClassVar[bool] = False
    checks_root: ClassVar[bool] = False

    def read(self, config: DataConfig) -> list[ImageRecord]:
        """One record per image, in the source's order.

        Raises:
            ConfigError: a file or folder ``config`` names is missing (:func:`check_data_paths`).
            DatasetError: a malformed entry, in one line naming the file and the entry.
        """
        raise NotImplementedError

    def read_records(self, config: DataConfig, write_index: bool) -> list[ImageRecord]:
        """``read``, in a run that may (``write_index``: a training or caching run's rank 0) keep an index
        of the reader's own under the cache folder, as the webdataset reader keeps its shards'
        listings; by default ``read(config)``."""
        return self.read(config)

    def split_rule(self, config: DataConfig) -> str | None:
        """How the val and test splits are made when no file gives them (for the plan line and
        ``data_summary.json``); None when the files give every split."""
        return None

    def source_files(self, config: DataConfig) -> list[Path]:
        """The files the records are read from, named in messages (and keying an ``indexed`` reader's
        index); none by default: the records come from ``data.root``."""
        return []

    def index_options(self, config: DataConfig) -> dict[str, Any]:
        """The options besides ``data.tokenizer`` that the records depend on, keying an ``indexed``
        reader's index with its ``source_files``' contents: by default the reader's own options (those
        its options class adds to ``DataConfig``'s: Karpathy's ``restval_to_train``), less the ones
        naming files (``split_file``, ``annotations``: their contents key the index, so that the same
        files elsewhere find it), as JSON holds them."""
        shared = {item.name for item in dataclasses.fields(DataConfig)}
        own = {
            item.name: getattr(config, item.name)
            for item in dataclasses.fields(config)
            if item.name not in shared and item.name not in path_options(type(config))
        }
        plain: dict[str, Any] = json.loads(json.dumps(own))  # tuples as lists, as the stored key has them
        return plain

    def cache_under_root(self, config: DataConfig) -> bool:
        """Whether the feature cache lives in the data's folder (``data_folder``: shared by every run
        over the data); False puts it under the run folder (a folder of someone's photos is not
        written into)."""
        return True

    def data_folder(self, config: DataConfig) -> Path:
        """The folder holding the data, where the feature cache goes unless ``data.cache_dir`` says
        otherwise (``<folder>/features``): ``data.root``."""
        return Path(config.root)

    def default_instances(self, config: DataConfig) -> tuple[Path, ...]:
        """The instances (boxes) files grounding and CHAIR use when ``data.instances`` names none."""
        return ()

    def check_readable(self, config: DataConfig, generate: bool) -> None:
        """Refuse, before reading, data this reader may not produce here (``generate`` False: the
        root is only read, e.g. a checkpoint's stored path)."""


ReaderClass = TypeVar("ReaderClass", bound=type[DatasetReader])


def register_reader(
    name: str, config_class: type[DataConfig] = DataConfig
) -> Callable[[ReaderClass], ReaderClass]:
    """Decorator registering a ``DatasetReader`` subclass as the reader ``name`` of ``DATASETS``,
    configured by ``config_class``: ``DataConfig`` for a reader without options of its own, else a
    frozen dataclass deriving from it whose ``dataset`` defaults to ``name`` (``data.*`` is read
    into it, and its options are refused with another ``data.dataset``). The built-in readers'
    configuration classes are registered where configurations are read (``captioning.config``).

    Raises:
        ValueError: ``name`` is taken, or is configured by another class already, or
            ``config_class`` is not a dataclass of its name.
    """
    return DATASETS.register_family(name, config_class)


def reader_class(name: str) -> type[DatasetReader]:
    """The reader class registered as ``name``.

    Raises:
        UnknownNameError: one line naming ``data.dataset`` and listing the registered readers.
    """
    reader: type[DatasetReader] = DATASETS.implementation_of(name)
    return reader


def reader_of(config: DataConfig) -> DatasetReader:
    """The reader ``config.dataset`` names.

    Raises:
        UnknownNameError: one line naming ``data.dataset`` and listing the registered readers.
    """
    return reader_class(config.dataset)()


def data_source(config: DataConfig) -> str:
    """The files (or folder) a dataset's records are read from, for messages: its reader's
    ``source_files`` (the Karpathy split file, the COCO annotation files), else ``data.root``."""
    return ", ".join(map(str, reader_of(config).source_files(config))) or str(config.root)


def own_tokenizer(config: DataConfig) -> Callable[[str], list[str]] | None:
    """The tokenizer the Karpathy and COCO readers are given: None (their own PTB tokens) for ptb."""
    return None if config.tokenizer == "ptb" else tokenizer_for(config.tokenizer)


def check_data_paths(config: DataConfig) -> None:
    """Every file and folder the data configuration names must exist (a reader that writes its root,
    as Shapes, or checks it itself, as the webdataset reader, is spared that one); each reader checks
    this first.

    Relative paths are taken from the current folder, so a checkpoint's configuration used from
    another folder fails here; the message names the key to ``--set``.

    Raises:
        ConfigError: ``"<path>: data.<key>: no such file (relative paths start from <cwd>); set
            data.<key>=... to where it is"``.
        UnknownNameError: ``data.dataset`` names no registered reader.
    """
    reader = reader_class(config.dataset)
    for key, option in path_options(type(config)).items():  # the options marked FilePath, FolderPath
        if not option.must_exist or (key == "root" and (reader.writes_root or reader.checks_root)):
            continue
        kind = option.kind
        value = getattr(config, key)
        for path in map(Path, value if isinstance(value, tuple) else [value] if value else []):
            exists = path.is_dir() if kind == "folder" else path.is_file()
            if not exists:
                if path.exists():  # a folder for a file, a FIFO (reading one would wait forever), ...
                    raise ConfigError(
                        f"{path}: data.{key}: {path_kind(path)}, not a {kind}; set data.{key}=... to a {kind}"
                    )
                where = f" (relative paths start from {Path.cwd()})" if not path.is_absolute() else ""
                raise ConfigError(
                    f"{path}: data.{key}: no such {kind}{where}; set data.{key}=... to where it is"
                )
