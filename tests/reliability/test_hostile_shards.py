"""Shards, their listings and the data and cache folders, attacked for real: a tar whose member size is
base-256 and negative, members named out of their shard, symbolic links and FIFOs planted where the
project writes listings and cache files, a listing edited and hashed again, a run folder whose
``test_scores.json`` is a FIFO, and JSON files past the reader's bounds. Every planted target lives
in the test's own folder and is checked unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from messages import raises_naming
from shard_fixture import write_img2dataset
from test_faults import assert_one_line_error, shapes
from test_hostile import short_run
from test_hostile_bounds import cache_copy
from test_training import as_flags
from tool_runs import REPO, in_process, run_tool

from captioning.config import ConfigError, DataConfig
from captioning.data import load_records, shard_listings, tar_members
from captioning.data.records import DatasetError
from captioning.evaluation.coco_files import EvaluationInputError, read_json
from captioning.hub.checkpoint import scored_checkpoint

pytest.importorskip("webdataset")
__all__ = ["shapes"]  # a fixture of another test module

USER_TEXT = b"a file of the user's, never to be written by the project\n"


@pytest.fixture(autouse=True)
def _own_key_and_no_kept_listings(tmp_path, monkeypatch) -> Iterator[None]:
    """The listings key lives in the test's folder (``XDG_CACHE_HOME``), and each test starts with no
    listing kept in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    tar_members.forget_all()
    yield
    tar_members.forget_all()


class Hung(BaseException):
    """Raised by ``within``: no ``except OSError`` of the code under test can take it for a read error."""


@contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the body runs longer than ``seconds``."""

    def expired(*_):
        raise Hung(f"still running after {seconds} s: a loop or a blocked open")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _config(root: Path, **values) -> DataConfig:
    return DataConfig(dataset="webdataset", root=str(root), **values)


def _checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)


def _base256(value: int, width: int = 12) -> bytes:
    """A tar number field in GNU's base-256 form (first byte 0x80, or 0xff for a negative number)."""
    return bytes([0xFF if value < 0 else 0x80]) + (value % 256 ** (width - 1)).to_bytes(width - 1, "big")


def _set_size(tar: Path, member: str, size: int, header_of: str) -> None:
    """Write ``size`` into the size field of ``member``'s own header (``header_of="member"``) or of the
    PAX header before it (``"pax"``), in base 256, the checksum kept right."""
    with tarfile.open(tar) as archive:
        info = archive.getmember(member)
    offset = info.offset_data - 512 if header_of == "member" else info.offset
    data = bytearray(tar.read_bytes())
    header = bytearray(data[offset : offset + 512])
    header[124:136] = _base256(size)
    _checksum(header)
    data[offset : offset + 512] = header
    tar.write_bytes(bytes(data))


def _tar(path: Path, files: dict[str, bytes]) -> Path:
    import io

    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


# ------------------------------------------------------------------ header fields and member names


@pytest.mark.parametrize("header_of", ["member", "pax"])
def test_a_negative_member_size_ends_in_one_line_instead_of_looping(tmp_path, header_of):
    (tar,) = write_img2dataset(tmp_path / "shards", shards=1, per_shard=3)
    # in the member's own header, tarfile would read that header again, forever
    _set_size(tar, "000000001.jpg", -512, header_of)
    with within(10), pytest.raises(DatasetError) as raised:
        load_records(_config(tmp_path / "shards"), write_index=True)
    message = str(raised.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"{tar}: truncated shard: ") and "unreadable tar header" in message
    if header_of == "member":
        assert "member '000000001.jpg' has a negative size (-512)" in message
    # with skip_bad_images the samples before the broken header are read
    with within(30):
        records = load_records(_config(tmp_path / "shards", skip_bad_images=True), write_index=False)
    assert [record.path.name for record in records] == ["00000.tar#000000000.jpg"]


@pytest.mark.parametrize("name", ["../../../outside.jpg", "/tmp/outside.jpg", "a/../../outside.jpg"])
def test_a_member_named_out_of_its_shard_is_refused_with_the_shard_and_the_key(tmp_path, name):
    (tmp_path / "outside.jpg").write_bytes(USER_TEXT)
    key = name.rpartition(".")[0]
    shard = _tar(
        tmp_path / "data" / "shards" / "00000.tar",
        {name: USER_TEXT, f"{key}.txt": b"a caption"},
    )
    with pytest.raises(DatasetError) as raised:
        load_records(_config(shard.parent), write_index=True)
    message = str(raised.value)
    assert message.startswith(f"{shard}: key {key!r}: member {name!r}: its name"), message
    assert len(message.splitlines()) == 1
    # and the image's name, given directly, is never read as a path
    with pytest.raises(tar_members.MemberError, match="its name"):
        tar_members.locate(f"{shard}#{name}")
    assert (tmp_path / "outside.jpg").read_bytes() == USER_TEXT


def test_a_nul_byte_in_a_pax_member_name_is_one_line(tmp_path):
    # non-ASCII: the name goes into a PAX header, which may hold a NUL
    shard = _tar(tmp_path / "shards" / "00000.tar", {"é\0b.jpg": b"x", "é\0b.txt": b"a caption"})
    with pytest.raises(DatasetError, match="NUL byte") as raised:
        load_records(_config(shard.parent))
    assert str(shard) in str(raised.value)


# ------------------------------------------------------------------ links and FIFOs where the project writes


def _listing_of(shards: Path, tar: Path) -> Path:
    return shard_listings.listing_path(shards / "features" / shard_listings.FOLDER, tar)


def test_a_link_at_a_listing_or_a_linked_listings_folder_is_never_written_through(tmp_path, caplog):
    tars = write_img2dataset(tmp_path / "shards", shards=2, per_shard=2)
    victim = tmp_path / "user" / "notes.txt"
    victim.parent.mkdir()
    victim.write_bytes(USER_TEXT)
    listing = _listing_of(tmp_path / "shards", tars[0])
    listing.parent.mkdir(parents=True)
    listing.symlink_to(victim)
    records = load_records(_config(tmp_path / "shards"), write_index=True)
    assert len(records) == 4
    assert victim.read_bytes() == USER_TEXT and listing.is_symlink()
    assert "a symbolic link" in caplog.text and str(listing) in caplog.text
    # a linked shard_listings/ folder, then a linked features/ folder: nothing lands behind them
    features = tmp_path / "shards" / "features"
    for linked in (features / shard_listings.FOLDER, features):
        shutil.rmtree(features)
        linked.parent.mkdir(exist_ok=True)
        target = tmp_path / "user" / linked.name
        target.mkdir()
        linked.symlink_to(target, target_is_directory=True)
        tar_members.forget_all()
        assert len(load_records(_config(tmp_path / "shards"), write_index=True)) == 4
        assert list(target.iterdir()) == [], linked
        linked.unlink()
    assert victim.read_bytes() == USER_TEXT


def test_a_fifo_at_a_listing_is_neither_read_nor_written(tmp_path):
    tars = write_img2dataset(tmp_path / "shards", shards=1, per_shard=2)
    listing = _listing_of(tmp_path / "shards", tars[0])
    listing.parent.mkdir(parents=True)
    os.mkfifo(listing)
    with within(30):
        records = load_records(_config(tmp_path / "shards"), write_index=True)
    assert len(records) == 2 and listing.is_fifo()


@pytest.mark.parametrize("name", ["state.bin", "features.npy", "index.json.tmp"])
def test_a_link_planted_in_a_feature_cache_is_refused_before_any_work(shapes, tmp_path, name):
    cache, folder = cache_copy(shapes, tmp_path)
    (folder / "index.json").unlink()  # the cache is built again: every file is written
    victim = tmp_path / "user.bin"
    victim.write_bytes(USER_TEXT)
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(victim)
    result = in_process(
        "train.py",
        "--cache-only",
        *short_run(shapes, tmp_path / "run", **{"data.cache_dir": cache}),
        cwd=REPO,
        timeout=120,
    )
    assert_one_line_error(result.returncode, result.stderr, f"{folder / name}: a symbolic link (to {victim})")
    assert victim.read_bytes() == USER_TEXT


def test_a_run_folder_whose_test_scores_are_a_fifo_is_read_without_waiting(shapes, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.pt").write_bytes(shapes.checkpoint.read_bytes())
    os.mkfifo(run / "test_scores.json")
    with within(30):
        assert scored_checkpoint(run) == run / "checkpoints" / "best.pt"


# ------------------------------------------------------------------ listings edited by hand


def test_an_edited_listing_hashed_again_without_the_key_is_listed_again(tmp_path):
    tars = write_img2dataset(tmp_path / "shards", shards=1, per_shard=6)
    first = load_records(_config(tmp_path / "shards"), write_index=True)
    listing = _listing_of(tmp_path / "shards", tars[0])
    payload = json.loads(listing.read_text(encoding="utf-8"))
    # key 3's files dropped (the order and bounds of the rest hold): its sample would vanish
    payload["members"] = [entry for entry in payload["members"] if not entry[0].startswith("000000003")]
    del payload["digest"]
    unkeyed = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    import hashlib

    payload["digest"] = hashlib.blake2b(unkeyed.encode(), digest_size=16).hexdigest()
    listing.write_text(json.dumps(payload), encoding="utf-8")
    tar_members.forget_all()
    again = load_records(_config(tmp_path / "shards"), write_index=False)
    assert again == first  # all six samples, each with its own image


def test_a_listing_pointing_a_name_at_another_members_bytes_is_refused_when_read(tmp_path):
    tars = write_img2dataset(tmp_path / "shards", shards=1, per_shard=6)
    records = load_records(_config(tmp_path / "shards"), write_index=True)
    scan = tar_members.scan_shard(tars[0])
    moved = [
        tar_members.Member(member.shard, member.name, scan.members[-3].offset, scan.members[-3].size)
        if member.name == "000000000.jpg"
        else member
        for member in scan.members
    ]
    tar_members.remember(tars[0], os.stat(tars[0]), tar_members.ShardScan(moved))
    from captioning.data.images import ImageError, load_image

    with raises_naming(tar_members.MemberError, moved[-3].name, "shard_listings"):
        tar_members.read_member(moved[0])
    tar_members.remember(tars[0], os.stat(tars[0]), tar_members.ShardScan(moved))
    with raises_naming(ImageError, records[0].path, "shard_listings"):
        load_image(records[0].path)
    assert load_image(records[0].path).size == (48, 40)  # the shard is listed again, then read


# ------------------------------------------------------------------ JSON past the reader's bounds


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"images": [{"id": ' + "9" * 5000 + "}]}", "an integer of more than 4300 digits"),
        ("[" * 5000 + "]" * 5000, "JSON nested too deeply (arrays and objects more than 200 deep)"),
    ],
)
def test_json_past_the_bounds_is_one_line_naming_the_file(tmp_path, text, needle):
    path = tmp_path / "captions.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(EvaluationInputError) as raised:
        read_json(path)
    assert str(raised.value) == f"{path}: {needle}"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(text, encoding="utf-8")
    result = in_process(
        "evaluate.py", "--checkpoint", model, "--split", "test", "--no-java", cwd=tmp_path, timeout=60
    )
    assert_one_line_error(result.returncode, result.stderr, str(model / "config.json"), needle)


def test_a_huge_integer_in_a_shards_json_names_the_shard_and_the_key(tmp_path):
    def huge(number: int, sample: dict) -> None:
        if number == 1:
            sample["json"] = '{"captions": ["a red picture"], "width": ' + "7" * 5000 + "}"

    write_img2dataset(tmp_path / "shards", shards=1, per_shard=3, edit=huge)
    with pytest.raises(DatasetError) as raised:
        load_records(_config(tmp_path / "shards"))
    assert "key '000000001': its json: an integer of more than 4300 digits" in str(raised.value)


# ------------------------------------------------------------------ sizes bounded by what they cost


@pytest.mark.slow  # a real process under a real memory cap (the import of torch is most of its time)
def test_a_brace_pattern_of_a_billion_shards_is_refused_under_a_memory_cap(tmp_path):
    write_img2dataset(tmp_path / "shards", shards=1, per_shard=2)
    pattern = str(tmp_path / "shards" / "{000000000..999999999}.tar")
    result = run_tool(  # the library alone would take 3 GB in 30 s before refusing
        "train.py",
        "--cache-only",
        "--no-progress",
        *as_flags({"data.dataset": "webdataset", "data.root": pattern}),
        *as_flags({"train.output_dir": tmp_path / "run"}),
        timeout=120,
        cwd=tmp_path,
        address_space=4 * 2**30,
    )
    assert_one_line_error(
        result.returncode, result.stderr, "data.root: names 1000000000 shards or more, beyond the 1000000"
    )
    assert not (tmp_path / "run").exists()


def test_a_brace_pattern_in_splits_json_is_bounded_before_it_is_expanded(tmp_path):
    write_img2dataset(tmp_path / "shards", shards=1, per_shard=2)
    splits = tmp_path / "shards" / "splits.json"
    splits.write_text(json.dumps({"train": ["{0..9}{0..99999}{0..99}.tar"]}), encoding="utf-8")
    with within(20), pytest.raises(ConfigError, match=r"split 'train': names 100000000 shards or more"):
        load_records(_config(tmp_path / "shards"))


def test_a_max_caption_length_beyond_its_bound_is_refused_before_any_work(shapes, tmp_path):
    result = in_process(
        "train.py",
        *short_run(shapes, tmp_path / "run", **{"data.max_caption_length": 1_000_000_000}),
        cwd=REPO,
        timeout=60,
    )
    assert_one_line_error(
        result.returncode, result.stderr, "data.max_caption_length must be in [1, 500]", "got 1000000000"
    )
    assert not (tmp_path / "run").exists()
