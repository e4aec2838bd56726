"""``train.py --cache-only`` under a real 2-process ``torchrun`` (gloo on CPU): each rank encodes about
half of the images, the cache is byte for byte the one a single process builds, and a rank killed
mid-build leaves rows that the next launch keeps, encoding only the missing ones."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import numpy as np
import pytest
from cache_runs import cache_files, cache_only, encoded, forget_encoded, signal_rank_mid_build

from captioning.data.shapes import generate_shapes

pytestmark = pytest.mark.slow

IMAGES = 160  # train images; 4 val and 4 test are appended to the same cache folder
ROWS = IMAGES + 8


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("distributed_cache")
    data = root / "data"
    generate_shapes(data, seed=0, num_train=IMAGES, num_val=4, num_test=4, image_size=64)
    overrides = {
        "data.root": data,
        "data.shapes_train": IMAGES,
        "data.shapes_val": 4,
        "data.shapes_test": 4,
        "data.shapes_image_size": 64,
        "data.num_workers": 0,
        "model.encoder.image_size": 64,
        "model.encoder.grid_size": 0,
    }
    single = cache_only(root / "single", overrides, processes=1)
    assert single.returncode == 0, single.stderr[-3000:]
    return SimpleNamespace(root=root, overrides=overrides, single=root / "single")


def test_two_ranks_build_the_single_process_cache_each_encoding_half(shapes) -> None:
    folder = shapes.root / "two"
    result = cache_only(folder, shapes.overrides, processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert encoded(shapes.single, 0) and sorted(encoded(shapes.single, 0)) == list(range(ROWS))
    ranks = [encoded(folder, 0), encoded(folder, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(ROWS))  # every row encoded once, by one rank
    assert all(abs(len(rows) - ROWS / 2) <= 8 for rows in ranks), [len(rows) for rows in ranks]
    assert cache_files(folder) == cache_files(shapes.single)


def test_a_rank_killed_mid_build_resumes_to_the_same_bytes(shapes) -> None:
    folder = shapes.root / "killed"
    status, output = signal_rank_mid_build(folder, shapes.overrides, signal.SIGKILL, after=24)
    assert status != 0, output[-3000:]
    states = np.fromfile(next((folder / "cache").glob("*/state.bin")), dtype=np.uint8)
    kept = set(np.flatnonzero(states == 1).tolist())
    assert 0 < len(kept) < IMAGES  # rows of both ranks survived the kill; some are left to do

    forget_encoded(folder)
    result = cache_only(folder, shapes.overrides, processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    again = encoded(folder, 0) + encoded(folder, 1)
    assert sorted(again) == sorted(set(range(ROWS)) - kept)  # only the missing rows, each once
    assert encoded(folder, 0) and encoded(folder, 1)  # shared by both ranks again
    assert cache_files(folder) == cache_files(shapes.single)
