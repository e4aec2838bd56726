"""A dataset reader of your own declares its options as the Shapes reader does: a ``DataConfig``
subclass registered with the reader by one ``register_reader(name, config_class)``, read from YAML and
``--set`` under ``data.*``, and refused with any other ``data.dataset``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from messages import raises_naming

from captioning.config import (
    DATASETS,
    ConfigError,
    DataConfig,
    FilePath,
    KarpathyDataConfig,
    KarpathySplitConfig,
    ShapesDataConfig,
    to_dict,
)
from captioning.config.loading import from_dict, load_config, parse_overrides
from captioning.config.reference import reference_markdown
from captioning.data import load_records, read_karpathy
from captioning.data.readers import DatasetReader, check_data_paths, reader_of, register_reader
from captioning.data.shapes import ShapesReader

NAME = "capped_for_test"


@dataclasses.dataclass(frozen=True)
class CappedDataConfig(KarpathySplitConfig):
    """A Karpathy split file whose images keep their first captions only (``data.split_file``: the
    options a reader of the split file shares with the karpathy and coco readers)."""

    dataset: str = NAME
    captions_kept: int = 5  # captions kept per image

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.captions_kept < 1:
            raise ConfigError(f"data.captions_kept must be >= 1, got {self.captions_kept}")


class CappedReader(DatasetReader):
    def read(self, config: DataConfig) -> list:
        assert isinstance(config, CappedDataConfig)
        check_data_paths(config)
        kept = config.captions_kept
        return [
            dataclasses.replace(record, captions=record.captions[:kept], raw=record.raw[:kept])
            for record in read_karpathy(config.split_file, config.root)
        ]


@pytest.fixture
def capped_reader() -> Iterator[type[CappedReader]]:
    """The reader registered for one test (the contract test's parameters are every registered name)."""
    with DATASETS.registered(NAME, CappedReader, CappedDataConfig):
        yield CappedReader


def test_one_registration_gives_a_reader_its_class_and_its_options(capped_reader):
    family = DATASETS[NAME]
    assert family.config is CappedDataConfig and family.implementation is CappedReader
    assert "dataset capped_for_test: captions kept per image" in reference_markdown()
    assert DATASETS["shapes"].config is ShapesDataConfig and DATASETS["shapes"].implementation is ShapesReader
    assert DATASETS["karpathy"].config is KarpathyDataConfig
    assert DATASETS["folder"].config is DataConfig  # a reader without options of its own


def test_a_readers_own_options_come_from_yaml_and_set(capped_reader, karpathy_dataset, tmp_path):
    split_file, root = karpathy_dataset
    path = tmp_path / "capped.yaml"
    path.write_text(
        f"data:\n  dataset: {NAME}\n  root: {root}\n  split_file: {split_file}\n  captions_kept: 2\n",
        encoding="utf-8",
    )
    config = load_config(path)
    assert type(config.data) is CappedDataConfig and config.data.captions_kept == 2
    assert {len(record.captions) for record in load_records(config.data)} == {2}
    overridden = load_config(path, parse_overrides(["data.captions_kept=1"])).data
    assert overridden.captions_kept == 1 and isinstance(reader_of(overridden), CappedReader)
    assert {len(record.captions) for record in load_records(overridden)} == {1}
    assert (
        from_dict({"data": to_dict(overridden)}, stored=True).data == overridden
    )  # as a checkpoint stores it
    with raises_naming(ConfigError, "data.captions_kept", "0"):
        load_config(path, {"data.captions_kept": "0"})


def test_a_readers_own_option_with_another_dataset_is_refused_naming_the_reader(capped_reader):
    # the key, the reader it belongs to, the dataset chosen
    with raises_naming(ConfigError, "data.captions_kept", "capped_for_test", "'shapes'"):
        load_config(None, {"data.captions_kept": "2"})  # the default dataset, shapes
    with raises_naming(ConfigError, "data.shapes_train", "shapes", f"data.dataset '{NAME}'"):
        load_config(None, {"data.dataset": NAME, "data.shapes_train": "5"})


def test_a_readers_options_class_must_be_a_dataclass_of_its_name():
    class Undecorated(DataConfig):
        dataset = "undecorated_for_test"

    @dataclasses.dataclass(frozen=True)
    class OtherName(DataConfig):
        dataset: str = "another_name"

    for config_class in (Undecorated, OtherName):
        with raises_naming(ValueError, "'undecorated_for_test'", "dataclass", "DataConfig"):
            register_reader("undecorated_for_test", config_class)(CappedReader)
    with raises_naming(ValueError, "'shapes'", "registered"):
        register_reader("shapes", ShapesDataConfig)(CappedReader)
    # A family whose options are registered where configurations are read takes its reader with them.
    with DATASETS.scope():
        DATASETS.register_options(NAME)(CappedDataConfig)
        with raises_naming(ValueError, f"'{NAME}'", "CappedDataConfig"):
            register_reader(NAME)(CappedReader)
        register_reader(NAME, CappedDataConfig)(CappedReader)
        assert DATASETS[NAME].implementation is CappedReader
    # A module written before readers had options of their own still registers with DATASETS.register:
    # its reader is read from DataConfig, and the registry holds a family all the same.
    with DATASETS.registered("bare_for_test", CappedReader):
        assert DATASETS["bare_for_test"].implementation is CappedReader
        assert DATASETS["bare_for_test"].config is DataConfig
    with raises_naming(TypeError, "'bare_for_test'", "docs/extending.md"):
        DATASETS.add("bare_for_test", CappedReader)  # type: ignore[arg-type]
    assert "undecorated_for_test" not in DATASETS and "bare_for_test" not in DATASETS


@dataclasses.dataclass(frozen=True)
class StopwordsDataConfig(CappedDataConfig):
    """A reader of your own with a file option of its own, declared by its type."""

    dataset: str = "stopwords_for_test"
    stopwords: FilePath | None = None  # a file of words left out of the captions


def test_a_readers_own_path_option_is_expanded_and_checked(karpathy_dataset, tmp_path, monkeypatch):
    split_file, root = karpathy_dataset
    with DATASETS.registered("stopwords_for_test", CappedReader, StopwordsDataConfig):
        monkeypatch.setenv("HOME", str(tmp_path))
        overrides = {
            "data.dataset": "stopwords_for_test",
            "data.root": str(root),
            "data.split_file": str(split_file),
            "data.stopwords": "~/stop.txt",
        }
        config = load_config(None, overrides).data
        assert config.stopwords == str(tmp_path / "stop.txt")  # ~ expanded as a shell does
        with raises_naming(ConfigError, tmp_path / "stop.txt", "data.stopwords"):
            check_data_paths(config)
        (tmp_path / "stop.txt").write_text("a\n", encoding="utf-8")
        check_data_paths(config)  # now there: accepted
        assert "stopwords" not in reader_of(config).index_options(config)  # its contents key the index
