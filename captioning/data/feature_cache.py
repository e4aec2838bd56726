"""On-disk cache of frozen-encoder grid features: the CNN runs once per image.

Layout of one cache (a sub-directory of the cache folder named by a short hash of its key, so caches
for several encoders, image sizes or image lists coexist)::

    <directory>/<key hash>/features.npy   float16 (N, P, C), memory-mapped
    <directory>/<key hash>/images.json    the image list, in order (written once)
    <directory>/<key hash>/index.json     key, shape, dtype, completed rows, unreadable images
    <directory>/<key hash>/build.lock     advisory lock held while a process builds the cache

The key is the encoder's ``fingerprint()`` plus the sha256 of the image list. Rows are flushed to
disk before ``index.json`` is atomically replaced (temp file, fsync, ``os.replace``) after each
batch, so a killed build loses at most the batch in flight and resumes from ``completed``.

Independent processes (e.g. the runs of a sweep sharing the default cache folder) building the same
cache take turns on an exclusive ``flock`` of ``build.lock``: the second waits for the first and then
reuses its cache (or resumes it, if the first died: the OS releases the lock with the process).
Opening a complete cache takes no lock.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from captioning.data.images import ImageError, load_image
from captioning.data.records import ImageRecord
from captioning.models.encoders import Encoder

try:
    import fcntl
except ImportError:  # not POSIX: concurrent builds of one cache are not guarded
    fcntl = None

logger = logging.getLogger(__name__)

INDEX_VERSION = 1
_DTYPE = np.float16
_LOCK_NAME = "build.lock"


class _ImageFiles(Dataset):
    """Records ``start..`` as (row, image (3, S, S), error message or ""); never raises ImageError.

    Read errors are returned, not raised, so the main process decides (skip or stop) and the message
    stays one line even when the image was read in a worker process.
    """

    def __init__(self, records: list[ImageRecord], start: int, transform: Any, image_size: int) -> None:
        self.records = records
        self.start = start
        self.transform = transform
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.records) - self.start

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, str]:
        row = self.start + index
        record = self.records[row]
        try:
            image = self.transform(load_image(record.path, entry=f"image {record.image_id}"))
        except ImageError as error:
            return row, torch.zeros(3, self.image_size, self.image_size), str(error)
        return row, image, ""


def _file_state(path: Path) -> str:
    """Size and modification time: an image rewritten in place (e.g. Shapes with another seed) changes the key."""
    try:
        stat = os.stat(path)
    except OSError:
        return "missing"
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _image_list(records: list[ImageRecord]) -> list[str]:
    return [f"{record.image_id}\t{os.path.abspath(record.path)}\t{_file_state(record.path)}" for record in records]


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()


def _no_space(error: OSError, what: Path, needed: str = "") -> OSError:
    return OSError(errno.ENOSPC, f"no space left on device writing the feature cache {what}{needed}; "
                                 "free space or set data.cache_dir to another disk (the previous "
                                 "index is intact and the build resumes from it)")


def _write_json_atomic(path: Path, value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON: a crash or a full disk leaves the old file intact."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            json.dump(value, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        if error.errno == errno.ENOSPC:
            raise _no_space(error, path) from error
        raise
    if os.name == "posix":
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # make the rename itself durable
        finally:
            os.close(directory)


def _read_index(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _allocate(path: Path, shape: tuple[int, int, int]) -> None:
    """Create the .npy file at full size, reserving the disk space now.

    Writing through a memory map into a sparse file on a full disk kills the process with SIGBUS;
    reserving the blocks up front turns that into an ENOSPC error here, before any work is done.
    """
    array = np.lib.format.open_memmap(path, mode="w+", dtype=_DTYPE, shape=shape)
    offset = array.offset
    del array
    size = offset + int(np.prod(shape)) * np.dtype(_DTYPE).itemsize
    if hasattr(os, "posix_fallocate"):
        descriptor = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(descriptor, 0, size)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise _no_space(error, path, f" (needs {size / 2**30:.1f} GiB)") from error
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate on this filesystem
                raise
        finally:
            os.close(descriptor)


@contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path/build.lock``, waiting (with one INFO line) if it is taken.

    ``flock`` locks die with their process, so a crashed builder never leaves the cache locked.
    """
    if fcntl is None:
        yield
        return
    descriptor = os.open(path / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    locked = False
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process building the same feature cache in %s", path)
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        locked = True
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(descriptor)
            raise
        warnings.warn(f"cannot lock {path / _LOCK_NAME} ({error.strerror}): processes building this "
                      "feature cache at the same time are not kept apart", stacklevel=3)
    try:
        yield
    finally:
        if locked:  # unlock explicitly: forked DataLoader workers may still hold a copy of the descriptor
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


def _matches(index: dict[str, Any] | None, key: dict[str, Any], shape: tuple[int, int, int],
             path: Path) -> bool:
    """Whether ``index`` describes an allocated cache of ``key`` and ``shape`` (complete or not)."""
    return bool(index and index.get("version") == INDEX_VERSION and index.get("key") == key
                and (index["count"], index["positions"], index["channels"]) == shape
                and (path / "features.npy").is_file())


class FeatureCache:
    """Read access to a complete cache: ``cache[i]`` is the (P, C) float16 grid of ``records[i]``.

    Build or reopen one with ``FeatureCache.build_or_open``.

    Attributes:
        path: the cache's own sub-directory.
        shape: (N, P, C).
        bad: row -> error message of images that could not be read (their rows are zeros).
    """

    def __init__(self, path: Path, index: dict[str, Any]) -> None:
        self.path = path
        self.shape: tuple[int, int, int] = (index["count"], index["positions"], index["channels"])
        self.bad: dict[int, str] = {entry["row"]: entry["error"] for entry in index["bad"]}
        self.fingerprint: dict[str, Any] = index["fingerprint"]
        self._features: np.ndarray | None = None  # (N, P, C) float16 memory map, opened on first use

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, row: int) -> np.ndarray:
        """The (P, C) float16 annotation vectors of image ``row`` (a copy, safe across workers)."""
        if self._features is None:
            self._features = np.load(self.path / "features.npy", mmap_mode="r")
        return np.array(self._features[row])

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers started by spawn/forkserver get the path, not a pickled copy of the array.
        return {**self.__dict__, "_features": None}

    @classmethod
    def build_or_open(cls, directory: str | Path, encoder: Encoder, records: list[ImageRecord],
                      batch_size: int = 32, device: str | torch.device = "cpu", num_workers: int = 0,
                      progress: bool = True, skip_bad_images: bool = False, build: bool = True) -> FeatureCache | None:
        """Open the cache of ``encoder`` over ``records``, computing whatever rows are missing.

        A complete cache with the same key is reused without running the encoder (and without a
        lock); a partial one (an interrupted build) resumes at its first incomplete row; a new key
        starts a new cache. Building holds an exclusive lock on the cache's ``build.lock``: another
        process building the same cache at the same time waits for it, then reuses the result.

        Args:
            directory: the cache folder (each key gets its own sub-directory).
            encoder: a frozen encoder; it is moved to ``device`` and run in eval mode.
            records: the images, in the order of the rows.
            batch_size: images per forward pass (and per index update).
            device: where the encoder runs.
            num_workers: DataLoader worker processes reading and transforming images.
            progress: show a tqdm progress bar.
            skip_bad_images: give unreadable images a zero row and list them in the index (with a
                warning) instead of raising.
            build: False opens a complete cache only, writing nothing (a folder the user did not
                choose, e.g. one named in a checkpoint).
        Returns:
            The complete ``FeatureCache``, rows in the order of ``records``; None when ``build`` is
            False and there is no complete cache.
        Raises:
            ImageError: an image cannot be read (without ``skip_bad_images``); rows before its batch
                are kept. Also when an existing cache lists unreadable images and ``skip_bad_images``
                is off.
            OSError: the disk is full (ENOSPC, with a message naming the file); the index is intact.
        """
        if not records:
            raise ValueError("cannot build a feature cache over an empty image list")
        images = _image_list(records)
        images_sha256 = _sha256_json(images)
        fingerprint = encoder.fingerprint()
        key = {"fingerprint": fingerprint, "images_sha256": images_sha256}
        path = Path(directory) / _sha256_json(key)[:16]
        index_path = path / "index.json"
        shape = (len(records), encoder.grid[0] * encoder.grid[1], encoder.channels)

        index = _read_index(index_path)
        if not (_matches(index, key, shape, path) and index["completed"] == shape[0]):
            if not build:
                return None
            path.mkdir(parents=True, exist_ok=True)
            with _build_lock(path):
                index = _read_index(index_path)  # as left by a process that held the lock before us
                if not _matches(index, key, shape, path):
                    _write_json_atomic(path / "images.json", images)
                    _allocate(path / "features.npy", shape)
                    index = {"version": INDEX_VERSION, "key": key, "fingerprint": fingerprint,
                             "images_sha256": images_sha256, "count": shape[0], "positions": shape[1],
                             "channels": shape[2], "dtype": np.dtype(_DTYPE).name, "completed": 0,
                             "bad": []}
                    _write_json_atomic(index_path, index)

                if index["completed"] < shape[0]:
                    _fill(path, index, encoder, records, batch_size, torch.device(device), num_workers,
                          progress, skip_bad_images)
        cache = cls(path, index)
        if cache.bad and not skip_bad_images:  # built by a run that skipped them; this one must not
            row = min(cache.bad)
            raise ImageError(f"{cache.bad[row]} (recorded in {index_path}; set data.skip_bad_images "
                             "to skip such images)")
        if cache.bad:
            warnings.warn(f"{len(cache.bad)} of {len(cache)} images could not be read and have zero "
                          f"features (listed under 'bad' in {index_path})", stacklevel=2)
        return cache


def _fill(path: Path, index: dict[str, Any], encoder: Encoder, records: list[ImageRecord],
          batch_size: int, device: torch.device, num_workers: int, progress: bool,
          skip_bad_images: bool) -> None:
    """Compute rows ``index['completed']..N`` in place, updating ``index`` and index.json per batch."""
    start = index["completed"]
    features = np.load(path / "features.npy", mmap_mode="r+")  # (N, P, C) float16
    loader = DataLoader(_ImageFiles(records, start, encoder.transform, encoder.image_size),
                        batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        pin_memory=device.type == "cuda")
    was_training = encoder.training
    encoder.to(device).eval()
    bar = tqdm(total=len(records), initial=start, disable=not progress, unit="img",
               desc=f"caching {encoder.name} features")
    try:
        with torch.inference_mode():
            for rows, images, errors in loader:
                first, last = int(rows[0]), int(rows[-1]) + 1
                assert first == index["completed"], "feature cache rows must arrive in order"
                failed = [(int(row), error) for row, error in zip(rows, errors) if error]
                if failed and not skip_bad_images:
                    raise ImageError(failed[0][1])
                grid_features = encoder(images.to(device, non_blocking=True))  # (B, P, C)
                block = grid_features.float().cpu().numpy().astype(_DTYPE)
                for row, _ in failed:
                    block[row - first] = 0
                features[first:last] = block
                try:
                    features.flush()  # rows reach the disk before the index claims them
                except OSError as error:
                    if error.errno == errno.ENOSPC:
                        raise _no_space(error, path / "features.npy") from error
                    raise
                index["bad"] = index["bad"] + [{"row": row, "path": str(records[row].path), "error": error}
                                               for row, error in failed]
                index["completed"] = last
                _write_json_atomic(path / "index.json", index)
                bar.update(last - first)
    finally:
        bar.close()
        encoder.train(was_training)
        del features
