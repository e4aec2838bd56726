"""Shard listings kept on disk (``captioning.data.shard_listings``): a training start keeps each shard's
listing, and the next start reads no tar header (tarfile made unusable) and gives the same records;
a touched shard, one rewritten with its size and modification time kept, and a damaged, edited or
another shard's listing are listed from their headers again, never trusted; tools that only read
(a checkpoint's configuration) write none, and an unwritable folder is one warning."""

from __future__ import annotations

import json
import logging
import os
import tarfile
from pathlib import Path

import pytest
from shard_fixture import default_caption, write_img2dataset

from captioning.config import DataConfig
from captioning.data import load_records, shard_listings, tar_members
from captioning.data.images import load_image

pytest.importorskip("webdataset")


@pytest.fixture(autouse=True)
def _no_kept_listings():
    yield
    tar_members.forget_all()


@pytest.fixture
def listed(monkeypatch) -> list[str]:
    """The shards listed from their tar headers (``scan_shard``'s calls), in order."""
    calls: list[str] = []
    scan = tar_members.scan_shard

    def counted(shard):
        calls.append(Path(shard).name)
        return scan(shard)

    monkeypatch.setattr(tar_members, "scan_shard", counted)
    return calls


def _start(config: DataConfig, write: bool = True) -> list:
    """What a start reads: the records, in a process that has listed no shard yet."""
    tar_members.forget_all()
    return load_records(config, write_index=write)


def _listing(folder: Path, shard: Path) -> Path:
    return shard_listings.listing_path(folder / "features" / shard_listings.FOLDER, shard)


@pytest.fixture
def shards(tmp_path: Path) -> tuple[DataConfig, list[Path]]:
    tars = write_img2dataset(tmp_path / "shards")
    return DataConfig(dataset="webdataset", root=str(tmp_path / "shards")), tars


def test_a_second_start_reads_no_tar_header(shards, listed, monkeypatch):
    config, tars = shards
    first = _start(config)
    assert listed == ["00000.tar", "00001.tar", "00002.tar"]
    kept = sorted((tars[0].parent / "features" / shard_listings.FOLDER).iterdir())
    assert kept == sorted(_listing(tars[0].parent, tar) for tar in tars)

    def no_tar(*args, **kwargs):
        raise AssertionError("a tar header was read")

    monkeypatch.setattr(tarfile, "open", no_tar)
    monkeypatch.setattr(tarfile.TarFile, "next", no_tar)
    listed.clear()
    assert _start(config) == first  # the same records, captions read at their recorded offsets
    assert listed == []
    image = load_image(first[11].path)  # and images, by the kept offsets
    assert image.size == (48, 40)
    assert listed == []


def test_a_touched_shard_is_listed_again_and_its_listing_replaced(shards, listed):
    config, tars = shards
    first = _start(config)
    state = tars[1].stat()
    os.utime(tars[1], ns=(state.st_atime_ns, state.st_mtime_ns + 1_000_000_000))
    listed.clear()
    assert _start(config) == first
    assert listed == ["00001.tar"]
    listed.clear()
    assert _start(config) == first and listed == []  # the new listing is kept


def test_a_shard_rewritten_with_its_size_and_time_kept_is_listed_again(shards, listed, tmp_path):
    config, tars = shards
    first = _start(config)
    state = tars[2].stat()
    # Shard 2 written again in place with other captions of the same length (so the same size), then
    # given its old modification time back, as cp -p would: only its change time tells.
    other = write_img2dataset(tmp_path / "other", caption=lambda number: default_caption(number).upper())
    tars[2].write_bytes(other[2].read_bytes())
    os.utime(tars[2], ns=(state.st_atime_ns, state.st_mtime_ns))
    assert (tars[2].stat().st_size, tars[2].stat().st_mtime_ns) == (state.st_size, state.st_mtime_ns)
    listed.clear()
    again = _start(config)
    assert listed == ["00002.tar"]
    assert again[-1].raw == (first[-1].raw[0].upper(),) and again[:16] == first[:16]


@pytest.mark.parametrize(
    "damage",
    ["truncated", "not_json", "offset_moved", "offset_past_the_end", "another_shards", "older_format"],
)
def test_a_damaged_or_foreign_listing_is_never_trusted(shards, listed, damage):
    config, tars = shards
    first = _start(config)
    path = _listing(tars[0].parent, tars[1])
    text = path.read_text(encoding="utf-8")
    payload = json.loads(text)
    if damage == "truncated":
        path.write_text(text[: len(text) // 2], encoding="utf-8")
    elif damage == "not_json":
        path.write_bytes(b"\xff\xfe not a listing")
    elif damage == "offset_moved":  # valid JSON, the hash no longer holds
        payload["members"][3][1] += 512
        path.write_text(json.dumps(payload), encoding="utf-8")
    else:  # the hash made to hold: the content itself is checked
        if damage == "offset_past_the_end":
            payload["members"][-1][2] += 10**6
        elif damage == "another_shards":
            payload = json.loads(_listing(tars[0].parent, tars[0]).read_text(encoding="utf-8"))
        else:
            payload["format"] = 0
        del payload["digest"]
        payload["digest"] = shard_listings._digest(payload, shard_listings._key())  # the user's own key
        path.write_text(json.dumps(payload), encoding="utf-8")
    listed.clear()
    assert _start(config) == first
    assert listed == ["00001.tar"]
    listed.clear()
    assert _start(config) == first and listed == []  # listed again and kept anew


def test_a_truncated_shards_listing_keeps_where_it_breaks_off(tmp_path, listed, caplog):
    tars = write_img2dataset(tmp_path / "shards", shards=2)
    with tarfile.open(tars[1]) as archive:
        cut = archive.getmember("000010005.jpg")
    with open(tars[1], "r+b") as handle:  # a partial download: the file ends inside an image
        handle.truncate(cut.offset_data + cut.size // 2)
    config = DataConfig(dataset="webdataset", root=str(tmp_path / "shards"), skip_bad_images=True)
    with caplog.at_level(logging.WARNING, logger="captioning.data.shards"):
        first = _start(config)
    listed.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="captioning.data.shards"):
        assert _start(config) == first
    assert listed == []
    assert any("skipped 1 truncated shards" in message for message in caplog.messages), caplog.messages


def test_reading_tools_write_no_listing_and_read_kept_ones(shards, listed):
    config, tars = shards
    folder = tars[0].parent / "features" / shard_listings.FOLDER
    tar_members.forget_all()
    first = load_records(config)  # evaluate.py and visualize.py: no output folder, nothing written
    assert not folder.exists() and len(listed) == 3
    _start(config)
    listed.clear()
    assert _start(config, write=False) == first and listed == []


def test_listings_go_to_the_configured_cache_folder(shards, tmp_path):
    config, tars = shards
    cache = tmp_path / "elsewhere"
    _start(DataConfig(dataset="webdataset", root=config.root, cache_dir=str(cache)))
    assert sorted(path.name for path in (cache / shard_listings.FOLDER).iterdir()) == sorted(
        shard_listings.listing_path(cache, tar).name for tar in tars
    )
    assert not (tars[0].parent / "features").exists()


def test_an_unwritable_folder_is_one_warning_and_the_records_are_read(shards, caplog):
    config, tars = shards
    first = _start(config, write=False)
    (tars[0].parent / "features").write_text("a file where the cache folder would be")
    with caplog.at_level(logging.WARNING, logger="captioning.data.shard_listings"):
        assert _start(config) == first
    warnings = [message for message in caplog.messages if "cannot keep shard listings" in message]
    assert len(warnings) == 1, caplog.messages
