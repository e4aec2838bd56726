"""Building the feature cache: which rows an open needs (content hashes of the image files, shared out
among the ranks of a ``torchrun`` job), planning the new rows under the cache's lock, computing each
rank's share of them into the memory-mapped features file, and writing the index when all are done
(``FeatureCache.build_or_open`` drives it; files and checks are in ``cache_store``)."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from captioning.data import cache_store as store
from captioning.data.cache_store import COMPUTED, DTYPE, NOT_COMPUTED, UNREADABLE, FeatureCacheError
from captioning.data.image_files import content_identity
from captioning.data.images import ImageError, load_image
from captioning.data.records import ImageRecord
from captioning.utils.errors import RunError

# The feature cache's one log, whichever of its two modules speaks.
logger = logging.getLogger("captioning.data.feature_cache")


class GridEncoder(Protocol):
    """What the cache needs of the frozen encoder it is given (``captioning.models.encoders.Encoder``);
    the data layer does not import the models."""

    name: str
    channels: int  # C of the (B, P, C) grids it caches
    grid: tuple[int, int]  # (H, W): P = H*W positions per image
    image_size: int
    transform: Callable[[Any], torch.Tensor]  # PIL image -> (3, image_size, image_size)

    def fingerprint(self) -> dict[str, Any]: ...

    def inference_copy(self) -> torch.nn.Module: ...


class _ImageFiles(Dataset):
    """``(row, record)`` pairs as (row, image (3, S, S), error message or ""); never raises ImageError.

    Read errors are returned, not raised, so the main process decides (skip or stop) and the message
    stays one line even when the image was read in a worker process.
    """

    def __init__(self, items: list[tuple[int, ImageRecord]], transform: Any, image_size: int) -> None:
        self.items = items
        self.transform = transform
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, str]:
        row, record = self.items[index]
        try:
            image = self.transform(load_image(record.path, entry=f"image {record.image_id}"))
        except ImageError as error:
            return row, torch.zeros(3, self.image_size, self.image_size), str(error)
        return row, image, ""


def _row_keys(
    records: list[ImageRecord], states: list[os.stat_result | None], files: dict[str, list]
) -> tuple[list[str | None], dict[str, list]]:
    """``"<image id>:<content identity>"`` per record (None for a missing file).

    ``files`` maps an absolute path to ``[image id, size, mtime_ns, ctime_ns, identity]``; a file whose
    stat matches is not read again. Returns the keys and the entries of the files hashed now.
    """
    keys: list[str | None] = []
    hashed: dict[str, list] = {}
    for record, state in zip(records, states, strict=True):
        if state is None:
            keys.append(None)
            continue
        path = os.path.abspath(record.path)
        seen = [record.image_id, state.st_size, state.st_mtime_ns, state.st_ctime_ns]
        entry = files.get(path)
        if entry is None or entry[:4] != seen:
            entry = hashed[path] = [*seen, content_identity(path, state.st_size)]
        keys.append(f"{record.image_id}:{entry[4]}")
    return keys, hashed


def _message_of(record: ImageRecord) -> str:
    """The read error of an image recorded as unreadable by a build that left no message."""
    try:
        load_image(record.path, entry=f"image {record.image_id}")
    except ImageError as error:
        return str(error)
    return f"{record.path} (image {record.image_id}): unreadable when its features were computed"


def _reads(record: ImageRecord) -> bool:
    """Whether the image of ``record`` decodes now."""
    try:
        load_image(record.path, entry=f"image {record.image_id}")
    except ImageError:
        return False
    return True


# How long a rank of a cache build may wait for the others in one collective: past any share's encoding
# (a rank whose share is done waits for the slowest one; rank 0 may wait for another job's build lock).
# torchrun ends the others when a rank dies, so the long wait never outlasts a failure.
WAIT_TIMEOUT = timedelta(days=7)


@contextmanager
def waiting_group(world_size: int) -> Iterator[Any]:
    """A gloo process group of all ranks with ``WAIT_TIMEOUT`` for the build's collectives (None alone).

    The default group's timeout (10 minutes for NCCL, 30 for gloo) is shorter than the wait of a rank
    whose share is done while the slowest rank still encodes, or than rank 0's wait for the lock.
    """
    if world_size <= 1 or not dist.is_initialized():
        yield None
        return
    group = dist.new_group(backend="gloo", timeout=WAIT_TIMEOUT)
    try:
        yield group
    finally:
        dist.destroy_process_group(group)


def agree(error: BaseException | None, world_size: int, group: Any = None) -> None:
    """Every rank learns whether any failed; each raises (its own error, or one naming the rank that failed).

    A collective (over ``group``, the default group when None), so a failure on one rank never leaves
    the others waiting in the next one.
    """
    if world_size <= 1 or not dist.is_initialized():
        if error is not None:
            raise error
        return
    messages: list[Any] = [None] * world_size
    dist.all_gather_object(messages, None if error is None else str(error).splitlines()[0], group=group)
    if error is not None:
        raise error
    for rank, message in enumerate(messages):
        if message is not None:
            raise RunError(f"feature cache: rank {rank} failed: {message}")


class Build:
    """Opening or extending the cache in ``folder`` for ``records`` (see ``FeatureCache.build_or_open``)."""

    def __init__(
        self,
        folder: Path,
        key: dict[str, Any],
        records: list[ImageRecord],
        stats: list[os.stat_result | None],
        missing: dict[int, str],
        grid_shape: tuple[int, int],
        skip_bad_images: bool,
    ) -> None:
        self.folder, self.key, self.records, self.stats = folder, key, records, stats
        self.missing, self.grid_shape, self.skip_bad_images = missing, grid_shape, skip_bad_images
        self._index: dict[str, Any] | None = None  # see ``index``
        self.keys: list[str | None] = []
        self.hashed: dict[str, list] = {}  # files hashed by this process, not yet in the index
        self.messages: dict[int, str] = {}  # row -> read error, for rows this process found unreadable

    @property
    def index(self) -> dict[str, Any]:
        """The cache's index as this build last read or wrote it.

        Raises:
            RuntimeError: read before ``open_complete``, ``plan`` or ``read_index`` loaded it.
        """
        if self._index is None:
            raise RuntimeError(f"feature cache {self.folder}: the index was read before it was loaded")
        return self._index

    def read_index(self) -> None:
        """Load ``index.json`` as another rank (rank 0, under the lock) wrote it.

        Raises:
            FeatureCacheError: the file is damaged (``cache_store.read_index``), or there is none.
        """
        index = store.read_index(self.folder, self.key)
        if index is None:
            raise FeatureCacheError(
                f"{self.folder / 'index.json'}: missing after rank 0 planned the cache; "
                f"delete the folder {self.folder} to rebuild this cache"
            )
        self._index = index

    def _identify(self, index: dict[str, Any]) -> list[int]:
        """The row of each record (-1: no row yet, or a missing file)."""
        self.keys, hashed = _row_keys(self.records, self.stats, {**index["files"], **self.hashed})
        self.hashed.update(hashed)
        return [index["rows"].get(key, -1) if key is not None else -1 for key in self.keys]

    def open_complete(self) -> bool:
        """Whether the cache is intact and holds every record's row (looked at without taking the lock);
        then ``rows_and_bad`` describes it."""
        try:
            index = store.read_index(self.folder, self.key)
        except FeatureCacheError:
            return False  # refused under the lock, after any other builder is done
        if index is None or store.intact_rows(self.folder, index["capacity"], *self.grid_shape)[1]:
            return False
        rows = self._identify(index)
        states = store.read_states(self.folder, index["capacity"])
        unfinished = any(
            states[row] not in (COMPUTED, UNREADABLE)  # or unreadable, its message not yet in the index
            or (states[row] == UNREADABLE and key not in index["bad"])
            for row, key in zip(rows, self.keys, strict=True)
            if row >= 0
        )
        if (
            self.hashed
            or unfinished
            or any(row < 0 and key is not None for row, key in zip(rows, self.keys, strict=True))
        ):
            return False
        self._index = index
        self._refuse_recorded_bad(states)
        return True

    def hash_together(self, rank: int, world_size: int, group: Any = None) -> None:
        """Every rank hashes its share of the files the index does not know, then all exchange them.

        Without this rank 0 alone would read every new file under the lock (about 16 GB for a first
        COCO build) while the others wait in a collective, long enough for NCCL's timeout on a slow disk.
        """
        if world_size <= 1 or not dist.is_initialized():
            return  # plan() hashes what it needs
        error = None
        hashed: dict[str, list] = {}
        try:
            try:
                index = store.read_index(self.folder, self.key)
            except FeatureCacheError:
                index = None  # refused by rank 0's plan, under the lock
            known = index["files"] if index is not None else {}
            _, hashed = _row_keys(self.records[rank::world_size], self.stats[rank::world_size], known)
        except Exception as caught:  # re-raised on every rank by agree
            error = caught
        agree(error, world_size, group)
        shares: list[Any] = [None] * world_size
        dist.all_gather_object(shares, hashed, group=group)
        for share in shares:
            self.hashed.update(share)
        logger.info(
            "feature cache %s: rank %d of %d hashed %d new files", self.folder, rank, world_size, len(hashed)
        )

    def plan(self) -> None:
        """Under the lock: validate and repair the files, give new images rows, write the index."""
        index = store.read_index(self.folder, self.key) or store.new_index(self.key)
        capacity = index["capacity"]
        intact, problem = store.intact_rows(self.folder, capacity, *self.grid_shape)
        if problem:
            lost = sum(row >= intact for row in index["rows"].values())
            logger.warning("%s; recomputing the %d rows it lost", problem, lost)
        if problem or not (self.folder / "features.npy").exists():
            store.resize(self.folder, capacity, capacity, *self.grid_shape, intact=intact)
        rows = self._identify(index)
        self._index = index
        doubtful = self._doubtful_rows(rows, store.read_states(self.folder, capacity))
        if doubtful:
            logger.warning(
                "%s: %d row states that neither the index nor the images bear out (a damaged file); "
                "recomputing those rows",
                self.folder / "state.bin",
                len(doubtful),
            )
            store.mark_not_computed(self.folder, doubtful)
        self._refuse_recorded_bad(store.read_states(self.folder, capacity))
        new = [
            key
            for key, row in dict.fromkeys(zip(self.keys, rows, strict=True))
            if key is not None and row < 0
        ]
        if new:
            store.resize(self.folder, capacity, capacity + len(new), *self.grid_shape)
            index["rows"].update({key: capacity + number for number, key in enumerate(new)})
            index["capacity"] = capacity + len(new)
        if new or self.hashed or problem:
            moved = {record.image_id: os.path.abspath(record.path) for record in self.records}
            index["files"] = {
                path: entry
                for path, entry in index["files"].items()  # forget moved files
                if moved.get(entry[0], path) == path
            }
            index["files"].update(sorted(self.hashed.items()))  # in any order the ranks hashed them
            store.write_json_atomic(self.folder / "index.json", index)
            self.hashed = {}

    def _doubtful_rows(self, rows: list[int], states: np.ndarray) -> list[int]:
        """Rows whose state byte cannot be trusted: a value no build writes, or "unreadable" without the
        message a finished build records, for an image that reads now (not to be blamed on it)."""
        doubtful = []
        for record, key, row in zip(self.records, self.keys, rows, strict=True):
            if row < 0 or states[row] in (NOT_COMPUTED, COMPUTED):
                continue
            if states[row] != UNREADABLE or (key not in self.index["bad"] and _reads(record)):
                doubtful.append(row)
        return sorted(set(doubtful))

    def _refuse_recorded_bad(self, states: np.ndarray) -> None:
        if self.skip_bad_images:
            return
        for record, key in zip(self.records, self.keys, strict=True):
            row = self.index["rows"].get(key, -1) if key is not None else -1
            if row >= 0 and states[row] == UNREADABLE:
                message = self.index["bad"].get(key) or _message_of(record)
                raise ImageError(
                    f"{message} (recorded in {self.folder / 'index.json'}; set "
                    "data.skip_bad_images to skip such images)"
                )

    def compute_share(
        self,
        encoder: GridEncoder,
        batch_size: int,
        device: torch.device,
        num_workers: int,
        progress: bool,
        rank: int,
        world_size: int,
    ) -> int:
        """Compute this rank's share of the records' rows not computed yet; returns how many.

        The records' rows, in row order, are cut into batches of ``batch_size`` whatever is computed
        already, and each rank takes a run of whole batches with rows left to compute. So every row is
        encoded in the same batch by any number of ranks and after any interruption (one rank's
        crash leaves whole batches behind): the features are byte for byte those of one process.
        """
        if rank != 0:
            self.read_index()  # as rank 0 wrote it
        rows = self._identify(self.index)
        states = store.read_states(self.folder, self.index["capacity"])
        needed = sorted(
            {row: record for row, record in zip(rows, self.records, strict=True) if row >= 0}.items()
        )
        batches = [
            [
                (row, record)
                for row, record in needed[start : start + batch_size]
                if states[row] == NOT_COMPUTED
            ]
            for start in range(0, len(needed), batch_size)
        ]
        pending = [batch for batch in batches if batch]
        share = pending[rank * len(pending) // world_size : (rank + 1) * len(pending) // world_size]
        count = sum(map(len, share))
        done = len(needed) - sum(map(len, pending)) if world_size == 1 else 0
        bar = tqdm(
            total=done + count,
            initial=done,
            disable=not progress or not share,
            unit="img",
            desc=f"caching {encoder.name} features",
        )
        try:
            if share:
                self._fill(share, encoder, device, num_workers, bar)
        finally:
            bar.close()
        return count

    def _fill(
        self,
        share: list[list[tuple[int, ImageRecord]]],
        encoder: GridEncoder,
        device: torch.device,
        num_workers: int,
        bar: tqdm,
    ) -> None:
        """Compute the rows of ``share`` (its batches) in place; rows reach the disk before their states
        say so."""
        features = np.load(self.folder / "features.npy", mmap_mode="r+")  # (R, P, C) float16
        states = np.memmap(self.folder / "state.bin", dtype=np.uint8, mode="r+")  # (R,)
        items = [item for batch in share for item in batch]
        starts = np.cumsum([0, *map(len, share)])
        loader = DataLoader(
            _ImageFiles(items, encoder.transform, encoder.image_size),
            batch_sampler=[
                list(range(start, end)) for start, end in zip(starts[:-1], starts[1:], strict=True)
            ],
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
        )
        network = encoder.inference_copy().to(device)  # batch norms folded: the same features, faster
        try:
            with torch.inference_mode():
                for rows, images, errors in loader:
                    rows = rows.numpy()
                    failed = [number for number, error in enumerate(errors) if error]
                    if failed and not self.skip_bad_images:
                        raise ImageError(errors[failed[0]])
                    grid_features = network(images.to(device, non_blocking=True))  # (B, P, C)
                    block = grid_features.float().cpu().numpy().astype(DTYPE)
                    block[failed] = 0
                    features[rows] = block
                    _flush(features, self.folder / "features.npy")
                    row_states = np.full(len(rows), COMPUTED, dtype=np.uint8)
                    row_states[failed] = UNREADABLE
                    states[rows] = row_states
                    _flush(states, self.folder / "state.bin")
                    self.messages.update({int(rows[number]): errors[number] for number in failed})
                    bar.update(len(rows))
        finally:
            del features, states

    def finish(self) -> None:
        """Rank 0, all shares done: record the messages of unreadable images in the index."""
        states = store.read_states(self.folder, self.index["capacity"])
        recorded = self.index["bad"]
        added = False
        for record, key in zip(self.records, self.keys, strict=True):
            row = self.index["rows"].get(key, -1) if key is not None else -1
            if row >= 0 and states[row] == UNREADABLE and key not in recorded:
                recorded[key] = self.messages.get(row) or _message_of(record)
                added = True
        if added:
            store.write_json_atomic(self.folder / "index.json", self.index)

    def rows_and_bad(self) -> tuple[np.ndarray, dict[int, str]]:
        """(N,) int64 the row of each record (-1 for none), and position -> error message of the images
        without features (warned about)."""
        index = self.index
        rows = np.array(
            [index["rows"].get(key, -1) if key is not None else -1 for key in self.keys], dtype=np.int64
        )
        bad = dict(self.missing)
        bad.update(
            {
                position: index["bad"][key]
                for position, key in enumerate(self.keys)
                if key is not None and key in index["bad"]
            }
        )
        if bad:
            logger.warning(
                "%d of %d images could not be read and have zero features (listed under 'bad' in %s)",
                len(bad),
                len(self.records),
                self.folder / "index.json",
            )
        return rows, bad


def cache_batch_size(device: torch.device) -> int:
    """Images per encoder pass while caching: 32 on a GPU, 8 on a CPU.

    On a CPU the activations of larger batches outgrow the processor's caches (at 288 px, 32 images
    of efficientnet_lite0's second stage are 255 MB per tensor), so each pass works from main memory:
    Lite0 at 288 px on 2 cores encodes 31 images/s in batches of 8 against 24 in batches of 32
    (batch norms folded).
    """
    return 32 if device.type == "cuda" else 8


def _flush(array: np.memmap, path: Path) -> None:
    try:
        array.flush()
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise store.no_space(path) from error
        raise
