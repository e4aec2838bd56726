"""Feature cache: reuse, equality with the encoder, keys, resume after a kill, full disk, bad images,
two processes building the same cache at once. Row keys that survive moves, and damaged caches, are
in test_feature_cache_keys.py."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import multiprocessing
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from messages import raises_naming
from PIL import Image
from torch.utils.data import DataLoader

from captioning.config import EncoderConfig
from captioning.data import cache_build, feature_cache
from captioning.data.datasets import CaptionDataset, collate_captions
from captioning.data.feature_cache import FeatureCache
from captioning.data.images import ImageError, load_image
from captioning.data.records import ImageRecord
from captioning.data.vocab import Vocabulary
from captioning.inference.batches import annotations_of
from captioning.models.encoders import Encoder, build_encoder

NUM_IMAGES = 10
BATCH = 4  # batches of rows 0-3, 4-7, 8-9


def _encoder(image_size: int = 64, grid_size: int = 2) -> Encoder:
    return build_encoder(
        EncoderConfig(
            name="efficientnet_lite0", weights="pretrained", image_size=image_size, grid_size=grid_size
        )
    )


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return _encoder()


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[ImageRecord]:
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    out = []
    for i in range(NUM_IMAGES):
        pixels = rng.integers(0, 256, size=(40 + 4 * i, 56, 3), dtype=np.uint8)
        path = folder / f"{i:03d}.png"
        Image.fromarray(pixels).save(path)
        out.append(ImageRecord(image_id=i, path=path, split="train"))
    return out


@pytest.fixture(scope="module")
def reference(encoder: Encoder, records: list[ImageRecord]) -> np.ndarray:
    """The encoder run directly, image by image: (N, P, C) float32."""
    encoder.eval()
    with torch.inference_mode():
        return np.stack([encoder(encoder.transform(load_image(r.path))[None])[0].numpy() for r in records])


class _ForwardCounter:
    def __init__(self, encoder: Encoder) -> None:
        self.calls = 0
        self.handle = encoder.register_forward_hook(self)

    def __call__(self, *args) -> None:
        self.calls += 1

    def __deepcopy__(self, memo: dict) -> _ForwardCounter:
        return self  # the cache runs a copy of the encoder (Encoder.inference_copy): count its passes too


def _build(directory: Path, encoder: Encoder, records: list[ImageRecord], **kwargs) -> FeatureCache:
    return FeatureCache.build_or_open(directory, encoder, records, batch_size=BATCH, progress=False, **kwargs)


def _interrupt_at_image(monkeypatch: pytest.MonkeyPatch, calls_before_interrupt: int) -> None:
    """Make the (calls_before_interrupt + 1)-th image load raise KeyboardInterrupt, as a kill would."""
    calls = {"n": 0}

    def load(path, entry=None):
        calls["n"] += 1
        if calls["n"] > calls_before_interrupt:
            raise KeyboardInterrupt
        return load_image(path, entry=entry)

    monkeypatch.setattr(cache_build, "load_image", load)


def _index(cache_dir: Path) -> dict:
    (path,) = cache_dir.glob("*/index.json")
    return json.loads(path.read_text())


def _computed_rows(cache_dir: Path) -> int:
    """Rows whose features are on disk (their state byte says computed)."""
    (path,) = cache_dir.glob("*/state.bin")
    return int((np.fromfile(path, dtype=np.uint8) == 1).sum())


def test_built_once_then_reused(tmp_path: Path, encoder: Encoder, records, reference) -> None:
    counter = _ForwardCounter(encoder)
    cache = _build(tmp_path, encoder, records)
    assert counter.calls == 3
    assert len(cache) == NUM_IMAGES and cache.shape == (NUM_IMAGES, 4, encoder.channels)
    assert cache[0].dtype == np.float16 and cache[0].shape == (4, encoder.channels)
    np.testing.assert_allclose(
        np.stack([cache[i] for i in range(len(cache))]), reference, rtol=2e-3, atol=2e-3
    )
    index = _index(tmp_path)
    assert (index["capacity"], len(index["rows"]), index["key"]["dtype"]) == (
        NUM_IMAGES,
        NUM_IMAGES,
        "float16",
    )
    assert index["key"]["fingerprint"] == encoder.fingerprint() and index["bad"] == {}
    assert _computed_rows(tmp_path) == NUM_IMAGES and cache.computed == NUM_IMAGES
    assert np.load(cache.path / "features.npy", mmap_mode="r").shape == (NUM_IMAGES, 4, encoder.channels)

    reopened = _build(tmp_path, encoder, records)
    assert counter.calls == 3 and reopened.computed == 0  # reused: the encoder did not run
    assert reopened.path == cache.path
    np.testing.assert_array_equal(reopened[7], cache[7])
    counter.handle.remove()
    # Workers started by spawn get the path, not a pickled copy of the array.
    pickled = pickle.dumps(reopened)
    assert len(pickled) < 4096
    np.testing.assert_array_equal(pickle.loads(pickled)[3], cache[3])


@pytest.mark.slow
def test_changed_encoder_makes_new_caches(tmp_path: Path, encoder: Encoder, records) -> None:
    first = _build(tmp_path, encoder, records)
    bigger = _build(tmp_path, _encoder(image_size=96), records)
    coarser = _build(tmp_path, _encoder(grid_size=1), records)
    assert len({first.path, bigger.path, coarser.path}) == 3
    assert coarser.shape == (NUM_IMAGES, 1, encoder.channels)
    assert len(list(tmp_path.glob("*/index.json"))) == 3  # all coexist
    assert not np.array_equal(bigger[0], first[0])


@pytest.mark.slow
def test_resumes_after_interruption(
    tmp_path: Path, encoder: Encoder, records, reference, monkeypatch
) -> None:
    _interrupt_at_image(monkeypatch, 6)  # during the second batch
    with pytest.raises(KeyboardInterrupt):
        _build(tmp_path, encoder, records)
    assert _computed_rows(tmp_path) == 4
    monkeypatch.undo()

    counter = _ForwardCounter(encoder)
    cache = _build(tmp_path, encoder, records)
    assert counter.calls == 2  # rows 4-7 and 8-9 only
    counter.handle.remove()
    uninterrupted = _build(tmp_path / "clean", encoder, records)
    resumed = np.stack([cache[i] for i in range(NUM_IMAGES)])
    np.testing.assert_array_equal(resumed, np.stack([uninterrupted[i] for i in range(NUM_IMAGES)]))
    np.testing.assert_allclose(resumed, reference, rtol=2e-3, atol=2e-3)


def test_full_disk_while_writing_the_index_keeps_the_previous_one(
    tmp_path: Path, encoder: Encoder, records, monkeypatch
) -> None:
    _build(tmp_path, encoder, records[:4])
    (index_path,) = tmp_path.glob("*/index.json")
    before = index_path.read_bytes()
    counter = _ForwardCounter(encoder)

    def full_disk(source, destination):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)  # the index of the six new rows cannot be written
    with raises_naming(OSError, tmp_path, "index.json", "data.cache_dir") as caught:
        _build(tmp_path, encoder, records)
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC and counter.calls == 0  # before any work
    assert index_path.read_bytes() == before and len(json.loads(before)["rows"]) == 4
    assert not list(tmp_path.glob("*/*.tmp"))
    assert _build(tmp_path, encoder, records).computed == NUM_IMAGES - 4
    counter.handle.remove()


def test_full_disk_at_allocation_says_how_much_is_needed(
    tmp_path: Path, encoder: Encoder, records, monkeypatch
) -> None:
    if not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate on this platform")

    def full_disk(descriptor, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full_disk)
    with pytest.raises(OSError, match=r"features.npy \(needs 128 bytes\)"):
        _build(tmp_path, encoder, records)


@pytest.fixture
def records_with_bad_image(tmp_path: Path, records) -> list[ImageRecord]:
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    return [*records[:5], ImageRecord(image_id=99, path=broken, split="train"), *records[5:]]


def test_bad_image_stops_the_build_naming_the_file(tmp_path: Path, encoder, records_with_bad_image) -> None:
    with pytest.raises(ImageError, match=r"broken.png \(image 99\)"):
        _build(tmp_path / "cache", encoder, records_with_bad_image)
    assert _computed_rows(tmp_path / "cache") == 4  # the first batch is kept


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_image_skipped_and_recorded(
    tmp_path: Path, encoder, records_with_bad_image, reference, num_workers: int, caplog
) -> None:
    with caplog.at_level(logging.WARNING, logger="captioning.data.feature_cache"):
        cache = _build(
            tmp_path, encoder, records_with_bad_image, skip_bad_images=True, num_workers=num_workers
        )
    assert "1 of 11 images could not be read" in caplog.text
    assert set(cache.bad) == {5} and "broken.png" in cache.bad[5]
    assert not cache[5].any()
    good = np.stack([cache[i] for i in range(len(cache)) if i != 5])
    np.testing.assert_allclose(good, reference, rtol=2e-3, atol=2e-3)
    ((key, message),) = _index(tmp_path)["bad"].items()
    assert key.startswith("99:") and "broken.png (image 99)" in message


def _wait_for(condition, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _build_in_child(
    cache_dir: Path, encoder: Encoder, records: list[ImageRecord], role: str, folder: Path
) -> None:
    """Forked child: build the cache, counting forward passes and logging to ``folder/<role>.log``.

    "first" pauses in its second forward pass (rows 0-3 are on disk) until ``folder/go`` exists;
    "second" starts building only once "first" is paused there, and marks any forward pass it makes.
    """
    torch.set_num_threads(1)  # two processes on the test machine's cores; no OpenMP pool after fork
    log = logging.getLogger(feature_cache.__name__)
    log.setLevel(logging.INFO)
    log.addHandler(logging.FileHandler(folder / f"{role}.log"))
    calls = {"n": 0}

    def before_forward(module, inputs) -> None:
        calls["n"] += 1
        if role == "second":
            (folder / "second_ran").touch()
        elif calls["n"] == 2:
            (folder / "first_paused").touch()
            _wait_for((folder / "go").exists)

    encoder.register_forward_pre_hook(before_forward)
    if role == "second":
        assert _wait_for((folder / "first_paused").exists)
    cache = _build(cache_dir, encoder, records)
    np.save(folder / f"{role}.npy", np.stack([cache[i] for i in range(len(cache))]))
    (folder / f"{role}.json").write_text(json.dumps({"calls": calls["n"], "path": str(cache.path)}))


def test_concurrent_builds_take_turns(tmp_path: Path, encoder: Encoder, records, reference) -> None:
    # Two independent runs (a sweep) build the same cache at once: the second must neither truncate
    # the file the first is filling nor rebuild it, but wait for it and reuse the complete cache.
    context = multiprocessing.get_context("fork")
    cache_dir, folder = tmp_path / "cache", tmp_path / "ipc"
    folder.mkdir()
    children = {
        role: context.Process(target=_build_in_child, args=(cache_dir, encoder, records, role, folder))
        for role in ("first", "second")
    }

    def second_waits_or_builds() -> bool:
        log = folder / "second.log"
        return (
            (folder / "second_ran").exists()
            or not children["second"].is_alive()
            or (log.exists() and "waiting" in log.read_text())
        )

    try:
        for child in children.values():
            child.start()
        # Hold the first mid-build until the second waits for the lock (or, unguarded, builds too).
        _wait_for(second_waits_or_builds)
        (folder / "go").touch()
        for child in children.values():
            child.join(60)
        assert [child.exitcode for child in children.values()] == [0, 0]
    finally:
        for child in children.values():
            if child.is_alive():
                child.kill()
                child.join()

    first, second = (json.loads((folder / f"{role}.json").read_text()) for role in ("first", "second"))
    assert first["calls"] == 3 and second["calls"] == 0  # the second reused the first's cache
    assert first["path"] == second["path"]
    assert (
        "waiting for another process building the same feature cache in " + first["path"]
        in (folder / "second.log").read_text()
    )
    assert "waiting" not in (folder / "first.log").read_text()
    assert _computed_rows(cache_dir) == NUM_IMAGES

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the children: the same summation order, the same float16 rows
    try:
        single = _build(tmp_path / "single", encoder, records)
    finally:
        torch.set_num_threads(threads)
    expected = np.stack([single[i] for i in range(NUM_IMAGES)])
    for role in ("first", "second"):
        features = np.load(folder / f"{role}.npy")
        np.testing.assert_array_equal(features, expected)
        assert all(row.any() for row in features)
    np.testing.assert_allclose(expected, reference, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_loader_reads_a_batch_of_cached_grids_into_one_float16_buffer(
    tmp_path: Path, encoder: Encoder, records, workers: int
) -> None:
    cache = _build(tmp_path, encoder, records)
    captioned = [dataclasses.replace(r, captions=(("a", "red", "shape"), ("a", "shape"))) for r in records]
    vocab = Vocabulary.build([c for r in captioned for c in r.captions], min_count=1)
    dataset = CaptionDataset(
        captioned, vocab, max_length=5, captions_per_image=2, features=cache, unreadable={3}
    )
    loader = DataLoader(
        dataset, batch_sampler=[[5, 0, 3, 7]], collate_fn=collate_captions, num_workers=workers
    )
    batch = next(iter(loader))
    assert batch["indices"].tolist() == [5, 0, 7]  # the unreadable image is left out
    # float16 as stored: the float32 copy is made once per batch, on the device (annotations_of)
    assert batch["features"].dtype == torch.float16
    expected = torch.from_numpy(np.stack([cache[5], cache[0], cache[7]]))  # (B, P, C)
    assert torch.equal(batch["features"], expected)
    one_by_one = collate_captions([dataset[i] for i in (5, 0, 7)])
    assert set(one_by_one) == set(batch)
    assert all(torch.equal(one_by_one[key], batch[key]) for key in batch)
    assert torch.equal(annotations_of(None, batch), expected.float())
