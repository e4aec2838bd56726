"""``train.py --cache-only`` over WebDataset shards (img2dataset's layout, ``data.dataset=webdataset``)
under a real 2-process ``torchrun`` (gloo on CPU): the cache is byte for byte the one a single process
builds, each rank encodes about half of the images, from a run of consecutive shards (neighbouring
ranks share at most the shard at the boundary); a rank stopped by a real SIGTERM mid-build leaves
rows the next launch keeps; and with ``data.skip_bad_images`` a shard's undecodable image and its
sample without a caption are counted once, as one process counts them."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cache_runs import (
    cache_files,
    cache_only,
    encoded,
    encoded_paths,
    forget_encoded,
    listed_shards,
    signal_rank_mid_build,
)
from shard_fixture import default_caption, write_img2dataset

from captioning.config import DataConfig
from captioning.data import load_records, tar_members

pytestmark = pytest.mark.slow
pytest.importorskip("webdataset")

SHARDS, PER_SHARD = 5, 32  # 160 samples: train 128, val 16, test 16, in one cache folder
ROWS = SHARDS * PER_SHARD
OVERRIDES = {
    "data.dataset": "webdataset",
    "data.num_workers": 0,
    "model.encoder.image_size": 64,
    "model.encoder.grid_size": 0,
}
UNDECODABLE, UNCAPTIONED = 123, 40  # samples (counted across shards) spoiled in the bad shard set


def _shards_of(paths: list[str]) -> list[int]:
    """The numbers of the shards ``<shard>.tar#<member>`` names point into, without repeats, sorted."""
    return sorted({int(tar_members.split_member(path)[0].stem) for path in paths})  # type: ignore[index]


def _config(overrides: dict) -> DataConfig:
    """The data configuration of ``overrides``, to read the records as the runs read them."""
    skip = overrides.get("data.skip_bad_images") == "true"
    return DataConfig(dataset="webdataset", root=str(overrides["data.root"]), skip_bad_images=skip)


@pytest.fixture(autouse=True)
def _no_kept_listings():
    yield
    tar_members.forget_all()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("distributed_shards")
    write_img2dataset(root / "shards", shards=SHARDS, per_shard=PER_SHARD)
    overrides = {**OVERRIDES, "data.root": root / "shards"}
    single = cache_only(root / "single", overrides, processes=1)
    assert single.returncode == 0, single.stderr[-3000:]
    return SimpleNamespace(root=root, overrides=overrides, single=root / "single")


def test_two_ranks_build_the_single_process_cache_each_from_its_own_run_of_shards(shards) -> None:
    folder = shards.root / "two"
    result = cache_only(folder, shards.overrides, processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(encoded(shards.single, 0)) == list(range(ROWS))
    ranks = [encoded(folder, 0), encoded(folder, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(ROWS))  # every row encoded once, by one rank
    assert all(abs(len(rows) - ROWS / 2) <= 8 for rows in ranks), [len(rows) for rows in ranks]
    assert cache_files(folder) == cache_files(shards.single)
    # Rank 0 reads the shards first and keeps their listings; rank 1 reads those, not the tar headers.
    assert sorted(listed_shards(folder, 0)) == [
        str(shards.root / "shards" / f"{k:05d}.tar") for k in range(SHARDS)
    ]
    assert listed_shards(folder, 1) == []

    # Each split's build gives each rank a run of consecutive shards; the two share at most one.
    split_of = {str(record.path): record.split for record in load_records(_config(shards.overrides))}
    runs = {
        split: [
            _shards_of([path for path in encoded_paths(folder, rank) if split_of[path] == split])
            for rank in (0, 1)
        ]
        for split in ("train", "val", "test")
    }
    for first, second in runs.values():
        assert first == list(range(first[-1] + 1)), runs  # rank 0 from the first shard on
        assert second == list(range(second[0], SHARDS)), runs  # rank 1 to the last
        assert second[0] - first[-1] in (0, 1), runs
    # 128 train images in 16 batches of 8: rank 0 encodes the first 64, 2.5 shards' worth (25.6 train
    # images a shard), so both ranks read from shard 2, each its own images of it.
    assert runs["train"] == [[0, 1, 2], [2, 3, 4]]


def test_a_rank_stopped_by_sigterm_mid_build_resumes_to_the_same_bytes(shards) -> None:
    folder = shards.root / "stopped"
    status, output = signal_rank_mid_build(folder, shards.overrides, signal.SIGTERM, after=24)
    assert status != 0, output[-3000:]
    states = np.fromfile(next((folder / "cache").glob("*/state.bin")), dtype=np.uint8)
    kept = set(np.flatnonzero(states == 1).tolist())
    assert 0 < len(kept) < ROWS  # rows of both ranks survived; some are left to do
    assert set(encoded(folder, 1)) & kept and set(encoded(folder, 0)) & kept

    forget_encoded(folder)
    result = cache_only(folder, shards.overrides, processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert listed_shards(folder, 0) == listed_shards(folder, 1) == []  # the kept listings serve both
    again = encoded(folder, 0) + encoded(folder, 1)
    assert sorted(again) == sorted(set(range(ROWS)) - kept)  # only the missing rows, each once
    assert encoded(folder, 0) and encoded(folder, 1)  # shared by both ranks again
    assert cache_files(folder) == cache_files(shards.single)


def test_a_bad_sample_and_an_undecodable_image_are_counted_once_by_two_ranks(tmp_path: Path) -> None:
    def spoil(number: int, sample: dict) -> None:
        if number == UNDECODABLE:
            sample["jpg"] = b"these bytes are not a JPEG"

    data = tmp_path / "shards"
    write_img2dataset(
        data,
        shards=SHARDS,
        per_shard=PER_SHARD,
        caption=lambda number: None if number == UNCAPTIONED else default_caption(number),
        edit=spoil,
    )
    overrides = {**OVERRIDES, "data.root": data, "data.skip_bad_images": "true"}
    records = load_records(_config(overrides))
    key = f"{UNDECODABLE // PER_SHARD:05d}{UNDECODABLE % PER_SHARD:04d}"  # the fixture's keys
    bad = next(record for record in records if str(record.path).endswith(f"#{key}.jpg"))
    assert len(records) == ROWS - 1 and bad.split == "train"

    runs = {processes: cache_only(tmp_path / f"p{processes}", overrides, processes) for processes in (1, 2)}
    for processes, result in runs.items():
        assert result.returncode == 0, (processes, result.stderr[-3000:])
    # The image is encoded once, by rank 1 (its train row is in the second half).
    assert str(bad.path) in encoded_paths(tmp_path / "p2", 1)
    assert str(bad.path) not in encoded_paths(tmp_path / "p2", 0)
    lines = {
        processes: [
            line for line in result.stderr.splitlines() if "skipped" in line or "could not be read" in line
        ]
        for processes, result in runs.items()
    }
    shard = data / f"{UNCAPTIONED // PER_SHARD:05d}.tar"
    assert [re.sub(r"/p[12]/", "/p/", line) for line in lines[2]] == [
        re.sub(r"/p[12]/", "/p/", line) for line in lines[1]
    ]
    assert len(lines[2]) == 2, lines[2]
    assert f"skipped 1 samples without a caption (first: {shard}: key" in lines[2][0]
    assert lines[2][1].startswith("1 of 128 images could not be read and have zero features")
    assert cache_files(tmp_path / "p2") == cache_files(tmp_path / "p1")
    index = json.loads(next((tmp_path / "p2" / "cache").glob("*/index.json")).read_text())
    assert list(index["bad"]) == [next(key for key in index["rows"] if key.startswith(f"{bad.image_id}:"))]
    assert str(bad.path) in next(iter(index["bad"].values()))
