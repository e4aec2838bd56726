"""Torch datasets over ``ImageRecord`` lists, and the collate function that batches them.

Items are dicts: ``index``, ``image_id``, then ``features`` (P, C) from a feature cache or
``image`` (3, H, W) from the image file, and for ``CaptionDataset`` ``captions`` (K, T) with
``lengths`` (K,). ``collate_captions`` stacks them under plural keys.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, get_worker_info

from captioning.data.cache_store import DTYPE as CACHE_DTYPE
from captioning.data.images import ImageError, load_image
from captioning.data.records import ImageRecord
from captioning.data.vocab import Vocabulary

logger = logging.getLogger(__name__)

Transform = Callable[[Image.Image], torch.Tensor]


@functools.cache
def usable_workers(requested: int) -> int:
    """``data.num_workers`` capped by the CPU cores this process may use (a warning, once per
    process, says so): more workers than cores only compete, and the DataLoader warns each time."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if requested > cores:
        logger.warning(
            "data.num_workers is %d but this process may use %d CPU cores: using %d workers",
            requested,
            cores,
            cores,
        )
        return cores
    return requested


Item = dict[str, Any]


class FeatureSource(Protocol):
    """Anything indexable by record position that returns that image's (P, C) feature array."""

    def __getitem__(self, index: int) -> np.ndarray: ...


@runtime_checkable
class BatchFeatureSource(FeatureSource, Protocol):
    """A source that copies a batch's grids into one buffer (``FeatureCache``)."""

    shape: tuple[int, ...]  # (N, P, C)

    def read_into(self, positions: Sequence[int], out: np.ndarray) -> None: ...


class _ImageItems(Dataset):
    """Shared image loading: ``transform(load_image(...))``, or None for a skipped unreadable image."""

    def __init__(self, records: Sequence[ImageRecord], transform: Transform | None, skip_bad_images: bool):
        self.records = list(records)
        self.transform = transform
        self.skip_bad_images = skip_bad_images
        self.skipped = 0  # unreadable images skipped by this process (each DataLoader worker counts its own)

    def __len__(self) -> int:
        return len(self.records)

    def _image(self, index: int) -> torch.Tensor | None:
        """The transformed image of record ``index``, (3, H, W); None when skipped."""
        record = self.records[index]
        try:
            image = load_image(record.path, f"image {record.image_id}")
        except ImageError as error:
            if not self.skip_bad_images:
                raise
            self.skipped += 1
            logger.warning("skipping unreadable image: %s", error)
            return None
        if self.transform is None:  # a dataset of cached grids reads no image
            raise ValueError(f"{record.path}: no image transform to read it with")
        return self.transform(image)

    def _transformed(self, picture: Image.Image) -> torch.Tensor:
        """An in-memory RGB picture through the transform."""
        if self.transform is None:
            raise ValueError("no image transform to read pictures with")
        return self.transform(picture)


class CaptionDataset(_ImageItems):
    """Images (or their cached features) with ``captions_per_image`` encoded captions each.

    Args:
        records: images with at least one caption each.
        vocab: turns tokens into ids.
        max_length: words kept per caption (without ``<start>``/``<end>``); longer ones are cut.
        captions_per_image: K, the captions returned per image. An image with more captions
            gives a different K each epoch (see ``set_epoch``), so that over ``ceil(n / K)``
            epochs every caption is used; an image with fewer repeats them in order.
        features: when given, ``features[i]`` is the (P, C) float16/float32 array of record i
            (a writable array the item may own, e.g. ``FeatureCache``'s copy) and no image is read.
        transform: PIL image -> (3, H, W) tensor; required without ``features``.
        seed: with the epoch and the index, fixes which captions are chosen.
        skip_bad_images: return None (collated away, counted in ``skipped``) for an unreadable
            image instead of raising ``ImageError``.
        unreadable: with ``features``, the positions whose image could not be read when the
            features were computed (``FeatureCache.bad``); their items are None, counted in
            ``skipped``, instead of training on placeholder features.
    Item ``i``:
        ``index``, ``image_id`` (ints); ``features`` (P, C) in the source's dtype (float16 from a
        ``FeatureCache``) or ``image`` (3, H, W);
        ``captions`` int64 (K, max_length + 2) = ``<start> w1 .. wn <end> <pad>..``;
        ``lengths`` int64 (K,) = n + 2. None for a skipped image.
    """

    def __init__(
        self,
        records: Sequence[ImageRecord],
        vocab: Vocabulary,
        max_length: int,
        captions_per_image: int = 5,
        features: FeatureSource | None = None,
        transform: Transform | None = None,
        seed: int = 0,
        skip_bad_images: bool = False,
        unreadable: Collection[int] = (),
    ):
        super().__init__(records, transform, skip_bad_images)
        if features is None and transform is None:
            raise ValueError("CaptionDataset needs either features or an image transform")
        if captions_per_image < 1:
            raise ValueError(f"captions_per_image must be >= 1, got {captions_per_image}")
        uncaptioned = next((r for r in self.records if not r.captions), None)
        if uncaptioned is not None:
            raise ValueError(
                f"image_id {uncaptioned.image_id} has no caption; use ImageOnlyDataset for "
                "images without captions"
            )
        self.features = features
        self.unreadable = unreadable
        self.captions_per_image = captions_per_image
        self.seed = seed
        self.epoch = 0
        # Encode every caption once: ids (N_captions, max_length + 2), lengths (N_captions,),
        # and record i owns rows caption_offsets[i]:caption_offsets[i + 1].
        encoded = [
            vocab.encode(caption, max_length) for record in self.records for caption in record.captions
        ]
        self.caption_ids = np.full((len(encoded), max_length + 2), vocab.pad_id, dtype=np.int64)
        for row, ids in enumerate(encoded):
            self.caption_ids[row, : len(ids)] = ids
        self.caption_lengths = np.array([len(ids) for ids in encoded], dtype=np.int64)
        self.caption_offsets = np.cumsum([0] + [len(r.captions) for r in self.records])

    def set_epoch(self, epoch: int) -> None:
        """Choose the captions of ``epoch`` (call before iterating; DataLoader workers copy the dataset)."""
        self.epoch = epoch

    def caption_choice(self, index: int) -> np.ndarray:
        """Which of record ``index``'s captions this epoch uses: K positions into ``record.captions``."""
        count = int(self.caption_offsets[index + 1] - self.caption_offsets[index])
        wanted = np.arange(self.captions_per_image)
        if count <= self.captions_per_image:
            return wanted % count
        order = np.random.default_rng((self.seed, index)).permutation(count)
        return order[(self.epoch * self.captions_per_image + wanted) % count]

    def __getitem__(self, index: int) -> Item | None:
        if self.features is not None:
            if index in self.unreadable:
                self.skipped += 1
                return None
            grid = np.asarray(self.features[index])
            if grid.ndim != 2:
                raise ValueError(f"features[{index}] must be a (P, C) array, got shape {grid.shape}")
            # Kept in the cache's float16: half the bytes through workers, pinning and the copy to
            # the device, and numpy's float16 -> float32 conversion (scalar, about 4 ns a value) was
            # half of the loader's time; the batch is made float32 on the device (``annotations_of``).
            return self._item(
                index, "features", torch.from_numpy(grid)
            )  # (P, C), float16 or float32 as stored
        image = self._image(index)
        return None if image is None else self._item(index, "image", image)  # (3, H, W)

    def __getitems__(self, indices: Sequence[int]) -> list[Item | None]:
        """The items of one batch (the DataLoader fetches a batch through this when it exists).

        From a ``FeatureCache`` the batch's grids are copied straight from the file's pages into one
        (B, P, C) buffer, and the items hold its rows, which ``collate_captions`` takes as the batch
        without stacking: one copy of the grids instead of two. Otherwise item by item.
        """
        source = self.features
        if not isinstance(source, BatchFeatureSource):
            return [self[index] for index in indices]
        readable = [index for index in indices if index not in self.unreadable]
        self.skipped += len(indices) - len(readable)
        grids = torch.from_numpy(np.empty((len(readable), *source.shape[1:]), dtype=CACHE_DTYPE))
        if get_worker_info() is not None:
            grids.share_memory_()  # (B, P, C): sent to the main process without another copy
        source.read_into(readable, grids.numpy())
        return [self._item(index, "features", grid) for index, grid in zip(readable, grids, strict=True)]

    def _item(self, index: int, key: str, value: torch.Tensor) -> Item:
        """Item ``index`` holding ``value`` under ``key`` (``features`` or ``image``), with its captions."""
        rows = self.caption_offsets[index] + self.caption_choice(index)
        return {
            "index": index,
            "image_id": self.records[index].image_id,
            key: value,
            "captions": torch.from_numpy(self.caption_ids[rows]),  # (K, max_length + 2)
            "lengths": torch.from_numpy(self.caption_lengths[rows]),
        }  # (K,)


class ImageOnlyDataset(_ImageItems):
    """Images without captions (a folder to caption, or decoding a test split).

    Item ``i``: ``index``, ``image_id`` and ``image`` (3, H, W) = ``transform(load_image(path))``;
    None for an unreadable image when ``skip_bad_images`` (counted in ``skipped``). With
    ``pictures`` (RGB images already in memory, one per record), ``transform(pictures[i])``: the
    records then only name and number them.
    """

    def __init__(
        self,
        records: Sequence[ImageRecord],
        transform: Transform,
        skip_bad_images: bool = False,
        pictures: Sequence[Image.Image] | None = None,
    ):
        super().__init__(records, transform, skip_bad_images)
        if pictures is not None and len(pictures) != len(self.records):
            raise ValueError(f"{len(pictures)} pictures for {len(self.records)} records")
        self.pictures = None if pictures is None else list(pictures)

    def __getitem__(self, index: int) -> Item | None:
        # In-memory RGB pictures (the Python API, the demo) skip the file: same transform, same tensors.
        image = self._image(index) if self.pictures is None else self._transformed(self.pictures[index])
        if image is None:
            return None
        return {"index": index, "image_id": self.records[index].image_id, "image": image}


def collate_captions(items: list[Item | None]) -> dict[str, torch.Tensor] | None:
    """Stack dataset items into a batch, dropping None (skipped) items.

    Returns:
        ``indices`` (B,), ``image_ids`` (B,), ``features`` (B, P, C) or ``images`` (B, 3, H, W),
        and when the items have captions ``captions`` (B, K, T) with T the longest caption in
        the batch (``<start>`` and ``<end>`` included) and ``lengths`` (B, K).
        None when every item was skipped.
    """
    kept = [item for item in items if item is not None]
    if not kept:
        return None
    batch = {
        "indices": torch.tensor([item["index"] for item in kept], dtype=torch.long),
        "image_ids": torch.tensor([item["image_id"] for item in kept], dtype=torch.long),
    }
    for item_key, batch_key in (("features", "features"), ("image", "images")):
        if item_key in kept[0]:
            batch[batch_key] = _stacked([item[item_key] for item in kept])
    if "captions" in kept[0]:
        lengths = torch.stack([item["lengths"] for item in kept])  # (B, K)
        longest = int(lengths.max())
        batch["captions"] = torch.stack([item["captions"][:, :longest] for item in kept])  # (B, K, T)
        batch["lengths"] = lengths
    return batch


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(tensors)``, or without a copy the buffer whose consecutive rows they are, whole
    (the grids ``CaptionDataset.__getitems__`` read into one buffer): the batch then shares the
    items' memory, which nothing writes to."""
    first = tensors[0]
    storage = first.untyped_storage()
    size = first.numel()
    whole = storage.nbytes() == len(tensors) * size * first.element_size() and all(
        tensor.is_contiguous()
        and tensor.dtype == first.dtype
        and tensor.shape == first.shape
        and tensor.untyped_storage().data_ptr() == storage.data_ptr()
        and tensor.storage_offset() == number * size
        for number, tensor in enumerate(tensors)
    )
    if whole:
        # torch's stubs lack set_'s (UntypedStorage, offset, size) overload, which the docs list.
        return first.new_empty(0).set_(storage, 0, (len(tensors), *first.shape))  # type: ignore[call-overload]
    return torch.stack(tensors)
