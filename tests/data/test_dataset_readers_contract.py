"""The contract of every dataset reader in ``DATASETS`` (parametrized over its names, so a newly
registered reader is held to it, and fails here until it has a fixture in ``FIXTURES``).

On a tiny fixture in the source's exact published format (those tests/conftest.py writes), a reader
returns ``ImageRecord``s with the documented fields; a captioned reader's every record is in train,
val or test and has non-empty captions, a plain folder's none; a malformed entry is refused in one
line naming the file and the entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from captioning.config import (
    CocoDataConfig,
    ConfigError,
    DataConfig,
    KarpathyDataConfig,
    ShapesDataConfig,
    ShapesHallucinationDataConfig,
)
from captioning.data import DATASETS, DatasetError, ImageRecord, generate_shapes
from captioning.data.readers import data_source, reader_class
from captioning.data.shapes_hallucination import co_occurrence_of, generate_shapes_hallucination
from captioning.data.tar_members import image_exists
from captioning.registry import UnknownNameError


@dataclass
class Fixture:
    """A reader's tiny dataset and how to break it.

    Attributes:
        config: reads the dataset.
        break_entry: spoils one entry of the files on disk; returns what the error line must name (the
            file and the entry).
    """

    config: DataConfig
    break_entry: Callable[[], tuple[str, ...]]


def _edit_json(path: Path, edit: Callable[[object], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def _karpathy(request: pytest.FixtureRequest, tmp_path: Path) -> Fixture:
    split_file, root = request.getfixturevalue("karpathy_dataset")

    def break_entry() -> tuple[str, ...]:
        _edit_json(split_file, lambda data: data["images"][3].pop("sentences"))
        return split_file.name, "image 3 ", "'sentences'"

    return Fixture(KarpathyDataConfig(root=str(root), split_file=str(split_file)), break_entry)


def _shapes(request: pytest.FixtureRequest, tmp_path: Path) -> Fixture:
    sizes = {"shapes_train": 4, "shapes_val": 2, "shapes_test": 2, "shapes_image_size": 32}
    config = ShapesDataConfig(root=str(tmp_path / "shapes"), **sizes)

    def break_entry() -> tuple[str, ...]:
        files = generate_shapes(config.root, num_train=4, num_val=2, num_test=2, image_size=32)
        _edit_json(files.split_file, lambda data: data["images"][1].update(split="holdout"))
        return files.split_file.name, "image 1 ", "'holdout'"

    return Fixture(config, break_entry)


def _shapes_hallucination(request: pytest.FixtureRequest, tmp_path: Path) -> Fixture:
    sizes = {"shapes_train": 4, "shapes_val": 2, "shapes_test": 2, "shapes_image_size": 32}
    config = ShapesHallucinationDataConfig(root=str(tmp_path / "testbed"), **sizes)

    def break_entry() -> tuple[str, ...]:
        files = generate_shapes_hallucination(
            config.root, co_occurrence_of(config), num_train=4, num_val=2, num_test=2, image_size=32
        )
        _edit_json(files.split_file, lambda data: data["images"][2].update(split="holdout"))
        return files.split_file.name, "image 2 ", "'holdout'"

    return Fixture(config, break_entry)


def _coco(request: pytest.FixtureRequest, tmp_path: Path) -> Fixture:
    annotation_files, root = request.getfixturevalue("coco_dataset")
    config = CocoDataConfig(root=str(root), annotations=tuple(map(str, annotation_files)))

    def break_entry() -> tuple[str, ...]:
        _edit_json(annotation_files[1], lambda data: data["annotations"][1].update(image_id=999))
        return annotation_files[1].name, "annotation 1 ", "999"

    return Fixture(config, break_entry)


def _imagefolder(request: pytest.FixtureRequest, tmp_path: Path) -> Fixture:
    make_image = request.getfixturevalue("make_image")
    root = tmp_path / "mine"
    rows = [{"file_name": f"img{k}.png", "caption": f"A red square number {k}."} for k in range(1, 11)]
    for row in rows:
        make_image(root / row["file_name"])
    metadata = root / "metadata.jsonl"
    metadata.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")

    def break_entry() -> tuple[str, ...]:
        lines = metadata.read_text(encoding="utf-8").splitlines(keepends=True)
        lines[2] = json.dumps({"file_name": "img3.png", "caption": "   "}) + "\n"
        metadata.write_text("".join(lines), encoding="utf-8")
        return str(metadata), "line 3"

    return Fixture(DataConfig(dataset="imagefolder", root=str(root)), break_entry)


def _folder(request: pytest.FixtureRequest, tmp_path: Path) -> Fixture:
    _, root = request.getfixturevalue("coco_dataset")
    folder = root / "val2014"

    def break_entry() -> tuple[str, ...]:  # a plain folder's one entry is the folder itself
        for image in folder.iterdir():
            image.unlink()
        (folder / "notes.txt").write_text("not an image")
        return str(folder), "no image files"

    return Fixture(DataConfig(dataset="folder", root=str(folder)), break_entry)


def _webdataset(request: pytest.FixtureRequest, tmp_path: Path) -> Fixture:
    from shard_fixture import write_img2dataset

    tars = write_img2dataset(tmp_path / "shards", shards=2, per_shard=5)

    def break_entry() -> tuple[str, ...]:  # the first shard again, its 4th sample without a caption
        def drop_caption(number: int, sample: dict) -> None:
            if number == 3:
                del sample["txt"], sample["json"]

        write_img2dataset(tmp_path / "broken", shards=2, per_shard=5, edit=drop_caption)
        tars[0].write_bytes((tmp_path / "broken" / "00000.tar").read_bytes())
        return str(tars[0]), "key '000000003'", "no caption"

    return Fixture(
        DataConfig(dataset="webdataset", root=str(tmp_path / "shards" / "{00000..00001}.tar")), break_entry
    )


FIXTURES: dict[str, Callable[[pytest.FixtureRequest, Path], Fixture]] = {
    "karpathy": _karpathy,
    "shapes": _shapes,
    "shapes_hallucination": _shapes_hallucination,
    "coco": _coco,
    "imagefolder": _imagefolder,
    "folder": _folder,
    "webdataset": _webdataset,
}


@pytest.fixture(params=DATASETS.names())
def reader_case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Fixture]:
    name = request.param
    if name not in FIXTURES:
        pytest.fail(f"dataset reader {name!r} has no fixture: add one in its published format to FIXTURES")
    return name, FIXTURES[name](request, tmp_path)


def test_records_have_the_documented_fields(reader_case):
    name, fixture = reader_case
    reader = reader_class(name)()
    records = reader.read(fixture.config)
    assert records and all(isinstance(record, ImageRecord) for record in records)
    assert len({record.image_id for record in records}) == len(records)
    for record in records:
        assert isinstance(record.image_id, int) and not isinstance(record.image_id, bool)
        assert isinstance(record.path, Path) and image_exists(record.path), (
            record
        )  # a file or a shard's member
        assert isinstance(record.captions, tuple) and isinstance(record.raw, tuple)
        if reader.captioned:
            assert record.split in ("train", "val", "test"), record
            assert record.captions and record.raw, record
            assert all(
                caption and all(isinstance(w, str) and w for w in caption) for caption in record.captions
            )
            assert all(isinstance(text, str) and text.strip() for text in record.raw)
        else:
            assert record.split == "" and record.captions == () and record.raw == ()
    assert isinstance(reader.split_rule(fixture.config), (str, type(None)))


def test_the_source_files_a_reader_names_exist_and_are_what_messages_name(reader_case):
    name, fixture = reader_case
    files = reader_class(name)().source_files(fixture.config)
    assert all(path.is_file() for path in files), files
    assert data_source(fixture.config) == (", ".join(map(str, files)) or fixture.config.root)
    if isinstance(fixture.config, KarpathyDataConfig):
        assert files == [Path(fixture.config.split_file or "")]
    if isinstance(fixture.config, CocoDataConfig):
        assert files and Path(fixture.config.annotations[0]) in files


def test_a_malformed_entry_is_one_line_naming_the_file_and_the_entry(reader_case):
    name, fixture = reader_case
    needles = fixture.break_entry()
    with pytest.raises((DatasetError, ConfigError)) as raised:
        reader_class(name)().read(fixture.config)
    message = str(raised.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_an_unknown_name_is_one_line_listing_the_registered_readers(tmp_path):
    with pytest.raises(UnknownNameError) as raised:
        DATASETS["nope"]
    message = str(raised.value)
    assert "\n" not in message and "data.dataset" in message
    assert all(name in message for name in DATASETS.names())
    from captioning.data import load_records

    with pytest.raises(UnknownNameError, match="data.dataset"):
        load_records(DataConfig(dataset="nope", root=str(tmp_path)))
