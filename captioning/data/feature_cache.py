"""On-disk cache of frozen-encoder grid features: the CNN runs once per image.

One cache per encoder key (the encoder's ``fingerprint()``: name, weights identity, image size,
grid, normalisation), in a sub-folder of the cache folder named by a short hash of the key. Its
rows are keyed by image id plus the file's content identity (size and a hash of its first and
last 64 KiB; see ``captioning.data.image_files``), never by path, modification time or list
order. So moving the data, copying it without its times, another order, a subset, or the same
images read through another annotation file reuse the rows; new images are appended; an image
whose content changed gets a new row. Files are in ``captioning.data.cache_store``; building (hashing,
planning and computing the rows) in ``captioning.data.cache_build``.

Each image file is hashed once: the index keeps its path, size, modification and change times,
and a later open with the same ``stat`` reuses the hash (a moved file is hashed again, 128 KiB).

A damaged cache is found on open: an index that is not JSON, lacks a field or points outside the
features file is refused (delete the folder to rebuild); a features file that is truncated or
shorter than the index says is repaired by recomputing only the rows it lost.

Independent processes building the same cache take turns on an exclusive ``flock`` of
``build.lock``. The processes of one ``torchrun`` job build it together: rank 0 plans the new rows
under the lock (from the content hashes all ranks computed, each for its share of the new files),
each rank computes its share of the missing rows into the shared memory-mapped file, and rank 0
writes the index when all shares are done. Opening a complete cache in a single
process takes no lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.data import cache_store as store
from captioning.data.cache_build import Build, GridEncoder, agree, cache_batch_size, waiting_group
from captioning.data.cache_store import DTYPE, FeatureCacheError
from captioning.data.image_files import stat_images
from captioning.data.records import ImageRecord
from captioning.utils.files import refuse_links
from captioning.utils.output_paths import check_output_folder
from captioning.utils.run_folder import RunFolderError

__all__ = ["FeatureCache", "FeatureCacheError", "GridEncoder", "cache_batch_size"]

logger = logging.getLogger(__name__)


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()


class FeatureCache:
    """Read access to a complete cache: ``cache[i]`` is the (P, C) float16 grid of ``records[i]``.

    Build or reopen one with ``FeatureCache.build_or_open``.

    Attributes:
        path: the cache's own sub-directory.
        shape: (N, P, C), N = the number of records it was opened for.
        bad: position -> error message of images that could not be read (their grids are zeros).
        computed: rows this process computed while opening it.
    """

    def __init__(
        self,
        path: Path,
        rows: np.ndarray,
        grid_shape: tuple[int, int],
        bad: dict[int, str],
        fingerprint: dict[str, Any],
        computed: int = 0,
    ) -> None:
        self.path = path
        self.rows = rows  # (N,) int64: the row of each record in features.npy, -1 for none
        self.shape: tuple[int, int, int] = (len(rows), *grid_shape)
        self.bad = bad
        self.fingerprint = fingerprint
        self.computed = computed
        self._features: np.ndarray | None = None  # (R, P, C) float16 memory map, opened on first use

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, position: int) -> np.ndarray:
        """The (P, C) float16 annotation vectors of record ``position`` (a copy, safe across workers)."""
        grid = np.empty(self.shape[1:], dtype=DTYPE)
        self.read_into([position], grid[None])
        return grid

    def read_into(self, positions: Sequence[int], out: np.ndarray) -> None:
        """Copy the grids of records ``positions`` into ``out``, (len(positions), P, C) float16.

        One copy from the file's pages into ``out`` (a batch's buffer), with no array in between;
        a record without a row (a missing image) gets zeros.
        """
        if self._features is None:
            self._features = np.load(self.path / "features.npy", mmap_mode="r")
        for slot, position in enumerate(positions):
            row = int(self.rows[position])
            if row < 0:
                out[slot] = 0
            else:
                out[slot] = self._features[row]

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers started by spawn/forkserver get the path, not a pickled copy of the array.
        return {**self.__dict__, "_features": None}

    @classmethod
    def build_or_open(
        cls,
        directory: str | Path,
        encoder: GridEncoder,
        records: list[ImageRecord],
        batch_size: int | None = None,
        device: str | torch.device = "cpu",
        num_workers: int = 0,
        progress: bool = True,
        skip_bad_images: bool = False,
        rank: int = 0,
        world_size: int = 1,
        build: bool = True,
        under: str | Path | None = None,
    ) -> FeatureCache | None:
        """Open the cache of ``encoder`` over ``records``, computing whatever rows are missing.

        Every image file is checked (one ``stat``) before anything is created. A cache holding all
        of the records' rows is reused without running the encoder (and, in one process, without a
        lock); otherwise the missing rows are computed under the cache's ``build.lock`` (another
        process building the same cache waits, then reuses what it finds). With ``world_size`` > 1
        every rank of the initialised process group must call this with the same records: they
        compute the missing rows together.

        Args:
            directory: the cache folder (each encoder key gets its own sub-directory).
            encoder: a frozen encoder. It is left as it is: its ``inference_copy()`` (eval mode, batch
                norms folded) runs on ``device``.
            records: the images; ``cache[i]`` is the grid of ``records[i]``.
            batch_size: images per forward pass (and per flush of computed rows); by default
                ``cache_batch_size(device)``.
            device: where the encoder runs.
            num_workers: DataLoader worker processes reading and transforming images.
            progress: show a tqdm progress bar.
            skip_bad_images: give missing and unreadable images zero grids (with a warning) instead
                of raising.
            rank, world_size: this process's place in a ``torchrun`` job.
            build: False opens a complete cache only, writing nothing (a folder the user did not
                choose, e.g. one named in a checkpoint).
            under: the folder the user named that holds ``directory`` (``data.cache_dir``, else the
                data's folder; by default ``directory``): nothing below it is written through a
                symbolic link or into anything but a regular file (``refuse_links``).
        Returns:
            The complete ``FeatureCache`` over ``records``; None when ``build`` is False and the
            cache does not hold every row.
        Raises:
            ImageError: an image is missing (before any work) or cannot be read (without
                ``skip_bad_images``); computed rows are kept. Also when the cache records one of
                the images as unreadable and ``skip_bad_images`` is off.
            FeatureCacheError: the index is damaged (the message says how to clear it).
            OSError: the disk is full (ENOSPC, with a message naming the file).
        """
        if not records:
            raise ValueError("cannot build a feature cache over an empty image list")
        stats, missing = stat_images(records, allow_missing=skip_bad_images)
        fingerprint = encoder.fingerprint()
        key = {"fingerprint": fingerprint, "dtype": np.dtype(DTYPE).name}
        builder = Build(
            Path(directory) / _sha256_json(key)[:16],
            key,
            records,
            stats,
            missing,
            (encoder.grid[0] * encoder.grid[1], encoder.channels),
            skip_bad_images,
        )
        if world_size <= 1 or not build:
            if builder.open_complete():
                rows, bad = builder.rows_and_bad()
                return cls(builder.folder, rows, builder.grid_shape, bad, builder.key["fingerprint"])
            if not build:
                return None
        root = Path(directory) if under is None else Path(under)
        device = torch.device(device)
        computed = _compute_missing_rows(
            builder, root, encoder, batch_size or cache_batch_size(device), device, num_workers, progress,
            rank, world_size,
        )  # fmt: skip
        if world_size > 1:
            logger.info(
                "feature cache %s: rank %d of %d computed %d rows", builder.folder, rank, world_size, computed
            )
        rows, bad = builder.rows_and_bad()
        return cls(builder.folder, rows, builder.grid_shape, bad, builder.key["fingerprint"], computed)


def _compute_missing_rows(
    builder: Build,
    root: Path,
    encoder: GridEncoder,
    batch_size: int,
    device: torch.device,
    num_workers: int,
    progress: bool,
    rank: int,
    world_size: int,
) -> int:
    """Compute the rows ``builder`` lacks, each rank its share, under the cache's build lock (rank 0
    plans and writes the index); return how many rows this rank computed. ``root``: the folder the
    user named, below which nothing is written through a link.
    """
    # Rows are to be written: a read-only or unwritable cache folder fails now, not after encoding,
    # and so does a link or an odd file where the cache writes (one planted to redirect a write).
    refuse_links(builder.folder, root, folder=True)
    for name in store.CACHE_FILES:
        refuse_links(builder.folder / name, root)
    check_output_folder(builder.folder, "data.cache_dir")
    with ExitStack() as held:
        group = held.enter_context(waiting_group(world_size))
        builder.hash_together(rank, world_size, group)
        error = None
        if rank == 0:
            try:
                try:
                    builder.folder.mkdir(parents=True, exist_ok=True)
                except OSError as failed:  # /proc, a read-only mount, ...: the key, not a bare errno
                    raise RunFolderError(
                        f"{builder.folder}: data.cache_dir: cannot create the feature cache's folder "
                        f"here ({failed.strerror or failed}); give a writable folder"
                    ) from failed
                held.enter_context(store.build_lock(builder.folder))
                builder.plan()
            except Exception as caught:  # re-raised on every rank by agree
                error = caught
        agree(error, world_size, group)
        try:
            computed = builder.compute_share(
                encoder, batch_size, device, num_workers, progress, rank, world_size
            )
        except Exception as caught:  # re-raised on every rank by agree
            error = caught
        agree(error, world_size, group)
        if rank == 0:
            builder.finish()
        agree(None, world_size, group)  # the index is written before any rank reads it
    if rank != 0:
        builder.read_index()
    return computed
