"""Batched decoding of a dataset with a trained model (validation during training, evaluation after):
the batches of an epoch, the loader over them, and captioning a dataset split."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import Tensor
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioning.config import Config, DecodeConfig
from captioning.data.datasets import CaptionDataset, collate_captions, usable_workers
from captioning.models.captioner import Captioner
from captioning.models.decoding import Caption, decode
from captioning.utils import distributed
from captioning.utils.device import autocast


class EpochBatches:
    """Image indices of each batch of one epoch, shuffled from (seed, epoch) alone.

    The order depends on nothing else, so a resumed run sees the same batches: it simply
    starts ``skip`` batches in. With several processes, each takes its share of every
    global batch (``rank::world_size``).
    """

    def __init__(
        self,
        num_images: int,
        batch_size: int,
        seed: int,
        epoch: int,
        skip: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ):
        generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
        order = torch.randperm(num_images, generator=generator) if shuffle else torch.arange(num_images)
        self.batches = [order[i : i + batch_size].tolist() for i in range(0, num_images, batch_size)]
        self.batches = [batch[rank::world_size] for batch in self.batches[skip:]]
        self.batches = [batch for batch in self.batches if batch]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def move(batch: dict, device: torch.device) -> dict:
    """The batch with each tensor on ``device`` (copied asynchronously); other values as they are."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}


def annotations_of(model: Captioner, batch: dict) -> Tensor:
    """(B, P, C) float32 grids: cached features (float16 as stored) converted on the device, or images
    through the encoder."""
    if "features" in batch:
        return batch["features"].float()
    return model.encode(batch["images"])


@torch.inference_mode()
def generate_captions(
    model: Captioner,
    loader: Iterable[dict],
    decode_config: DecodeConfig,
    device: torch.device,
    progress: bool = True,
    desc: str = "decoding",
    amp: str = "none",
) -> list[tuple[int, int, Caption]]:
    """Caption every image of ``loader``: a list of (dataset index, image id, Caption).

    ``amp`` (``train.amp``) decodes under autocast, as training ran; scores and log-probabilities
    are float32 whatever it is (the decoders return float32 log-probabilities).
    """
    model.eval()
    decoder = distributed.unwrap(model.decoder)
    results: list[tuple[int, int, Caption]] = []
    for batch in tqdm(loader, desc=desc, leave=False, disable=not progress, dynamic_ncols=True, unit="batch"):
        if batch is None:
            continue
        batch = move(batch, device)
        with autocast(device, amp):
            captions = decode(decoder, annotations_of(model, batch), decode_config)
        results.extend(zip(batch["indices"].tolist(), batch["image_ids"].tolist(), captions, strict=True))
    return results


def loader_for(
    dataset: CaptionDataset, batches: Iterable[list[int]], config: Config, device: torch.device
) -> DataLoader:
    """A loader of ``dataset`` over ``batches`` (lists of dataset indices, e.g. ``EpochBatches``)."""
    # An own generator: creating the loader's iterator must not draw from the global RNG, or a
    # resumed run (whose iterator starts mid-epoch) would see different dropout masks.
    return DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=collate_captions,
        num_workers=usable_workers(config.data.num_workers),
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(config.train.seed),
    )


def decode_records(
    model: Captioner,
    dataset: CaptionDataset,
    config: Config,
    device: torch.device,
    limit: int = 0,
    progress: bool = True,
    desc: str = "decoding",
    group: distributed.ProcessGroup = distributed.SINGLE_PROCESS,
) -> list[tuple[int, int, Caption]]:
    """Caption the first ``limit`` (0 = all) images of ``dataset``: (index, image id, Caption) triples.

    With several processes each decodes its own share (whole batches of ``decode.batch_size``)
    and returns only those.
    """
    count = len(dataset) if not limit else min(limit, len(dataset))
    batches = EpochBatches(
        count,
        config.decode.batch_size * group.world_size,
        seed=0,
        epoch=0,
        shuffle=False,
        rank=group.rank,
        world_size=group.world_size,
    )
    return generate_captions(
        model,
        loader_for(dataset, batches, config, device),
        config.decode,
        device,
        progress=progress,
        desc=desc,
        amp=config.train.amp,
    )
