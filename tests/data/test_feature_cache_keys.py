"""Feature cache keys and checks: images checked before anything is reserved, rows that survive moves,
orders and subsets, damaged caches, and the ranks of a torchrun job filling one cache together."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_faults import assert_one_line_error, karpathy_flags
from test_training import run_two_processes
from tool_runs import in_process

from captioning.config import EncoderConfig
from captioning.data import image_files
from captioning.data.coco import read_coco
from captioning.data.feature_cache import FeatureCache, FeatureCacheError
from captioning.data.images import ImageError
from captioning.data.karpathy import read_karpathy
from captioning.data.records import ImageRecord
from captioning.models.encoders import Encoder, build_encoder

pytestmark = pytest.mark.usefixtures("single_thread")

NUM_IMAGES = 6


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return build_encoder(
        EncoderConfig(name="efficientnet_lite0", weights="pretrained", image_size=64, grid_size=2)
    )


def _write_images(folder: Path, count: int = NUM_IMAGES) -> list[ImageRecord]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    records = []
    for i in range(count):
        path = folder / "sub" / f"{i:03d}.png"
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)).save(path)
        records.append(ImageRecord(image_id=100 + i, path=path, split="train"))
    return records


def _moved(records: list[ImageRecord], old_root: Path, new_root: Path) -> list[ImageRecord]:
    return [ImageRecord(r.image_id, new_root / r.path.relative_to(old_root), r.split) for r in records]


def _build(directory: Path, encoder: Encoder, records: list[ImageRecord], **kwargs) -> FeatureCache:
    return FeatureCache.build_or_open(directory, encoder, records, batch_size=4, progress=False, **kwargs)


def _grids(cache: FeatureCache) -> np.ndarray:
    return np.stack([cache[i] for i in range(len(cache))])


class _Counter:
    """Counts the images the encoder is run on."""

    def __init__(self, encoder: Encoder) -> None:
        self.images = 0
        self.handle = encoder.register_forward_hook(self)

    def __call__(self, module, inputs, output) -> None:
        self.images += inputs[0].shape[0]

    def __deepcopy__(self, memo: dict) -> _Counter:
        return self  # the cache runs a copy of the encoder (Encoder.inference_copy): count its images too


# ------------------------------------------------------------------ images checked first


def test_missing_images_are_refused_before_anything_is_created(tmp_path, encoder, caplog) -> None:
    records = _write_images(tmp_path / "images")
    records[2].path.unlink()
    records[4].path.unlink()
    records[5].path.unlink()
    records[5].path.mkdir()  # a folder where an image should be: not a regular file
    with pytest.raises(ImageError) as caught:
        _build(tmp_path / "cache", encoder, records)
    message = str(caught.value)  # the first file and its entry, how many more, the key to check
    assert message.startswith(f"{records[2].path} (image 102): ")
    assert all(needle in message for needle in ("not found", "2 more of the 6", "data.root")), message
    assert not (tmp_path / "cache").exists()
    # skipping: zero grids, no row
    with caplog.at_level(logging.WARNING, logger="captioning.data.feature_cache"):
        cache = _build(tmp_path / "cache", encoder, records, skip_bad_images=True)
    assert "3 of 6 images could not be read" in caplog.text
    assert set(cache.bad) == {2, 4, 5} and "is a directory" in cache.bad[5] and not cache[4].any()
    assert cache.computed == 3


def test_train_with_a_mistyped_root_names_the_first_missing_image(karpathy_dataset, tmp_path) -> None:
    split_file, root = karpathy_dataset
    wrong_root = root.parent / "cocoo"
    flags = karpathy_flags(split_file, wrong_root, tmp_path / "run", **{"data.cache_dir": tmp_path / "cache"})
    result = in_process("train.py", "--no-progress", "--no-test", *flags)  # no such folder
    assert_one_line_error(result.returncode, result.stderr, f"error: {wrong_root}", "data.root")
    wrong_root.mkdir()  # a folder without the images
    result = in_process("train.py", "--no-progress", "--no-test", *flags)
    assert_one_line_error(
        result.returncode,
        result.stderr,
        f"error: {wrong_root / 'train2014' / 'COCO_train2014_000000000009.jpg'} (image 9)",
        "data.root",
        alone=False,
    )
    assert not list((tmp_path / "cache").glob("*/features.npy"))  # nothing reserved (only the dataset index)


# ------------------------------------------------------------------ rows that survive moves


def test_moved_and_copied_images_reuse_every_row(tmp_path, encoder, monkeypatch) -> None:
    records = _write_images(tmp_path / "images")
    first = _build(tmp_path / "cache", encoder, records)
    counter = _Counter(encoder)
    hashes = {"n": 0}
    real_identity = image_files.content_identity

    def counting_identity(path, size):
        hashes["n"] += 1
        return real_identity(path, size)

    monkeypatch.setattr("captioning.data.cache_build.content_identity", counting_identity)
    again = _build(tmp_path / "cache", encoder, records)
    assert hashes["n"] == 0  # a restart stats the files and reuses their recorded hashes

    os.rename(tmp_path / "images", tmp_path / "moved")
    moved = _build(tmp_path / "cache", encoder, _moved(records, tmp_path / "images", tmp_path / "moved"))
    shutil.copytree(tmp_path / "moved", tmp_path / "copy", copy_function=shutil.copy)  # new times
    copied_records = _moved(records, tmp_path / "images", tmp_path / "copy")
    assert (
        os.stat(copied_records[0].path).st_mtime_ns
        != os.stat(tmp_path / "moved" / "sub" / "000.png").st_mtime_ns
    )
    copied = _build(tmp_path / "cache", encoder, copied_records)
    counter.handle.remove()
    assert counter.images == 0 and again.computed == moved.computed == copied.computed == 0
    assert hashes["n"] == 2 * NUM_IMAGES  # moved and copied files hashed once each
    assert first.path == moved.path == copied.path
    np.testing.assert_array_equal(_grids(copied), _grids(first))
    index = json.loads((first.path / "index.json").read_text())
    # moved ones dropped
    assert sorted(index["files"]) == sorted(os.path.abspath(r.path) for r in copied_records)


def test_other_orders_and_subsets_reuse_rows_and_new_images_are_appended(tmp_path, encoder) -> None:
    records = _write_images(tmp_path / "images", 8)
    first = _build(tmp_path / "cache", encoder, records[:6])
    counter = _Counter(encoder)
    reversed_cache = _build(tmp_path / "cache", encoder, records[5::-1])
    subset = _build(tmp_path / "cache", encoder, records[1:4])
    assert counter.images == 0 and reversed_cache.path == subset.path == first.path
    np.testing.assert_array_equal(_grids(reversed_cache), _grids(first)[::-1])
    np.testing.assert_array_equal(_grids(subset), _grids(first)[1:4])

    grown = _build(tmp_path / "cache", encoder, records)
    counter.handle.remove()
    assert counter.images == 2 and grown.computed == 2  # only the two new images
    np.testing.assert_array_equal(_grids(grown)[:6], _grids(first))
    single = _build(tmp_path / "single", encoder, records)
    np.testing.assert_array_equal(_grids(grown), _grids(single))
    assert np.load(first.path / "features.npy", mmap_mode="r").shape[0] == 8


def test_the_official_annotations_reuse_the_rows_of_karpathys_file(
    karpathy_dataset, coco_dataset, tmp_path, encoder
) -> None:
    split_file, root = karpathy_dataset
    annotation_files, coco_root = coco_dataset
    assert coco_root == root  # the same image files, described by the official annotations
    from_karpathy = _build(tmp_path / "cache", encoder, read_karpathy(split_file, root))
    counter = _Counter(encoder)
    official = read_coco(annotation_files, root)
    from_official = _build(tmp_path / "cache", encoder, official)
    counter.handle.remove()
    assert counter.images == 0 and from_official.path == from_karpathy.path
    assert [r.image_id for r in official] == [9, 25, 30, 42, 73]
    np.testing.assert_array_equal(_grids(from_official), _grids(from_karpathy))


def test_a_changed_image_recomputes_only_its_row(tmp_path, encoder) -> None:
    records = _write_images(tmp_path / "images")
    first = _build(tmp_path / "cache", encoder, records)
    Image.new("RGB", (48, 40), (0, 0, 250)).save(records[3].path)  # rewritten in place
    counter = _Counter(encoder)
    second = _build(tmp_path / "cache", encoder, records)
    counter.handle.remove()
    assert counter.images == 1 and second.computed == 1 and second.path == first.path
    changed = [i for i in range(NUM_IMAGES) if not np.array_equal(second[i], first[i])]
    assert changed == [3]
    np.testing.assert_array_equal(_grids(second), _grids(_build(tmp_path / "fresh", encoder, records)))


# ------------------------------------------------------------------ damaged caches


@pytest.fixture
def built(tmp_path, encoder) -> tuple[list[ImageRecord], FeatureCache, np.ndarray]:
    records = _write_images(tmp_path / "images")
    cache = _build(tmp_path / "cache", encoder, records)
    return records, cache, _grids(cache)


def test_a_truncated_features_file_recomputes_the_rows_it_lost(built, tmp_path, encoder, caplog) -> None:
    records, cache, grids = built
    features = cache.path / "features.npy"
    row_bytes = 4 * encoder.channels * 2
    with open(features, "r+b") as handle:  # keep the header and two and a half rows
        handle.truncate(128 + 2 * row_bytes + row_bytes // 2)
    counter = _Counter(encoder)
    with caplog.at_level(logging.WARNING, logger="captioning.data.feature_cache"):
        repaired = _build(tmp_path / "cache", encoder, records)
    counter.handle.remove()
    size = 128 + 2 * row_bytes + row_bytes // 2
    assert [r.getMessage() for r in caplog.records] == [
        (
            f"{features}: truncated: {size} bytes, 6 rows need {128 + 6 * row_bytes}; "
            "recomputing the 4 rows it lost"
        )
    ]
    assert counter.images == 4 and repaired.computed == 4
    np.testing.assert_array_equal(_grids(repaired), grids)


def test_rows_beyond_the_features_file_are_recomputed(built, tmp_path, encoder, caplog) -> None:
    records, cache, grids = built
    index_path = cache.path / "index.json"
    index = json.loads(index_path.read_text())
    key = next(k for k, row in index["rows"].items() if row == 2)
    index["capacity"], index["rows"][key] = 8, 7  # the index claims two rows the file does not hold
    index_path.write_text(json.dumps(index))
    counter = _Counter(encoder)
    with caplog.at_level(logging.WARNING, logger="captioning.data.feature_cache"):
        repaired = _build(tmp_path / "cache", encoder, records)
    counter.handle.remove()
    assert f"{cache.path / 'features.npy'}: holds 6 rows, the index describes 8" in caplog.text
    assert counter.images == 1 and repaired.rows[2] == 7
    np.testing.assert_array_equal(_grids(repaired), grids)


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        (
            lambda text: text[: text.index('"rows"') + 3],
            "not valid JSON (Unterminated string",
        ),  # cut inside a key
        (
            lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "rows"}),
            "missing field 'rows'",
        ),
        (lambda text: json.dumps({**json.loads(text), "capacity": "6"}), "field 'capacity' must be int"),
        (lambda text: json.dumps({**json.loads(text), "capacity": 3}), "rows outside the 3 allocated ones"),
        (
            lambda text: json.dumps({**json.loads(text), "capacity": 10**13}),
            f"capacity {10**13} does not match its rows (the last is row 5)",
        ),
    ],
)
def test_a_damaged_index_is_refused_saying_how_to_clear_it(built, tmp_path, encoder, edit, what) -> None:
    records, cache, _ = built
    index_path = cache.path / "index.json"
    index_path.write_text(edit(index_path.read_text()))
    counter = _Counter(encoder)
    with pytest.raises(FeatureCacheError) as caught:
        _build(tmp_path / "cache", encoder, records)
    counter.handle.remove()
    message = str(caught.value)
    assert message.startswith(f"{index_path}: damaged feature cache index: {what}")
    assert message.endswith(f"; delete the folder {cache.path} to rebuild this cache") and "\n" not in message
    assert counter.images == 0


# ------------------------------------------------------------------ ranks filling one cache

_RANK_SCRIPT = """
import json, sys
from pathlib import Path
import numpy as np
import torch
import torch.distributed as dist
from captioning.config import EncoderConfig
from captioning.data import cache_build
from captioning.data.feature_cache import FeatureCache
from captioning.data.records import ImageRecord
from captioning.models.encoders import build_encoder

hashed = []
identity = cache_build.content_identity
cache_build.content_identity = lambda path, size: hashed.append(str(path)) or identity(path, size)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
images, cache_dir, out = map(Path, sys.argv[1:4])
records = [ImageRecord(100 + i, path, "train") for i, path in enumerate(sorted(images.glob("sub/*.png")))]
encoder = build_encoder(
    EncoderConfig(name="efficientnet_lite0", weights="pretrained", image_size=64, grid_size=2)
)
cache = FeatureCache.build_or_open(cache_dir, encoder, records, batch_size=2, progress=False, rank=rank,
                                   world_size=world_size)
np.save(out / f"rank{rank}.npy", np.stack([cache[i] for i in range(len(cache))]))
(out / f"rank{rank}.json").write_text(json.dumps({"computed": cache.computed, "hashed": hashed}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_torchrun_processes_fill_one_cache_together(tmp_path, encoder) -> None:
    records = _write_images(tmp_path / "images", 7)
    _build(tmp_path / "cache", encoder, records[:2])  # two rows exist: five are left to share
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    result = run_two_processes(script, tmp_path / "images", tmp_path / "cache", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [report["computed"] for report in reports] == [
        2,
        3,
    ]  # each rank its share of the five missing rows
    # each new file was read once, by one rank: rank 0 did not hash them all while rank 1 waited
    hashed = [sorted(Path(path).name for path in report["hashed"]) for report in reports]
    assert hashed == [["002.png", "004.png", "006.png"], ["003.png", "005.png"]]
    single = _grids(_build(tmp_path / "single", encoder, records))
    for rank in (0, 1):
        np.testing.assert_allclose(
            np.load(tmp_path / f"rank{rank}.npy").astype(np.float32),
            single.astype(np.float32),
            rtol=1e-3,
            atol=1e-3,
        )
    counter = _Counter(encoder)
    reopened = _build(tmp_path / "cache", encoder, records)
    counter.handle.remove()
    assert counter.images == 0 and reopened.computed == 0  # the index rank 0 wrote covers every row
